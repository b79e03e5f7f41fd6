// Drains (issue 16; docs/connection-lifecycle.md §9) as vsocketd's registry
// sees them, against an unmodified vsocketd: a draining VM's connections do
// not pair until it is undrained, and a guest that ends its ring stream when
// it may not (its session never took CLEAN_DOWNGRADE) has that connection
// reset, nothing else.
#include <gtest/gtest.h>

#include "tests/hostile/raw_guest.h"
#include "tests/integration/daemon_fixture.h"

namespace vsocket {
namespace {

using proto::Endpoint;
using proto::Role;
using testing::Daemon;
using testing::Ep;
using testing::RawGuest;
using testing::RegistryState;

class DrainTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.Start()); }
  void TearDown() override {
    EXPECT_TRUE(daemon_.Alive()) << "vsocketd survived";
    EXPECT_TRUE(daemon_.StopsCleanly()) << "vsocketd exits with status 0 on SIGTERM";
  }
  std::string State(const std::string& vm, uint16_t port) { return RegistryState(daemon_, vm, port); }

  Daemon daemon_{{"client:1,192.0.2.1", "server:1,192.0.2.2"}};
};

TEST_F(DrainTest, ADrainingVmPairsOnlyOnceUndrained) {
  RawGuest client(daemon_.socket_path("client")), server(daemon_.socket_path("server"));
  ASSERT_TRUE(client.ok() && server.ok()) << client.error() << server.error();
  EXPECT_EQ(daemon_.Command("drain server"), "server: draining, 0 connection(s) still leaving the rings, 0 accelerated\n");
  Endpoint c = Ep(1, 40000), s = Ep(2, 80);
  EXPECT_EQ(client.Register(1, Role::kClient, c, s), "pending");
  EXPECT_EQ(server.Register(1, Role::kServer, s, c), "pending");
  EXPECT_EQ(State("client", 40000), "kernel pending") << "a draining VM's connection paired";
  EXPECT_EQ(State("server", 80), "kernel pending");
  EXPECT_EQ(daemon_.Command("drained server --json"),
            "{\"vm\":\"server\",\"draining\":true,\"leaving\":0,\"accelerated\":0}\n");
  // Another VM's pairs are not held up.
  Endpoint c2 = Ep(1, 40001), s2 = Ep(1, 81);
  EXPECT_EQ(client.Register(2, Role::kClient, c2, s2), "pending");
  EXPECT_EQ(client.Register(3, Role::kServer, s2, c2), "pending");
  EXPECT_EQ(State("client", 40001), "accelerated accelerated");
  // Undrained: the two registered meanwhile pair at once.
  EXPECT_EQ(daemon_.Command("undrain server"), "server: not draining, 0 connection(s) still leaving the rings, 1 accelerated\n");
  EXPECT_EQ(State("client", 40000), "accelerated accelerated");
  EXPECT_EQ(State("server", 80), "accelerated accelerated");
  EXPECT_EQ(daemon_.Command("drain nosuchvm"), "error: no VM named 'nosuchvm' (vsocketctl vms lists them)\n");
}

// The session said HELLO without CLEAN_DOWNGRADE (RawGuest offers no
// features): a ring end from it is a protocol violation of that connection.
TEST_F(DrainTest, ARingEndTheSessionMayNotSendResetsOnlyThatConnection) {
  RawGuest client(daemon_.socket_path("client")), server(daemon_.socket_path("server"));
  ASSERT_TRUE(client.ok() && server.ok()) << client.error() << server.error();
  Endpoint c = Ep(1, 40010), s = Ep(2, 90), c2 = Ep(1, 40011), s2 = Ep(2, 91);
  EXPECT_EQ(client.Register(1, Role::kClient, c, s), "pending");
  EXPECT_EQ(server.Register(1, Role::kServer, s, c), "pending");
  EXPECT_EQ(client.Register(2, Role::kClient, c2, s2), "pending");
  EXPECT_EQ(server.Register(2, Role::kServer, s2, c2), "pending");
  long long before = Daemon::Number(daemon_.Stats(), "protocol_violations");
  ASSERT_TRUE(client.Shutdown(1, proto::ShutdownHow::kRingEnd));
  EXPECT_EQ(State("client", 40010), "accelerated protocol-error");
  EXPECT_EQ(Daemon::Number(daemon_.Stats(), "protocol_violations"), before + 1);
  EXPECT_EQ(Daemon::Number(daemon_.Stats(), "ring_ends"), 0);
  EXPECT_EQ(State("client", 40011), "accelerated accelerated") << "the other connection is untouched";
}

}  // namespace
}  // namespace vsocket
