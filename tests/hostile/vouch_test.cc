// A VM's socket-proof authority (decision 100): on a port with
// prove_sockets = agent, only the device attached at PATH.agent may vouch
// for a socket, a process's own device cannot (whatever it claims in its
// HELLO), and a vouch lets exactly the named device register that 4-tuple,
// once. vsocketd's side, with process-mode frontends standing in for the
// VM's functions (tests/vm/vm_mode.sh vm_to_vm_proofs runs the real agent).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "proto/control.h"
#include "tests/hostile/raw_guest.h"
#include "tests/integration/daemon_fixture.h"

namespace vsocket {
namespace {

using proto::Endpoint;
using proto::Role;
using testing::Daemon;
using testing::RawGuest;

// A loopback TCP connection's client end as the kernel names it (the
// connection stays open while the test runs).
struct Loopback {
  int client = -1, server = -1;
  Endpoint local, peer;
  Loopback() {
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(l, 1) != 0 ||
        getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return;
    client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(client, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return;
    server = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
    close(l);
    sockaddr_in c{};
    len = sizeof(c);
    getsockname(client, reinterpret_cast<sockaddr*>(&c), &len);
    local.addr = {127, 0, 0, 1};
    local.port = ntohs(c.sin_port);
    peer.addr = {127, 0, 0, 1};
    peer.port = ntohs(a.sin_port);
  }
  ~Loopback() {
    if (client >= 0) close(client);
    if (server >= 0) close(server);
  }
};

// vsocketd learns of a frontend's device a little after it connects (the
// real agent tries again too): LIMIT_MEMORY until the device is there.
std::string LimitWhenStarted(RawGuest& agent, uint64_t ring, std::vector<proto::MemRange> ranges) {
  std::string r;
  for (int i = 0; i < 100; ++i) {
    r = agent.LimitMemory(ring, ranges);
    if (r != "UNKNOWN_CONNECTION") break;
    usleep(20'000);
  }
  return r;
}

// utime + stime of pid, in clock ticks.
long CpuTicks(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), {});
  size_t p = stat.rfind(')');
  if (p == std::string::npos) return -1;
  std::istringstream in(stat.substr(p + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return utime + stime;
}

bool NeedsLimitSoon(RawGuest& g) {
  for (int i = 0; i < 100 && !g.NeedsLimit(); ++i) usleep(20'000);
  return g.NeedsLimit();
}

class VouchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_.set_proofs_by_agent("vm");
    ASSERT_TRUE(daemon_.Start());
  }
  void TearDown() override {
    EXPECT_TRUE(daemon_.Alive()) << "vsocketd survived";
    EXPECT_TRUE(daemon_.StopsCleanly()) << "vsocketd exits with status 0 on SIGTERM";
  }
  Daemon daemon_{{"vm:1"}};
};

TEST_F(VouchTest, AProcessCannotVouchForItselfNorClaimToBeTheAuthority) {
  RawGuest agent(daemon_.socket_path("vm") + ".agent");
  RawGuest p(daemon_.socket_path("vm"));
  ASSERT_TRUE(agent.ok() && p.ok()) << agent.error() << p.error();
  ASSERT_EQ(LimitWhenStarted(agent, p.RequestRingGpa(), {p.Region()}), "OK");
  EXPECT_EQ(p.Hello(proto::kFeatureProofAuthority) & proto::kFeatureProofAuthority, 0u)
      << "only the device on PATH.agent is told it is the authority";
  Loopback c;
  ASSERT_GE(c.server, 0);
  EXPECT_EQ(p.Vouch(p.RequestRingGpa(), c.local, c.peer), "BAD_MESSAGE");
  EXPECT_EQ(p.Register(1, Role::kClient, c.local, c.peer), "spoofed-address")
      << "its own VOUCH proved nothing";
  std::string stats = daemon_.Stats();
  EXPECT_NE(stats.find("\"vouches_refused\":1"), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"rejected_unproven\":1"), std::string::npos) << stats;
}

TEST_F(VouchTest, TheAgentsVouchLetsTheNamedDeviceRegisterThatSocketOnce) {
  RawGuest agent(daemon_.socket_path("vm") + ".agent");
  ASSERT_TRUE(agent.ok()) << agent.error();
  EXPECT_NE(agent.Hello(proto::kFeatureProofAuthority) & proto::kFeatureProofAuthority, 0u);
  RawGuest p(daemon_.socket_path("vm")), other(daemon_.socket_path("vm"));
  ASSERT_TRUE(p.ok() && other.ok()) << p.error() << other.error();
  // Each function limited to its own memory first (decision 130).
  EXPECT_EQ(LimitWhenStarted(agent, p.RequestRingGpa(), {p.Region()}), "OK");
  EXPECT_EQ(LimitWhenStarted(agent, other.RequestRingGpa(), {other.Region()}), "OK");
  Loopback c;
  ASSERT_GE(c.server, 0);
  // Named by where its request ring is: no device there, then p's.
  EXPECT_EQ(agent.Vouch(p.RequestRingGpa() + 4096 * 16, c.local, c.peer), "UNKNOWN_CONNECTION");
  EXPECT_EQ(agent.Vouch(p.RequestRingGpa(), c.local, c.peer), "OK");
  EXPECT_EQ(other.Register(1, Role::kClient, c.local, c.peer), "spoofed-address")
      << "a vouch is for the device it names";
  EXPECT_EQ(p.Register(1, Role::kClient, c.local, c.peer), "pending") << "taken (its peer never registers)";
  EXPECT_EQ(p.Register(2, Role::kClient, c.local, c.peer), "spoofed-address") << "once";
  // One authority per VM: a second frontend on the agent socket is refused.
  RawGuest second(daemon_.socket_path("vm") + ".agent");
  EXPECT_FALSE(second.ok());
  std::string stats = daemon_.Stats();
  EXPECT_NE(stats.find("\"vouches\":1"), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"vouches_refused\":1"), std::string::npos) << stats;
}

// Decision 130: a function of a VM whose agent proves its sockets reaches
// no guest memory until the agent limits it, and then only what it was
// given; only the agent limits, once per device.
TEST_F(VouchTest, OnlyTheAgentLimitsADeviceAndAnUnlimitedOneReachesNothing) {
  RawGuest agent(daemon_.socket_path("vm") + ".agent");
  ASSERT_TRUE(agent.ok()) << agent.error();
  RawGuest p(daemon_.socket_path("vm")), q(daemon_.socket_path("vm"));
  ASSERT_TRUE(p.ok() && q.ok()) << p.error() << q.error();
  Loopback c;
  ASSERT_GE(c.server, 0);
  // q, unlimited, limits itself: its request is not even read (it lies in
  // memory q's device does not reach yet); it waits in the ring.
  EXPECT_TRUE(NeedsLimitSoon(q) && NeedsLimitSoon(p)) << "vsocketd says so in their request rings";
  EXPECT_FALSE(agent.NeedsLimit()) << "the agent's own function is never limited";
  EXPECT_EQ(q.LimitMemory(q.RequestRingGpa(), {q.Region()}), "") << "an unlimited device reaches nothing";
  // Its request waits in the ring, and vsocketd does not spin on it: well
  // under half a CPU over 2 s (a worker that took it for work would spin).
  long t0 = CpuTicks(daemon_.pid());
  sleep(2);
  long used = CpuTicks(daemon_.pid()) - t0;
  EXPECT_LT(used, sysconf(_SC_CLK_TCK)) << "vsocketd used " << used << " ticks in 2 s with an unserved request";
  // The agent: a range beyond the VM's memory, one that leaves the request
  // ring out, then p's own memory, then again.
  proto::MemRange r = p.Region();
  EXPECT_EQ(LimitWhenStarted(agent, p.RequestRingGpa(), {{1ull << 50, 1 << 21}}), "BAD_RING");
  EXPECT_EQ(agent.LimitMemory(p.RequestRingGpa(), {{r.gpa + r.len - 4096, 4096}}), "BAD_RING");
  EXPECT_EQ(agent.LimitMemory(p.RequestRingGpa(), {r}), "OK");
  EXPECT_FALSE(p.NeedsLimit());
  EXPECT_TRUE(q.NeedsLimit());
  EXPECT_EQ(agent.LimitMemory(p.RequestRingGpa(), {r}), "BAD_RING") << "once";
  EXPECT_EQ(agent.Vouch(p.RequestRingGpa(), c.local, c.peer), "OK");
  EXPECT_EQ(p.Register(1, Role::kClient, c.local, c.peer), "pending") << "limited to its own memory, it works";
  std::string stats = daemon_.Stats();
  EXPECT_NE(stats.find("\"memory_limits\":1"), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"memory_limits_refused\":3"), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"broken_devices\":0"), std::string::npos) << stats;
}

}  // namespace
}  // namespace vsocket
