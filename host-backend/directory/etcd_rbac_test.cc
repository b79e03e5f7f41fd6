// A host's etcd credentials against a real etcd with auth on (skipped
// without the etcd binary): it writes its own keys, reads everyone's, and
// cannot write, delete or publish under another host's name.
#include "host-backend/directory/etcd_rbac.h"

#include <arpa/inet.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "gtest/gtest.h"
#include "host-backend/directory/etcd_locator.h"
#include "host-backend/directory/etcd_publisher.h"
#include "host-backend/directory/etcd_test_env.h"

namespace vsocket::directory {
namespace {

class EtcdRbacTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogLevel(LogLevel::kError);
    if (EtcdTestServer::Binary().empty())
      GTEST_SKIP() << "no etcd binary (apt-get install etcd-server; deploy/install-deps.sh)";
    // Tokens that expire after 1 s idle: the clients must renew them.
    etcd_.set_extra_args({"--auth-token-ttl=1"});
    Status st = etcd_.Start();
    ASSERT_TRUE(st.ok()) << st.ToString();
    EtcdClient anonymous({etcd_.endpoint()});
    st = EnableAuth(anonymous, "rootpw");
    ASSERT_TRUE(st.ok()) << st.ToString();
    root_ = As("root", "rootpw");
    for (const char* host : {"hostA", "hostB"}) {
      st = GrantHost(*root_, kDefaultPrefix, host, std::string(host) + "-pw");
      ASSERT_TRUE(st.ok()) << host << ": " << st.ToString();
      st = GrantTenant(*root_, kDefaultTenantPrefix, host, 7);  // (both serve tenant 7; hostB also 8)
      ASSERT_TRUE(st.ok()) << host << ": " << st.ToString();
    }
    st = GrantTenant(*root_, kDefaultTenantPrefix, "hostB", 8);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  std::shared_ptr<EtcdClient> As(const std::string& user, const std::string& password) {
    EtcdClientOptions o;
    o.user = user;
    o.password = password;
    return std::make_shared<EtcdClient>(std::vector<std::string>{etcd_.endpoint()}, o);
  }
  static std::string Vm(uint32_t tenant, const char* addr) { return EncodeVm({tenant, {addr}}); }

  EtcdTestServer etcd_;
  std::shared_ptr<EtcdClient> root_;
};

static std::string Key(uint32_t tenant, const char* host, const char* vm) {
  return VmKey(kDefaultTenantPrefix, tenant, host, vm);
}

TEST_F(EtcdRbacTest, AHostWritesItsOwnKeysOnly) {
  auto a = As("hostA", "hostA-pw");
  EXPECT_TRUE(a->Put(HostKey(kDefaultPrefix, "hostA"), EncodeHost({"192.0.2.1:7300", {"tcp"}})).ok());
  EXPECT_TRUE(a->Put(Key(7, "hostA", "vm1"), Vm(7, "198.51.100.1")).ok());
  ASSERT_TRUE(root_->Put(Key(7, "hostB", "vm2"), Vm(7, "198.51.100.2")).ok());
  // Under hostB's name, or a name that merely starts with hostA's, or in a
  // tenant hostA was not granted (8; 70, whose number starts with 7's).
  for (const std::string& key :
       {HostKey(kDefaultPrefix, "hostB"), Key(7, "hostB", "vm2"), Key(7, "hostB", "x"), HostKey(kDefaultPrefix, "hostAB"),
        Key(7, "hostAB", "x"), Key(8, "hostA", "x"), Key(70, "hostA", "x"), HostKey(kDefaultPrefix, "hostA") + "/x",
        std::string("/vsocket/other")}) {
    auto put = a->Put(key, Vm(7, "198.51.100.2"));
    EXPECT_EQ(put.status().code(), Code::kPermissionDenied) << key << ": " << put.status().ToString();
  }
  EXPECT_EQ(a->DeletePrefix(TenantPrefix(kDefaultTenantPrefix, 7) + "hostB/").status().code(),
            Code::kPermissionDenied);
  // It reads the host records and its tenants' records (to follow them),
  // hostB's untouched; not another tenant's.
  auto hosts = a->GetPrefix(kDefaultPrefix);
  ASSERT_TRUE(hosts.ok()) << hosts.status().ToString();
  EXPECT_EQ(hosts->kvs.size(), 1u);
  auto seven = a->GetPrefix(TenantPrefix(kDefaultTenantPrefix, 7));
  ASSERT_TRUE(seven.ok()) << seven.status().ToString();
  ASSERT_EQ(seven->kvs.size(), 2u);
  EXPECT_EQ(seven->kvs[1].key, Key(7, "hostB", "vm2"));
  EXPECT_EQ(seven->kvs[1].value, Vm(7, "198.51.100.2"));
  ASSERT_TRUE(As("hostB", "hostB-pw")->Put(Key(8, "hostB", "vm8"), Vm(8, "198.51.100.8")).ok());
  EXPECT_EQ(a->GetPrefix(TenantPrefix(kDefaultTenantPrefix, 8)).status().code(), Code::kPermissionDenied);
}

TEST_F(EtcdRbacTest, WrongPasswordAndNoCredentialsAreRefused) {
  EXPECT_EQ(As("hostA", "guess")->Put(HostKey(kDefaultPrefix, "hostA"), "{}").status().code(),
            Code::kPermissionDenied);
  EtcdClient anonymous({etcd_.endpoint()});
  EXPECT_EQ(anonymous.Put(HostKey(kDefaultPrefix, "hostA"), "{}").status().code(), Code::kPermissionDenied);
  EXPECT_EQ(anonymous.GetPrefix(kDefaultPrefix).status().code(), Code::kPermissionDenied);
}

TEST_F(EtcdRbacTest, AnExpiredTokenIsRenewed) {
  auto a = As("hostA", "hostA-pw");
  ASSERT_TRUE(a->Put(HostKey(kDefaultPrefix, "hostA"), "{}").ok());
  usleep(2500 * 1000);  // past --auth-token-ttl
  auto put = a->Put(HostKey(kDefaultPrefix, "hostA"), "{}");
  EXPECT_TRUE(put.ok()) << put.status().ToString();
}

TEST_F(EtcdRbacTest, APublisherUnderAnotherHostsNameIsRefusedAndPeersNeverSeeIt) {
  auto a = As("hostA", "hostA-pw");
  EtcdLocator::Options lo;
  lo.backoff_min_ms = 50;
  lo.tenants = {7};
  EtcdLocator loc(a, lo);  // hostA follows the directory with its own credentials
  loc.Start();
  ASSERT_TRUE(loc.WaitSynced(5000)) << loc.Health().last_error;

  EtcdPublisher::Options po;
  po.backoff_min_ms = 50;
  po.backoff_max_ms = 200;
  EtcdPublisher liar(a, "hostB", HostRecord{"192.0.2.1:7300", {"tcp"}},
                     std::map<std::string, VmRecord>{{"vm9", {7, {"198.51.100.9"}}}}, po);
  liar.Start();
  EXPECT_FALSE(liar.WaitPublished(1500));
  EXPECT_NE(liar.Health().last_error.find("permission denied"), std::string::npos) << liar.Health().last_error;
  liar.Stop();

  // hostB's real publisher, with its own credentials: hostA's locator
  // follows it (its watch carries hostA's token).
  EtcdPublisher real(As("hostB", "hostB-pw"), "hostB", HostRecord{"192.0.2.2:7300", {"tcp"}},
                     std::map<std::string, VmRecord>{{"vm9", {7, {"198.51.100.9"}}}}, po);
  real.Start();
  ASSERT_TRUE(real.WaitPublished(5000)) << real.Health().last_error;
  EXPECT_TRUE(Eventually([&] { return loc.Find(7, V4("198.51.100.9")) == "hostB"; }, 2000));
  // (The host's record comes on a watch of its own: it may follow the VM's.)
  EXPECT_TRUE(Eventually([&] { return loc.Health().hosts == 1u; }, 2000)) << loc.Health().hosts;
  real.Stop();
  loc.Stop();
}

// Decision 103: a tenant this host's role was not granted is refused by
// etcd; that tenant alone is not followed, the others are.
TEST_F(EtcdRbacTest, ATenantNotGrantedIsNotFollowedTheOthersAre) {
  ASSERT_TRUE(As("hostB", "hostB-pw")->Put(Key(7, "hostB", "vm7"), Vm(7, "198.51.100.7")).ok());
  ASSERT_TRUE(As("hostB", "hostB-pw")->Put(Key(8, "hostB", "vm8"), Vm(8, "198.51.100.8")).ok());
  EtcdLocator::Options lo;
  lo.backoff_min_ms = 50;
  lo.tenants = {7, 8};  // hostA has 7 only
  EtcdLocator loc(As("hostA", "hostA-pw"), lo);
  loc.Start();
  ASSERT_TRUE(loc.WaitSynced(5000)) << loc.Health().last_error;
  EXPECT_EQ(loc.Find(7, V4("198.51.100.7")), "hostB");
  EXPECT_EQ(loc.Find(8, V4("198.51.100.8")), "");
  EXPECT_EQ(loc.Health().refused_tenants, std::vector<uint32_t>{8});
  ASSERT_TRUE(Eventually([&] { return loc.Health().connected; }, 2000)) << loc.Health().last_error;
  ASSERT_TRUE(As("hostB", "hostB-pw")->Put(Key(7, "hostB", "vm7b"), Vm(7, "198.51.100.17")).ok());
  EXPECT_TRUE(Eventually([&] { return loc.Find(7, V4("198.51.100.17")) == "hostB"; }, 2000));
  loc.Stop();
}

}  // namespace
}  // namespace vsocket::directory
