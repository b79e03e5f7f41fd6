#include "host-backend/directory/records.h"

#include "gtest/gtest.h"

namespace vsocket::directory {
namespace {

TEST(DirectoryKeys, HostAndVmKeysParseBackToTheirNames) {
  KeyName n;
  ASSERT_TRUE(ParseKey(kDefaultPrefix, HostKey(kDefaultPrefix, "hostA"), &n));
  EXPECT_EQ(n.host, "hostA");
  EXPECT_EQ(n.tenant, 0u);
  EXPECT_EQ(n.vm, "");
  EXPECT_EQ(VmKey(kDefaultTenantPrefix, 7, "hostA", "vm1"), "/vsocket/tenants/7/hostA/vm1");
  ASSERT_TRUE(ParseVmKey(kDefaultTenantPrefix, VmKey(kDefaultTenantPrefix, 7, "hostA", "vm1"), &n));
  EXPECT_EQ(n.tenant, 7u);
  EXPECT_EQ(n.host, "hostA");
  EXPECT_EQ(n.vm, "vm1");
  // A tenant's prefix does not take in another's whose number starts alike.
  EXPECT_EQ(TenantPrefix(kDefaultTenantPrefix, 1), "/vsocket/tenants/1/");
  EXPECT_NE(VmKey(kDefaultTenantPrefix, 10, "h", "v").rfind(TenantPrefix(kDefaultTenantPrefix, 1), 0), 0u);
}

TEST(DirectoryKeys, OtherShapesAreRefused) {
  KeyName n;
  EXPECT_FALSE(ParseKey(kDefaultPrefix, "/other/hostA", &n));
  EXPECT_FALSE(ParseKey(kDefaultPrefix, "/vsocket/hosts/", &n));
  EXPECT_FALSE(ParseKey(kDefaultPrefix, "/vsocket/hosts/hostA/vms/vm1", &n));  // (the layout before decision 103)
  EXPECT_FALSE(ParseKey(kDefaultPrefix, "/vsocket/hosts/host A", &n));
  EXPECT_FALSE(ParseVmKey(kDefaultTenantPrefix, "/vsocket/tenants/7/hostA", &n));
  EXPECT_FALSE(ParseVmKey(kDefaultTenantPrefix, "/vsocket/tenants/7/hostA/", &n));
  EXPECT_FALSE(ParseVmKey(kDefaultTenantPrefix, "/vsocket/tenants/7/hostA/vm1/x", &n));
  EXPECT_FALSE(ParseVmKey(kDefaultTenantPrefix, "/vsocket/tenants//hostA/vm1", &n));
  EXPECT_FALSE(ParseVmKey(kDefaultTenantPrefix, "/vsocket/tenants/07/hostA/vm1", &n));
  EXPECT_FALSE(ParseVmKey(kDefaultTenantPrefix, "/vsocket/tenants/0/hostA/vm1", &n));
  EXPECT_FALSE(ParseVmKey(kDefaultTenantPrefix, "/vsocket/tenants/-7/hostA/vm1", &n));
  EXPECT_FALSE(ParseVmKey(kDefaultTenantPrefix, "/vsocket/tenants/4294967296/hostA/vm1", &n));
  EXPECT_FALSE(ParseVmKey(kDefaultTenantPrefix, "/vsocket/hosts/hostA/vm1", &n));
}

TEST(DirectoryRecords, RoundTripAndRefuseMalformed) {
  auto h = DecodeHost(EncodeHost({"203.0.113.1:7300", {"tcp", "rdma"}}));
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->fabric_address, "203.0.113.1:7300");
  EXPECT_EQ(h->fabrics, (std::vector<std::string>{"tcp", "rdma"}));
  auto v = DecodeVm(EncodeVm({7, {"198.51.100.1", "198.51.100.16/28"}}));
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->tenant, 7u);
  EXPECT_EQ(v->addresses.size(), 2u);
  EXPECT_FALSE(DecodeVm("{\"addresses\":[]}").ok());  // no tenant
  EXPECT_FALSE(DecodeVm("{\"tenant\":0}").ok());      // tenant 0
  EXPECT_FALSE(DecodeVm("{\"tenant\":7,\"addresses\":[1]}").ok());
  EXPECT_FALSE(DecodeVm("not json").ok());
  EXPECT_FALSE(DecodeHost("[]").ok());
}

}  // namespace
}  // namespace vsocket::directory
