// A library's own DOWNGRADE requests as vsocketd sees them, against an
// unmodified vsocketd. Before a fork (decision 85): taken only from a
// session that took FORK_RESYNC, for a same-host pair whose peer's session
// took it too, with a count inside what landed in the RX ring. A drain
// because its busy loop went quiet (decision 92): only from a session that
// took MOVE_BACK, reason kernel-faster. Anything else is refused or is a
// violation of that connection alone.
#include <gtest/gtest.h>

#include "tests/hostile/raw_guest.h"
#include "tests/integration/daemon_fixture.h"

namespace vsocket {
namespace {

using proto::Endpoint;
using proto::Reason;
using proto::Role;
using testing::Daemon;
using testing::Ep;
using testing::RawGuest;
using testing::RegistryState;

constexpr uint64_t kFeatures = proto::kFeatureForkResync | proto::kFeatureCleanDowngrade;

class ForkResyncTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.Start()); }
  void TearDown() override {
    EXPECT_TRUE(daemon_.Alive()) << "vsocketd survived";
    EXPECT_TRUE(daemon_.StopsCleanly()) << "vsocketd exits with status 0 on SIGTERM";
  }
  std::string State(const std::string& vm, uint16_t port) { return RegistryState(daemon_, vm, port); }
  long long Counter(const char* name) { return Daemon::Number(daemon_.Stats(), name); }

  // Two paired connections (ids 1 and 2 on each side), the client having
  // written 1,000 bytes into connection 1's TX ring.
  void Pair(RawGuest& client, RawGuest& server, uint16_t base) {
    c1_ = Ep(1, base), s1_ = Ep(2, 80), c2_ = Ep(1, base + 1), s2_ = Ep(2, 81);
    ASSERT_EQ(client.Register(1, Role::kClient, c1_, s1_), "pending");
    ASSERT_EQ(server.Register(1, Role::kServer, s1_, c1_), "pending");
    ASSERT_EQ(client.Register(2, Role::kClient, c2_, s2_), "pending");
    ASSERT_EQ(server.Register(2, Role::kServer, s2_, c2_), "pending");
    ASSERT_TRUE(client.FenceAndWrite(1, 1000));
    ASSERT_EQ(State("server", 80), "accelerated accelerated");
  }

  Daemon daemon_{{"client:1,192.0.2.1", "server:1,192.0.2.2"}};
  Endpoint c1_, s1_, c2_, s2_;
};

TEST_F(ForkResyncTest, APairLeavesTheRingsAndTheCountsSayHowMany) {
  RawGuest client(daemon_.socket_path("client")), server(daemon_.socket_path("server"));
  ASSERT_TRUE(client.ok() && server.ok()) << client.error() << server.error();
  ASSERT_EQ(client.Hello(kFeatures) & proto::kFeatureForkResync, proto::kFeatureForkResync);
  ASSERT_EQ(server.Hello(kFeatures) & proto::kFeatureForkResync, proto::kFeatureForkResync);
  Pair(client, server, 41000);
  long long before = Counter("fork_resyncs");
  // The server's application read 300 of the 1,000 bytes when it forked.
  EXPECT_EQ(server.Downgrade(1, Reason::kForked, 300, proto::kDowngradeResendFrom), "ok forked");
  EXPECT_EQ(Counter("fork_resyncs"), before + 1);
  EXPECT_EQ(State("server", 80), "accelerated forked");
  EXPECT_EQ(State("client", 41000), "accelerated forked") << "the peer is told why";
  // Once out, a second one finds no peer: refused, nothing else happens.
  EXPECT_EQ(client.Downgrade(1, Reason::kForked, 0, proto::kDowngradeResendFrom), "NOT_PAIRED forked");
  EXPECT_EQ(State("server", 81), "accelerated accelerated") << "the other connection is untouched";
  EXPECT_EQ(server.Unregister(1), "accelerated");  // (reason none: the rings are ours again)
  EXPECT_EQ(client.Unregister(1), "accelerated");
}

TEST_F(ForkResyncTest, ACountBeyondWhatLandedResetsOnlyThatConnection) {
  RawGuest client(daemon_.socket_path("client")), server(daemon_.socket_path("server"));
  ASSERT_TRUE(client.ok() && server.ok()) << client.error() << server.error();
  client.Hello(kFeatures);
  server.Hello(kFeatures);
  Pair(client, server, 41010);
  long long violations = Counter("protocol_violations");
  EXPECT_EQ(server.Downgrade(1, Reason::kForked, 1001, proto::kDowngradeResendFrom), "BAD_MESSAGE protocol-error");
  EXPECT_EQ(Counter("protocol_violations"), violations + 1);
  EXPECT_EQ(State("server", 80), "accelerated protocol-error");
  EXPECT_EQ(State("server", 81), "accelerated accelerated") << "the other connection is untouched";
}

// A session that never took the feature (or a DOWNGRADE that is not a
// fork's) is answered with an ERROR; the connection stays as it was.
TEST_F(ForkResyncTest, WithoutTheFeatureItIsABadMessage) {
  RawGuest client(daemon_.socket_path("client")), server(daemon_.socket_path("server"));
  ASSERT_TRUE(client.ok() && server.ok()) << client.error() << server.error();
  Pair(client, server, 41020);
  long long before = Counter("fork_resyncs");
  EXPECT_EQ(server.Downgrade(1, Reason::kForked, 0, proto::kDowngradeResendFrom), "error");
  EXPECT_EQ(server.Downgrade(1, Reason::kFabricDown, 0, 0), "error");
  EXPECT_EQ(Counter("fork_resyncs"), before);
  EXPECT_EQ(State("server", 80), "accelerated accelerated");
}

// The peer's session did not take the feature: its library could not
// resend, so the request is refused and the pair stays on the rings.
TEST_F(ForkResyncTest, APeerWhoseLibraryCannotResendIsRefused) {
  RawGuest client(daemon_.socket_path("client")), server(daemon_.socket_path("server"));
  ASSERT_TRUE(client.ok() && server.ok()) << client.error() << server.error();
  server.Hello(kFeatures);
  Pair(client, server, 41030);
  long long refused = Counter("fork_refused");
  EXPECT_EQ(server.Downgrade(1, Reason::kForked, 0, proto::kDowngradeResendFrom), "NOT_PAIRED forked");
  EXPECT_EQ(Counter("fork_refused"), refused + 1);
  EXPECT_EQ(State("server", 80), "accelerated accelerated");
}

// A session that took MOVE_BACK asks for a drain (reason kernel-faster):
// vsocketd asks that end to leave the rings, as an operator's drain would,
// and counts it; the other connection is untouched.
TEST_F(ForkResyncTest, AMoveBackIsADrainOfThatConnection) {
  RawGuest client(daemon_.socket_path("client")), server(daemon_.socket_path("server"));
  ASSERT_TRUE(client.ok() && server.ok()) << client.error() << server.error();
  uint64_t f = kFeatures | proto::kFeatureMoveBack;
  ASSERT_EQ(client.Hello(f) & proto::kFeatureMoveBack, proto::kFeatureMoveBack);
  server.Hello(f);
  Pair(client, server, 41040);
  long long moved = Counter("moved_back"), asked = Counter("drains_asked");
  EXPECT_EQ(server.Downgrade(1, Reason::kKernelFaster, 0, proto::kDowngradeDrain), "ok kernel-faster");
  EXPECT_EQ(Counter("moved_back"), moved + 1);
  EXPECT_EQ(Counter("drains_asked"), asked + 1);
  // Asked once: a second request finds it draining already.
  EXPECT_EQ(server.Downgrade(1, Reason::kKernelFaster, 0, proto::kDowngradeDrain), "NOT_PAIRED kernel-faster");
  EXPECT_EQ(State("server", 81), "accelerated accelerated") << "the other connection is untouched";
}

// Without the feature, or with another reason (a guest may not drain a
// connection as the operator or for a migration), it is an ERROR.
TEST_F(ForkResyncTest, AMoveBackWithoutTheFeatureOrForAnotherReasonIsABadMessage) {
  RawGuest client(daemon_.socket_path("client")), server(daemon_.socket_path("server"));
  ASSERT_TRUE(client.ok() && server.ok()) << client.error() << server.error();
  server.Hello(kFeatures);  // no MOVE_BACK
  Pair(client, server, 41050);
  long long asked = Counter("drains_asked");
  EXPECT_EQ(server.Downgrade(1, Reason::kKernelFaster, 0, proto::kDowngradeDrain), "error");
  EXPECT_EQ(client.Downgrade(1, Reason::kOperator, 0, proto::kDowngradeDrain), "error");
  EXPECT_EQ(Counter("drains_asked"), asked);
  EXPECT_EQ(State("server", 80), "accelerated accelerated");
}

}  // namespace
}  // namespace vsocket
