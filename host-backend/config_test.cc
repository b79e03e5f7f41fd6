#include "host-backend/config.h"

#include <gtest/gtest.h>

namespace vsocket::backend {
namespace {

constexpr char kGood[] = R"(# vsocketd.conf
ctl_socket = /run/v/ctl.sock
poll_us = 20
log_level = info
metrics_port = 9465

[vm web-1]
socket = /run/v/web.sock
tenant = 7
addresses = 198.51.100.11, 2001:db8::11

[vm db]
socket = /run/v/db.sock
tenant = 7
)";

TEST(ConfigTest, ParsesDaemonAndVmSections) {
  auto c = ParseConfig(kGood, "t.conf");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->ctl_socket, "/run/v/ctl.sock");
  EXPECT_EQ(c->poll_us, 20);
  EXPECT_EQ(c->metrics_port, 9465);
  ASSERT_EQ(c->vms.size(), 2u);
  EXPECT_EQ(c->vms[0].vm_name, "web-1");
  EXPECT_EQ(c->vms[0].tenant_id, 7u);
  ASSERT_EQ(c->vms[0].addresses.size(), 2u);
  EXPECT_EQ(c->vms[0].addresses[1].family, 6);
  EXPECT_TRUE(Validate(&*c).ok());
  EXPECT_EQ(c->vms[1].index, 1u);
}

// nap_us: auto naps only where vsocketd shares every CPU of a small host.
TEST(ConfigTest, NapUsAutoNapsOnlyWithoutCpusOnHostsOfFewerThanFourCpus) {
  DaemonConfig c;
  EXPECT_EQ(c.nap_us, -1);
  EXPECT_EQ(EffectiveNapUs(c, 2), 100);
  EXPECT_EQ(EffectiveNapUs(c, 3), 100);
  EXPECT_EQ(EffectiveNapUs(c, 4), 0);
  c.cpus = "1";
  EXPECT_EQ(EffectiveNapUs(c, 2), 0);
  auto set = ParseConfig("nap_us = 0\n", "t.conf");
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(EffectiveNapUs(*set, 2), 0);
  set = ParseConfig("nap_us = 250\ncpus = 1\n", "t.conf");
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(EffectiveNapUs(*set, 8), 250);
  EXPECT_FALSE(ParseConfig("nap_us = -2\n", "t.conf").ok());
}

TEST(ConfigTest, ErrorsNameFileLineAndProblem) {
  struct Case {
    const char* text;
    const char* fragment;
  } cases[] = {
      {"poll_us = fast\n", "t.conf:1: 'fast' is not a number"},
      {"\ncolour = red\n", "t.conf:2: unknown key 'colour'"},
      {"[vm a]\ntenant = 0\n", "t.conf:2: tenant must be"},
      {"[vm a]\naddresses = 198.51.100.300\n", "not an IPv4 or IPv6 address"},
      {"[pool]\n", "section must be"},
      {"[vm a\n", "unterminated"},
      {"just words\n", "expected KEY = VALUE"},
      {"log_level = loud\n", "log_level must be"},
      {"cpus = one\n", "t.conf:1: cpus: 'one' is not a CPU list"},
      {"cpus = 3-1\n", "bad range"},
      {"cpus = 1,\n", "is not a CPU list"},
      {"cpus = 99999\n", "is not a CPU list"},
  };
  for (const Case& k : cases) {
    auto c = ParseConfig(k.text, "t.conf");
    ASSERT_FALSE(c.ok()) << k.text;
    EXPECT_NE(c.status().message().find(k.fragment), std::string::npos) << c.status().message();
  }
}

TEST(ConfigTest, CpuLists) {
  std::vector<int> cpus;
  std::string error;
  ASSERT_TRUE(ParseCpuList("1", &cpus, &error)) << error;
  EXPECT_EQ(cpus, (std::vector<int>{1}));
  ASSERT_TRUE(ParseCpuList("0,2-4,3", &cpus, &error)) << error;
  EXPECT_EQ(cpus, (std::vector<int>{0, 2, 3, 4}));
  EXPECT_FALSE(ParseCpuList("", &cpus, &error));
  EXPECT_FALSE(ParseCpuList("-1", &cpus, &error));
  EXPECT_FALSE(ParseCpuList("1-", &cpus, &error));
  auto c = ParseConfig("cpus = 0-1\n[vm a]\nsocket = /s\ntenant = 1\n", "t.conf");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->cpus, "0-1");
}

TEST(ConfigTest, ValidationCatchesIncompleteVms) {
  auto c = ParseConfig("[vm a]\nsocket = /s\n", "t.conf");
  ASSERT_TRUE(c.ok());
  EXPECT_NE(Validate(&*c).message().find("no tenant"), std::string::npos);
  c = ParseConfig("[vm a]\ntenant = 1\nsocket=/s\n[vm a]\ntenant=1\nsocket=/t\n", "t.conf");
  ASSERT_TRUE(c.ok());
  EXPECT_NE(Validate(&*c).message().find("twice"), std::string::npos);
  DaemonConfig empty;
  EXPECT_FALSE(Validate(&empty).ok());
}

TEST(ConfigTest, EnvironmentOverridesFileValues) {
  auto c = ParseConfig(kGood, "t.conf");
  ASSERT_TRUE(c.ok());
  char e1[] = "VSOCKET_POLL_US=0", e2[] = "VSOCKET_VM_WEB_1_TENANT=9", e3[] = "VSOCKET_VM_DB_ADDRESSES=198.51.100.20",
       e4[] = "PATH=/bin";
  char* env[] = {e1, e2, e3, e4, nullptr};
  ASSERT_TRUE(ApplyEnv(env, &*c).ok());
  EXPECT_EQ(c->poll_us, 0);
  EXPECT_EQ(c->vms[0].tenant_id, 9u);
  ASSERT_EQ(c->vms[1].addresses.size(), 1u);
  char bad[] = "VSOCKET_METRICS_PORT=99999";
  char* env2[] = {bad, nullptr};
  Status st = ApplyEnv(env2, &*c);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("VSOCKET_METRICS_PORT"), std::string::npos);
}

}  // namespace
}  // namespace vsocket::backend

namespace vsocket::backend {
namespace {

TEST(PeerConfig, PeersNeedTheWholeMultiHostSetup) {
  const char* base =
      "host_name = hostA\npeer_listen = 203.0.113.1:7300\ntls_cert = a.crt\ntls_key = a.key\n"
      "tls_ca = ca.crt\nlocator = loc\n[vm v]\nsocket = /tmp/v.sock\ntenant = 7\n"
      "[peer hostB]\naddress = 203.0.113.2:7300\n";
  auto c = ParseConfig(base, "f");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(Validate(&*c).ok());
  ASSERT_EQ(c->peers.size(), 1u);
  EXPECT_EQ(c->peers[0].name, "hostB");
  EXPECT_EQ(c->peers[0].address, "203.0.113.2:7300");
  EXPECT_TRUE(c->tls_crl.empty()) << "tls_crl is optional";
  c->tls_ca.clear();
  EXPECT_NE(Validate(&*c).message().find("tls_ca is not set"), std::string::npos);
  ASSERT_TRUE(ParseConfig("tls_crl = /etc/vsocket/ca.crl\n", "f").ok());
  EXPECT_EQ(ParseConfig("tls_crl = /etc/vsocket/ca.crl\n", "f")->tls_crl, "/etc/vsocket/ca.crl");

  EXPECT_NE(ParseConfig("[peer x]\naddress = 203.0.113.2\n", "f").status().message().find("f:2:"), std::string::npos);
  EXPECT_NE(ParseConfig("peer_listen = 1.2.3.4:0\n", "f").status().message().find("port"), std::string::npos);
  EXPECT_NE(ParseConfig("fabric = ib\n", "f").status().message().find("tcp or rdma"), std::string::npos);
  EXPECT_TRUE(ParseConfig("peer_listen = [2001:db8::1]:7300\n", "f").ok());

  char env1[] = "VSOCKET_PEER_HOSTB_ADDRESS=203.0.113.9:7301";
  char env2[] = "VSOCKET_HOST_NAME=hostZ";
  char* env[] = {env1, env2, nullptr};
  auto d = ParseConfig(base, "f");
  ASSERT_TRUE(ApplyEnv(env, &*d).ok());
  EXPECT_EQ(d->peers[0].address, "203.0.113.9:7301");
  EXPECT_EQ(d->host_name, "hostZ");
}

}  // namespace
}  // namespace vsocket::backend

namespace vsocket::backend {
namespace {

TEST(PeerConfig, RdmaFabricKeysAndEnvironment) {
  auto c = ParseConfig("fabric = rdma\nrdma_device = mlx5_0\nrdma_gid_index = 3\n", "f");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->fabric, "rdma");
  EXPECT_EQ(c->rdma_device, "mlx5_0");
  EXPECT_EQ(c->rdma_gid_index, 3);
  auto d = ParseConfig("", "f");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->fabric, "tcp");
  EXPECT_EQ(d->rdma_gid_index, -1);  // automatic: the IPv4-mapped RoCEv2 GID
  EXPECT_NE(ParseConfig("rdma_gid_index = 256\n", "f").status().message().find("f:1:"), std::string::npos);

  char e1[] = "VSOCKET_FABRIC=rdma", e2[] = "VSOCKET_RDMA_DEVICE=rxe0", e3[] = "VSOCKET_RDMA_GID_INDEX=1";
  char* env[] = {e1, e2, e3, nullptr};
  ASSERT_TRUE(ApplyEnv(env, &*d).ok());
  EXPECT_EQ(d->fabric, "rdma");
  EXPECT_EQ(d->rdma_device, "rxe0");
  EXPECT_EQ(d->rdma_gid_index, 1);
  char bad[] = "VSOCKET_RDMA_GID_INDEX=x";
  char* env2[] = {bad, nullptr};
  EXPECT_NE(ApplyEnv(env2, &*d).message().find("VSOCKET_RDMA_GID_INDEX"), std::string::npos);
}

TEST(PeerConfig, LinksPerPeer) {
  auto d = ParseConfig("", "f");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->links_per_peer, 1);
  auto c = ParseConfig("links_per_peer = 4\n", "f");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->links_per_peer, 4);
  EXPECT_NE(ParseConfig("links_per_peer = 0\n", "f").status().message().find("f:1:"), std::string::npos);
  EXPECT_FALSE(ParseConfig("links_per_peer = 17\n", "f").ok());
  char e1[] = "VSOCKET_LINKS_PER_PEER=3";
  char* env[] = {e1, nullptr};
  ASSERT_TRUE(ApplyEnv(env, &*d).ok());
  EXPECT_EQ(d->links_per_peer, 3);
}

}  // namespace
}  // namespace vsocket::backend

namespace vsocket::backend {
namespace {

TEST(DaemonConfig, GuestBudgets) {
  auto d = ParseConfig("", "f");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->orphan_mb_per_vm, 256);
  EXPECT_EQ(d->orphan_mb_total, 1024);
  EXPECT_EQ(d->max_devices_per_vm, 256);
  EXPECT_EQ(d->max_conns_per_vm, 65536);
  auto c = ParseConfig("orphan_mb_per_vm = 8\norphan_mb_total = 0\nmax_devices_per_vm = 4\nmax_conns_per_vm = 100\n", "f");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->orphan_mb_per_vm, 8);
  EXPECT_EQ(c->orphan_mb_total, 0);
  EXPECT_EQ(c->max_devices_per_vm, 4);
  EXPECT_EQ(c->max_conns_per_vm, 100);
  EXPECT_NE(ParseConfig("max_devices_per_vm = 0\n", "f").status().message().find("f:1:"), std::string::npos);
  char e1[] = "VSOCKET_MAX_CONNS_PER_VM=7";
  char e2[] = "VSOCKET_ORPHAN_MB_TOTAL=9";
  char* env[] = {e1, e2, nullptr};
  ASSERT_TRUE(ApplyEnv(env, &*d).ok());
  EXPECT_EQ(d->max_conns_per_vm, 7);
  EXPECT_EQ(d->orphan_mb_total, 9);
  d->vms.push_back({});
  d->vms[0].vm_name = "a";
  d->vms[0].path = "/tmp/a.sock";
  d->vms[0].tenant_id = 1;
  d->max_devices_per_vm = 3;
  ASSERT_TRUE(Validate(&*d).ok());
  EXPECT_EQ(d->vms[0].max_devices, 3u);
}

}  // namespace
}  // namespace vsocket::backend

namespace vsocket::backend {
namespace {

TEST(VmConfig, AwayMarksAMigrationTarget) {
  auto c = ParseConfig("[vm a]\nsocket = /s\ntenant = 1\naway = true\n[vm b]\nsocket = /t\ntenant = 1\n", "f");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->vms[0].away);
  EXPECT_FALSE(c->vms[1].away);  // no key: the VM runs here
  auto bad = ParseConfig("[vm a]\naway = yes\n", "f");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("f:2: away must be true or false"), std::string::npos)
      << bad.status().message();
}

// A QEMU migration's destination (decision 116): its port opens, it is
// published when its first device starts; not together with away.
TEST(VmConfig, IncomingMarksAQemuMigrationDestination) {
  auto c = ParseConfig("[vm a]\nsocket = /s\ntenant = 1\nincoming = true\n[vm b]\nsocket = /t\ntenant = 1\n", "f");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->vms[0].incoming);
  EXPECT_FALSE(c->vms[1].incoming);
  EXPECT_TRUE(Validate(&*c).ok());
  auto bad = ParseConfig("[vm a]\nincoming = 1\n", "f");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("f:2: incoming must be true or false"), std::string::npos)
      << bad.status().message();
  auto both = ParseConfig("[vm a]\nsocket = /s\ntenant = 1\nincoming = true\naway = true\n", "f");
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_NE(Validate(&*both).message().find("away and incoming"), std::string::npos) << Validate(&*both).message();
}

// Guests prove the sockets they register unless a VM says otherwise (a
// QEMU VM's frontend cannot).
TEST(VmConfig, ProveSocketsIsOnUnlessTurnedOff) {
  auto c = ParseConfig("[vm a]\nsocket = /s\ntenant = 1\nprove_sockets = false\n[vm b]\nsocket = /t\ntenant = 1\n", "f");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->vms[0].prove_sockets);
  EXPECT_TRUE(c->vms[1].prove_sockets);
  EXPECT_FALSE(c->vms[1].proofs_by_agent);
  // A QEMU VM's agent vouches for its processes' sockets (decision 100).
  auto agent = ParseConfig("[vm q]\nsocket = /q\ntenant = 1\nprove_sockets = agent\n", "f");
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();
  EXPECT_TRUE(agent->vms[0].prove_sockets);
  EXPECT_TRUE(agent->vms[0].proofs_by_agent);
  auto bad = ParseConfig("[vm a]\nprove_sockets = no\n", "f");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("f:2: prove_sockets must be true, false or agent"), std::string::npos)
      << bad.status().message();
}

// Direct pairs (decision 97): same-tenant by default in process mode
// (decision 102), narrowed or turned off per VM; only the three settings
// are taken.
TEST(VmConfig, DirectIsSameTenantUnlessAVmNarrowsIt) {
  auto c = ParseConfig("[vm a]\nsocket = /s\ntenant = 1\ndirect = off\n[vm b]\nsocket = /t\ntenant = 1\n"
                       "direct = same-vm\n[vm c]\nsocket = /u\ntenant = 1\n",
                       "f");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(Validate(&*c).ok());
  using D = vhost::PortConfig::Direct;
  EXPECT_EQ(c->vms[0].direct, D::kOff);
  EXPECT_EQ(c->vms[1].direct, D::kSameVm);
  EXPECT_EQ(c->vms[2].direct, D::kSameTenant);
  auto bad = ParseConfig("[vm a]\ndirect = yes\n", "f");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("f:2: direct must be off, same-tenant or same-vm"), std::string::npos)
      << bad.status().message();
}

// A QEMU VM's processes (proofs by its agent) and a port without socket
// proofs cannot get direct pairs: off by default there, and asking for
// them is an error rather than a setting silently ignored.
TEST(VmConfig, DirectIsOffWhereProcessesCannotFetchAPair) {
  auto c = ParseConfig("[vm q]\nsocket = /s\ntenant = 1\nprove_sockets = agent\n"
                       "[vm r]\nsocket = /t\ntenant = 1\nprove_sockets = false\n"
                       "[vm s]\nsocket = /u\ntenant = 1\nprove_sockets = agent\ndirect = off\n",
                       "f");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(Validate(&*c).ok());
  using D = vhost::PortConfig::Direct;
  EXPECT_EQ(c->vms[0].direct, D::kOff);
  EXPECT_EQ(c->vms[1].direct, D::kOff);
  EXPECT_EQ(c->vms[2].direct, D::kOff);
  auto asked = ParseConfig("[vm q]\nsocket = /s\ntenant = 1\ndirect = same-vm\nprove_sockets = agent\n", "f");
  ASSERT_TRUE(asked.ok()) << asked.status().ToString();
  Status st = Validate(&*asked);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("VM 'q': direct pairs need process mode (prove_sockets = true); set direct = off"),
            std::string::npos)
      << st.message();
}

TEST(VmConfig, GroupOpensThePortSocketToOneGroup) {
  auto c = ParseConfig("[vm a]\nsocket = /s\ntenant = 1\ngroup = vsocket-db\n[vm b]\nsocket = /t\ntenant = 1\n", "f");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(Validate(&*c).ok());
  EXPECT_EQ(c->vms[0].group, "vsocket-db");
  EXPECT_EQ(c->vms[1].group, "");  // no key: the socket keeps today's owner-only mode

  for (const char* bad : {"group = 1users\n", "group = a b\n", "group = -x\n", "group = \n",
                          "group = x23456789012345678901234567890123\n"}) {
    auto d = ParseConfig(std::string("[vm a]\n") + bad, "f");
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_NE(d.status().message().find("f:2: group must be"), std::string::npos) << d.status().message();
  }
  EXPECT_NE(ParseConfig("[vm a]\ngrup = x\n", "f").status().message().find("socket, tenant, addresses, group"),
            std::string::npos);

  char e1[] = "VSOCKET_VM_B_GROUP=postgres";
  char* env[] = {e1, nullptr};
  ASSERT_TRUE(ApplyEnv(env, &*c).ok());
  EXPECT_EQ(c->vms[1].group, "postgres");
  char bad[] = "VSOCKET_VM_A_GROUP=no way";
  char* env2[] = {bad, nullptr};
  EXPECT_NE(ApplyEnv(env2, &*c).message().find("VSOCKET_VM_A_GROUP"), std::string::npos);
}

}  // namespace
}  // namespace vsocket::backend

namespace vsocket::backend {
namespace {

TEST(LocatorConfig, EtcdEndpointsParseAndAFileStaysAFile) {
  auto c = ParseConfig("locator = etcd://10.0.0.1:2379,etcd-b.example:2379,[2001:db8::1]:2379\n", "f");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(IsEtcdLocator(c->locator));
  auto e = EtcdEndpoints(c->locator);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(*e, (std::vector<std::string>{"10.0.0.1:2379", "etcd-b.example:2379", "[2001:db8::1]:2379"}));
  EXPECT_FALSE(IsEtcdLocator("/etc/vsocket/locator"));
  for (const char* bad : {"locator = etcd://", "locator = etcd://host", "locator = etcd://host:0",
                          "locator = etcd://a:2379,", "locator = etcd://a:2379/x", "locator = etcd://a:99999"})
    EXPECT_FALSE(ParseConfig(std::string(bad) + "\n", "f").ok()) << bad;
}

// Decision 96: with the etcd directory the peers may all come from it (no
// [peer] section), but the host still needs its own identity and listener.
TEST(ConfigTest, AnEtcdLocatorWithoutPeersNeedsTheHostsIdentity) {
  const std::string vm = "[vm a]\nsocket = /tmp/a.sock\ntenant = 1\naddresses = 198.51.100.1\n";
  auto c = ParseConfig("locator = etcd://192.0.2.10:2379\n" + vm, "f");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Status st = Validate(&*c);
  EXPECT_NE(st.message().find("locator = etcd (peers from the directory) but host_name is not set"), std::string::npos)
      << st.ToString();
  c = ParseConfig(
      "locator = etcd://192.0.2.10:2379\nhost_name = hostB\npeer_listen = 192.0.2.2:7300\n"
      "tls_cert = /c\ntls_key = /k\ntls_ca = /ca\n" + vm, "f");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(Validate(&*c).ok());
  EXPECT_TRUE(c->peers.empty());
}

TEST(LocatorConfig, EtcdUserAndPasswordFileAreTakenAsGiven) {
  auto c = ParseConfig("locator = etcd://127.0.0.1:2379\netcd_user = hostA\netcd_password_file = /etc/vsocket/pw\n", "f");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->etcd_user, "hostA");
  EXPECT_EQ(c->etcd_password_file, "/etc/vsocket/pw");
}

TEST(LocatorConfig, EtcdsIsEtcdOverTlsWithItsFiles) {
  auto c = ParseConfig(
      "locator = etcds://192.0.2.10:2379,192.0.2.11:2379\netcd_ca = /etc/vsocket/etcd-ca.crt\n"
      "etcd_cert = /etc/vsocket/etcd.crt\netcd_key = /etc/vsocket/etcd.key\n",
      "f");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(IsEtcdLocator(c->locator));
  EXPECT_TRUE(EtcdLocatorUsesTls(c->locator));
  EXPECT_FALSE(EtcdLocatorUsesTls("etcd://192.0.2.10:2379"));
  auto e = EtcdEndpoints(c->locator);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e.value(), (std::vector<std::string>{"192.0.2.10:2379", "192.0.2.11:2379"}));
  EXPECT_EQ(c->etcd_ca, "/etc/vsocket/etcd-ca.crt");
  EXPECT_EQ(c->etcd_cert, "/etc/vsocket/etcd.crt");
  EXPECT_EQ(c->etcd_key, "/etc/vsocket/etcd.key");
  EXPECT_FALSE(ParseConfig("locator = etcds://\n", "f").ok());
}

}  // namespace
}  // namespace vsocket::backend
