#include "host-backend/directory/records.h"

#include "gtest/gtest.h"

namespace vsocket::directory {
namespace {

TEST(DirectoryKeys, HostAndVmKeysParseBackToTheirNames) {
  KeyName n;
  ASSERT_TRUE(ParseKey(kDefaultPrefix, HostKey(kDefaultPrefix, "hostA"), &n));
  EXPECT_EQ(n.host, "hostA");
  EXPECT_EQ(n.vm, "");
  ASSERT_TRUE(ParseKey(kDefaultPrefix, VmKey(kDefaultPrefix, "hostA", "vm1"), &n));
  EXPECT_EQ(n.host, "hostA");
  EXPECT_EQ(n.vm, "vm1");
}

TEST(DirectoryKeys, OtherShapesAreRefused) {
  KeyName n;
  EXPECT_FALSE(ParseKey(kDefaultPrefix, "/other/hostA", &n));
  EXPECT_FALSE(ParseKey(kDefaultPrefix, "/vsocket/hosts/", &n));
  EXPECT_FALSE(ParseKey(kDefaultPrefix, "/vsocket/hosts/hostA/vms/", &n));
  EXPECT_FALSE(ParseKey(kDefaultPrefix, "/vsocket/hosts/hostA/other/vm1", &n));
  EXPECT_FALSE(ParseKey(kDefaultPrefix, "/vsocket/hosts/hostA/vms/vm1/x", &n));
  EXPECT_FALSE(ParseKey(kDefaultPrefix, "/vsocket/hosts/host A", &n));
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
