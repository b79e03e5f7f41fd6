// The directory against a real 3-member etcd cluster (skipped without the
// etcd binary): with the member it talks to killed, the locator and the
// publishers go on through the other two.
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>

#include "base/clock.h"
#include "base/log.h"
#include "gtest/gtest.h"
#include "host-backend/directory/etcd_locator.h"
#include "host-backend/directory/etcd_publisher.h"
#include "host-backend/directory/etcd_test_env.h"

namespace vsocket::directory {
namespace {

TEST(EtcdClusterTest, OneMemberDownTheDirectoryKeepsWorking) {
  SetLogLevel(LogLevel::kError);
  if (EtcdTestServer::Binary().empty())
    GTEST_SKIP() << "no etcd binary (apt-get install etcd-server; deploy/install-deps.sh)";
  EtcdTestCluster cluster(3);
  Status st = cluster.Start();
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto client_of = [&] {
    return std::make_shared<EtcdClient>(cluster.endpoints(), EtcdClientOptions::Timeouts(1000, 300, 1000));
  };
  auto a = client_of();
  EtcdLocator::Options lo;
  lo.tenants = {7};
  lo.backoff_min_ms = 50;
  lo.backoff_max_ms = 400;
  EtcdLocator loc(a, lo);
  loc.Start();
  ASSERT_TRUE(loc.WaitSynced(5000)) << loc.Health().last_error;
  EtcdPublisher::Options po;
  po.ttl_s = 3;
  po.backoff_min_ms = 50;
  po.backoff_max_ms = 200;
  EtcdPublisher hostA(a, "hostA", HostRecord{"192.0.2.1:7300", {"tcp"}},
                      std::map<std::string, VmRecord>{{"vm1", {7, {"198.51.100.1"}}}}, po);
  hostA.Start();
  ASSERT_TRUE(hostA.WaitPublished(5000)) << hostA.Health().last_error;
  ASSERT_TRUE(Eventually([&] { return loc.Find(7, V4("198.51.100.1")) == "hostA"; }, 2000));

  // The member hostA's client uses now goes down.
  std::vector<std::string> eps = cluster.endpoints();
  size_t down = std::find(eps.begin(), eps.end(), a->endpoint()) - eps.begin();
  ASSERT_LT(down, eps.size());
  cluster.Kill(int(down));

  // Another host publishes: the locator's watch moved to another member.
  EtcdPublisher hostB(client_of(), "hostB", HostRecord{"192.0.2.2:7300", {"tcp"}},
                      std::map<std::string, VmRecord>{{"vm2", {7, {"198.51.100.2"}}}}, po);
  hostB.Start();
  ASSERT_TRUE(hostB.WaitPublished(5000)) << hostB.Health().last_error;
  EXPECT_TRUE(Eventually([&] { return loc.Find(7, V4("198.51.100.2")) == "hostB"; }, 5000)) << loc.Health().last_error;
  EXPECT_NE(a->endpoint(), eps[down]);
  // hostA's 3 s lease lives on through the others (kept past two TTLs).
  usleep(7000 * 1000);
  EXPECT_EQ(loc.Find(7, V4("198.51.100.1")), "hostA");
  EXPECT_EQ(hostA.Health().publishes, 1u);
  EXPECT_TRUE(loc.Health().connected);
  EXPECT_GE(loc.Health().connects, 2u);

  // Back: it catches up with the others (and the directory stays as it is).
  st = cluster.Restart(int(down));
  ASSERT_TRUE(st.ok()) << st.ToString();
  EtcdClient only_it({eps[down]}, EtcdClientOptions::Timeouts(1000, 300, 1000));
  EXPECT_TRUE(Eventually(
      [&] {
        auto hosts = only_it.GetPrefix(kDefaultPrefix);
        auto vms = only_it.GetPrefix(TenantPrefix(kDefaultTenantPrefix, 7));
        return hosts.ok() && hosts->kvs.size() == 2 && vms.ok() && vms->kvs.size() == 2;  // two hosts, a VM each
      },
      10000));
  hostB.Stop();
  hostA.Stop();
  loc.Stop();
}

}  // namespace
}  // namespace vsocket::directory
