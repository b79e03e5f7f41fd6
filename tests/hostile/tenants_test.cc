// Tenants with overlapping addresses (issue 17, finding 4). Tenant IDs
// exist so that tenants may use the same IP addresses; the registry keys
// connections by tenant and 4-tuple, and pairing must look only within the
// tenant. Another tenant registering the mirror of a victim's 4-tuple must
// change nothing for the victim (no DOWNGRADE, still pairable with its real
// peer) and teach the attacker nothing (its own registration is not told
// that another tenant has that tuple).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "proto/control.h"
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

class TenantsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.Start()); }
  void TearDown() override {
    EXPECT_TRUE(daemon_.Alive()) << "vsocketd survived";
    EXPECT_TRUE(daemon_.StopsCleanly()) << "vsocketd exits with status 0 on SIGTERM";
  }
  std::string State(const std::string& vm, uint16_t local_port) { return RegistryState(daemon_, vm, local_port); }

  // Tenant 1: a client VM and a server VM; tenant 2: the attacker, with the
  // same addresses.
  Daemon daemon_{{"client:1,192.0.2.1", "server:1,192.0.2.2", "attacker:2,192.0.2.1;192.0.2.2"}};
};

// The attacker registers the mirror of the victim's pending connection.
TEST_F(TenantsTest, MirrorRegistrationOfAnotherTenantChangesNothing) {
  RawGuest client(daemon_.socket_path("client")), server(daemon_.socket_path("server")),
      attacker(daemon_.socket_path("attacker"));
  Endpoint c = Ep(1, 40000), s = Ep(2, 80);
  EXPECT_EQ(client.Register(1, Role::kClient, c, s), "pending");
  EXPECT_EQ(attacker.Register(1, Role::kServer, s, c), "pending");
  EXPECT_EQ(State("client", 40000), "kernel pending") << "the victim is told nothing";
  EXPECT_EQ(State("attacker", 80), "kernel pending") << "the attacker learns nothing";
  // The victim's real peer comes: they pair.
  EXPECT_EQ(server.Register(1, Role::kServer, s, c), "pending");
  EXPECT_EQ(State("client", 40000), "accelerated accelerated");
  EXPECT_EQ(State("server", 80), "accelerated accelerated");
  EXPECT_EQ(State("attacker", 80), "kernel pending");
}

// The attacker comes first; the victim's pair forms all the same.
TEST_F(TenantsTest, AttackerFirstChangesNothing) {
  RawGuest client(daemon_.socket_path("client")), server(daemon_.socket_path("server")),
      attacker(daemon_.socket_path("attacker"));
  Endpoint c = Ep(1, 40001), s = Ep(2, 81);
  EXPECT_EQ(attacker.Register(1, Role::kClient, c, s), "pending");
  EXPECT_EQ(server.Register(1, Role::kServer, s, c), "pending");
  EXPECT_EQ(State("server", 81), "kernel pending");
  EXPECT_EQ(State("attacker", 40001), "kernel pending");
  EXPECT_EQ(client.Register(1, Role::kClient, c, s), "pending");
  EXPECT_EQ(State("client", 40001), "accelerated accelerated");
  EXPECT_EQ(State("server", 81), "accelerated accelerated");
}

}  // namespace
}  // namespace vsocket
