// Memory a guest can make vsocketd hold (issue 17, finding 3). Rings may
// not alias (one guest page standing for many connections' rings), and the
// bytes closed connections leave undelivered, which vsocketd copies out of
// their rings, are bounded per VM and in all: a close beyond the budget
// resets that connection (its peer sees ECONNRESET) instead of growing the
// daemon's heap.
#include <gtest/gtest.h>
#include <stdlib.h>

#include "tests/hostile/raw_guest.h"
#include "tests/integration/daemon_fixture.h"

namespace vsocket {
namespace {

using proto::Role;
using testing::Daemon;
using testing::Ep;
using testing::RawGuest;
using testing::RegistryState;

class BudgetsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Inherited by the daemon.
    setenv("VSOCKET_ORPHAN_MB_PER_VM", "1", 1);
    setenv("VSOCKET_MAX_DEVICES_PER_VM", "2", 1);
    setenv("VSOCKET_MAX_CONNS_PER_VM", "6", 1);
    ASSERT_TRUE(daemon_.Start());
    for (const char* v : {"VSOCKET_ORPHAN_MB_PER_VM", "VSOCKET_MAX_DEVICES_PER_VM", "VSOCKET_MAX_CONNS_PER_VM"})
      unsetenv(v);
  }
  void TearDown() override {
    EXPECT_TRUE(daemon_.Alive()) << "vsocketd survived";
    EXPECT_TRUE(daemon_.StopsCleanly()) << "vsocketd exits with status 0 on SIGTERM";
  }
  long long Counter(const char* key) { return Daemon::Number(daemon_.Stats(), key); }

  Daemon daemon_{{"client:1,192.0.2.1", "server:1,192.0.2.2"}};
};

TEST_F(BudgetsTest, DevicesAndConnectionsPerVmAreBounded) {
  RawGuest a(daemon_.socket_path("client")), b(daemon_.socket_path("client"));
  ASSERT_TRUE(a.ok() && b.ok()) << a.error() << b.error();
  RawGuest c(daemon_.socket_path("client"));
  EXPECT_FALSE(c.ok()) << "a third device of a VM allowed two";
  EXPECT_EQ(Counter("connections_refused"), 1);
  RawGuest other(daemon_.socket_path("server"));
  EXPECT_TRUE(other.ok()) << "another VM is not affected: " << other.error();
  // Six open connections per VM, over both devices.
  for (uint16_t i = 0; i < 6; ++i)
    EXPECT_EQ((i % 2 ? a : b).Register(100 + i, Role::kClient, Ep(1, 3000 + i), Ep(2, 80), 4096, 4096), "pending");
  EXPECT_EQ(a.Register(200, Role::kClient, Ep(1, 3100), Ep(2, 80), 4096, 4096), "resource-limit");
  EXPECT_EQ(other.Register(200, Role::kServer, Ep(2, 80), Ep(1, 3999), 4096, 4096), "pending");
  // A closed one makes room.
  EXPECT_NE(a.Unregister(101), "");
  EXPECT_EQ(a.Register(201, Role::kClient, Ep(1, 3101), Ep(2, 80), 4096, 4096), "pending");
}

TEST_F(BudgetsTest, OverlappingRingsAreRefused) {
  RawGuest g(daemon_.socket_path("client"));
  ASSERT_TRUE(g.ok()) << g.error();
  const uint32_t kRing = 64 * 1024;
  uint8_t* a = g.Alloc(kRing);
  uint8_t* b = g.Alloc(kRing);
  uint8_t* c = g.Alloc(2 * kRing);
  long long before = Counter("rejected_overlap");
  EXPECT_EQ(g.Register(1, Role::kClient, Ep(1, 1000), Ep(2, 80), a, kRing, b, kRing), "pending");
  // The same TX ring again, an RX ring inside another's TX, TX = RX.
  EXPECT_EQ(g.Register(2, Role::kClient, Ep(1, 1001), Ep(2, 80), a, kRing, c, kRing), "protocol-error");
  EXPECT_EQ(g.Register(3, Role::kClient, Ep(1, 1002), Ep(2, 80), c, kRing, a + 4096, kRing), "protocol-error");
  EXPECT_EQ(g.Register(4, Role::kClient, Ep(1, 1003), Ep(2, 80), c, 2 * kRing, c + kRing, kRing), "protocol-error");
  EXPECT_EQ(Counter("rejected_overlap"), before + 3);
  // Disjoint rings are fine; and once a connection is gone, its rings are free.
  EXPECT_EQ(g.Register(5, Role::kClient, Ep(1, 1004), Ep(2, 80), c, kRing, c + kRing, kRing), "pending");
  EXPECT_NE(g.Unregister(1), "");
  EXPECT_EQ(g.Register(6, Role::kClient, Ep(1, 1005), Ep(2, 80), a, kRing, b, kRing), "pending");
}

// Two connections each close with ~960 KiB undelivered (their peer reads
// nothing and has a 64 KiB ring); the VM's budget is 1 MiB.
TEST_F(BudgetsTest, OrphanBytesBeyondTheBudgetResetTheConnection) {
  RawGuest client(daemon_.socket_path("client"), 8u << 20), server(daemon_.socket_path("server"));
  const uint32_t kBig = 1u << 20, kSmall = 64 * 1024;
  for (uint16_t i = 0; i < 2; ++i) {
    uint16_t port = 2000 + i;
    ASSERT_EQ(client.Register(10 + i, Role::kClient, Ep(1, port), Ep(2, 80), kBig, kSmall), "pending");
    ASSERT_EQ(server.Register(10 + i, Role::kServer, Ep(2, 80), Ep(1, port), kSmall, kSmall), "pending");
    ASSERT_EQ(RegistryState(daemon_, "client", port), "accelerated accelerated");
    ASSERT_TRUE(client.FenceAndWrite(10 + i, kBig));
  }
  // Until the server's rings are full (bounded: 10 s).
  const long long kFull = 2 * kSmall;
  for (int i = 0; i < 1000 && Counter("accel_bytes") < kFull; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(Counter("accel_bytes"), kFull);
  EXPECT_NE(client.Unregister(10), "");
  EXPECT_NE(client.Unregister(11), "");
  std::string s = daemon_.Stats();
  EXPECT_EQ(Daemon::Number(s, "orphan_bytes"), kBig - kSmall) << s;
  EXPECT_EQ(Daemon::Number(s, "orphan_resets"), 1) << s;
  // The first peer keeps its bytes coming; the second is reset.
  EXPECT_EQ(RegistryState(daemon_, "server", 80, 2000), "accelerated accelerated");
  EXPECT_EQ(RegistryState(daemon_, "server", 80, 2001), "accelerated peer-downgraded");
}

}  // namespace
}  // namespace vsocket
