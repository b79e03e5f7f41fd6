// The session's protocol logic over the fake transport: negotiation, event
// dispatch and what losing the backend means, with vsocketd's side played
// by the test.
#include "guest/core/session.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "guest/core/direct.h"
#include "guest/core/direct_ring.h"
#include "guest/core/fake_transport.h"
#include "guest/core/fd_table.h"
#include "guest/core/loopback_pair.h"
#include "guest/core/registration.h"
#include "guest/core/resync.h"
#include "guest/core/wait.h"
#include "proto/direct.h"

namespace vsocket::guest {
namespace {

using proto::Message;
using proto::MsgType;
using testing::FakeTransport;

FakeTransport* g_fake = nullptr;
uint64_t g_ack_features = 0;
proto::Reason g_refuse_with = proto::Reason::kNone;

CpuShare g_backend_cpus{};
int g_transports_made = 0;

Result<std::unique_ptr<Transport>> MakeFake() {
  auto t = std::make_unique<FakeTransport>();
  g_fake = t.get();
  g_fake->set_backend_cpus(g_backend_cpus);
  ++g_transports_made;
  g_fake->set_responder([](const Message& m) -> std::optional<Message> {
    switch (m.type) {
      case MsgType::kHello: {
        proto::HelloAck ack;
        ack.features = g_ack_features;
        return Message{MsgType::kHelloAck, 0, ack};
      }
      case MsgType::kUnregister:
        return Message{MsgType::kRegisterAck, 0, proto::RegisterAck{}};
      case MsgType::kRegisterConn: {
        // Refused as vsocketd refuses a pair that would be slower than
        // kernel TCP (kernel-faster).
        proto::RegisterAck ack{std::get<proto::RegisterConn>(m.body).conn_id, proto::WireError::kOk,
                               proto::Reason::kNone, 0};
        if (g_refuse_with != proto::Reason::kNone) {
          ack.status = proto::WireError::kNotPaired;
          ack.reason = g_refuse_with;
        }
        return Message{MsgType::kRegisterAck, 0, ack};
      }
      default: return std::nullopt;
    }
  });
  return std::unique_ptr<Transport>(std::move(t));
}

class SessionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setenv("VSOCKET_SOCKET", "/nonexistent/vsocket-fake.sock", 1);
    setenv("VSOCKET_POLL_US", "0", 1);
    SetTransportFactory(&MakeFake);
  }
  void TearDown() override {
    // A fresh session for the next test (the old one is left behind, as in
    // a fork child).
    Session::DestroyForTesting();
    g_fake = nullptr;
  }
  // Connection `id`, registered, then paired direct (decision 97) with a
  // ring of kDirectRing each way and upgraded; *peer_fd: the pair's memory,
  // which the test maps as the peer's side (1).
  static constexpr uint32_t kDirectRing = 4096;
  std::shared_ptr<Conn> DirectConn(Session* s, uint64_t id, UniqueFd* peer_fd) {
    auto memory = proto::MakeDirectMemory(kDirectRing, id, 99);
    EXPECT_TRUE(memory.ok()) << memory.status().ToString();
    if (!memory.ok()) return nullptr;
    *peer_fd = UniqueFd(dup(memory->get()));
    g_fake->set_direct(std::move(*memory), UniqueFd(eventfd(0, EFD_CLOEXEC)), 0);
    auto c = std::make_shared<Conn>();
    c->id = id;
    EXPECT_TRUE(c->state.Apply(ConnEvent::kRegistered));
    s->Track(c);
    EXPECT_TRUE(g_fake->PostEvent({MsgType::kDirect, 0, proto::ConnCounter{id, 1}}));
    EXPECT_TRUE(g_fake->PostEvent({MsgType::kUpgrade, 0, proto::Upgrade{id, kDirectRing, 16}}));
    s->Drain();
    EXPECT_TRUE(static_cast<bool>(c->direct));
    EXPECT_EQ(c->state.phase(), Phase::kUpgraded);
    return c;
  }
  // A session that takes direct pairs, and connection `id` on it, direct
  // and upgraded (DirectConn), its session set; null on failure.
  std::shared_ptr<Conn> UpWithDirectConn(uint64_t id, UniqueFd* peer_fd) {
    Session* s = Up(proto::kFeatureDirect);
    if (s == nullptr) return nullptr;
    auto c = DirectConn(s, id, peer_fd);
    if (c) c->session = s;
    return c;
  }
  // Switches c's TX onto its (direct) ring and writes `bytes` there, which
  // the peer has not consumed.
  static void SwitchAndWrite(Conn& c, const std::string& bytes) {
    MutexLock tx(c.tx_mu);
    ASSERT_TRUE(SwitchTxLocked(c).ok());
    ASSERT_TRUE(c.state.tx_on_ring());
    for (size_t i = 0; i < bytes.size(); ++i) c.tx[i] = static_cast<uint8_t>(bytes[i]);
    c.tx_tail.store(bytes.size());
  }
  // Our resend written to a (FlushResendLocked), then our FIN: what b reads.
  static std::string ResentOn(Conn& c, int a, int b) {
    {
      MutexLock tx(c.tx_mu);
      EXPECT_TRUE(FlushResendLocked(c, a).ok());
    }
    shutdown(a, SHUT_WR);
    std::string got;
    char buf[64];
    for (ssize_t n; (n = recv(b, buf, sizeof buf, 0)) > 0;) got.append(buf, static_cast<size_t>(n));
    return got;
  }
  // Connection `id`, registered on s and pending (its peer not there yet).
  static std::shared_ptr<Conn> PendingConn(Session* s, uint64_t id) {
    auto c = std::make_shared<Conn>();
    c->id = id;
    c->session = s;
    return s->TrackPending(c) ? c : nullptr;
  }
  // A loopback TCP connection whose end *a the library adopted (as at its
  // accept or connect): the library's connection for it, or null.
  static std::shared_ptr<Conn> AdoptedPair(int* a, int* b) {
    auto [x, y] = testing::LoopbackTcpPair();
    *a = x;
    *b = y;
    if (x < 0) return nullptr;
    Adopt(x, false);
    return Lookup(x);
  }
  // Whether the session sent a REGISTER_CONN among its requests from
  // index `from` on.
  static bool RegisteredSince(size_t from) {
    for (size_t i = from; i < g_fake->requests().size(); ++i)
      if (g_fake->requests()[i].type == MsgType::kRegisterConn) return true;
    return false;
  }
  Session* Up(uint64_t features) {
    g_ack_features = features;
    proto::Reason why{};
    Session* s = Session::Get(&why);
    EXPECT_NE(s, nullptr) << proto::ToString(why);
    return s;
  }
};

TEST_F(SessionTest, HelloOffersFeaturesAndTakesOnlyWhatTheBackendGranted) {
  Session* s = Up(proto::kFeatureNaps | proto::kFeatureBulkHint);
  ASSERT_NE(s, nullptr);
  ASSERT_FALSE(g_fake->requests().empty());
  const Message& hello = g_fake->requests().front();
  ASSERT_EQ(hello.type, MsgType::kHello);
  EXPECT_NE(std::get<proto::Hello>(hello.body).features & proto::kFeatureNaps, 0u);
  EXPECT_TRUE(s->naps());
  EXPECT_TRUE(s->bulk_hint());
  EXPECT_FALSE(s->doorbell());
  EXPECT_FALSE(s->ring_hold());
}

TEST_F(SessionTest, EventsReachTheTrackedConnectionOnly) {
  Session* s = Up(0);
  ASSERT_NE(s, nullptr);
  auto c = std::make_shared<Conn>();
  c->id = 7;
  ASSERT_TRUE(c->state.Apply(ConnEvent::kRegistered));
  s->Track(c);
  ASSERT_TRUE(g_fake->PostEvent({MsgType::kUpgrade, 0, proto::Upgrade{7, 65536, 16}}));
  ASSERT_TRUE(g_fake->PostEvent({MsgType::kRxTail, 0, proto::ConnCounter{7, 1000}}));
  ASSERT_TRUE(g_fake->PostEvent({MsgType::kRxTail, 0, proto::ConnCounter{8, 5000}}));  // not ours
  EXPECT_TRUE(s->Drain());
  EXPECT_EQ(c->state.phase(), Phase::kUpgraded);
  EXPECT_EQ(c->rx_tail.load(), 1000u);
  // A counter never goes back.
  ASSERT_TRUE(g_fake->PostEvent({MsgType::kRxTail, 0, proto::ConnCounter{7, 10}}));
  s->Drain();
  EXPECT_EQ(c->rx_tail.load(), 1000u);
  s->Untrack(7);
}

TEST_F(SessionTest, ALostBackendMovesEveryConnectionOn) {
  Session* s = Up(0);
  ASSERT_NE(s, nullptr);
  auto pending = std::make_shared<Conn>();
  pending->id = 1;
  ASSERT_TRUE(pending->state.Apply(ConnEvent::kRegistered));
  auto upgraded = std::make_shared<Conn>();
  upgraded->id = 2;
  ASSERT_TRUE(upgraded->state.Apply(ConnEvent::kRegistered));
  ASSERT_TRUE(upgraded->state.Apply(ConnEvent::kUpgrade));
  s->Track(pending);
  s->Track(upgraded);
  // Published before it died: 300 bytes landed in the upgraded one's ring.
  ASSERT_TRUE(g_fake->PostEvent({MsgType::kRxTail, 0, proto::ConnCounter{2, 300}}));
  g_fake->KillBackend();
  EXPECT_FALSE(s->CheckBackend());
  EXPECT_FALSE(s->alive());
  EXPECT_EQ(upgraded->state.phase(), Phase::kResyncing);
  EXPECT_EQ(upgraded->resync_landed.load(), 300u);
  EXPECT_TRUE(upgraded->lost_backend.load());
  EXPECT_NE(pending->state.phase(), Phase::kUpgraded);
  EXPECT_EQ(Session::Existing(), nullptr);
}

// A registration racing the session's loss (e2e daemon_restart_grpc_auto:
// one left pending on a dead session, its reader spinning): made pending
// under the session lock, it is either moved on by BackendLost or refused
// because BackendLost came first, never left pending.
TEST_F(SessionTest, ARegistrationNeverStaysPendingOnALostSession) {
  Session* s = Up(0);
  ASSERT_NE(s, nullptr);
  auto before = std::make_shared<Conn>();
  before->id = 1;
  ASSERT_TRUE(s->TrackPending(before));
  EXPECT_EQ(before->state.phase(), Phase::kPending);
  g_fake->KillBackend();
  EXPECT_FALSE(s->CheckBackend());
  EXPECT_EQ(before->state.phase(), Phase::kUnprobed) << "moved on by BackendLost";
  auto after = std::make_shared<Conn>();
  after->id = 2;
  EXPECT_FALSE(s->TrackPending(after));
  EXPECT_EQ(after->state.phase(), Phase::kUnprobed) << "refused: never pending";
}

// A lost session's memory goes back once no connection of it reads or
// resends from its rings (issue 36: every VM migration, like every vsocketd
// restart, left each process its old region until it exited, 8 huge pages
// per move in a VM, and a VM moved three times stopped re-accelerating).
// A connection that was upgraded resyncs from its rings: the memory stays
// until it has left them (here: closed, as Teardown ends it).
TEST_F(SessionTest, ALostSessionGivesItsMemoryBackOnceItsConnectionsLeftTheRings) {
  Session* s = Up(0);
  ASSERT_NE(s, nullptr);
  FakeTransport* fake = g_fake;
  auto pending = PendingConn(s, 1);
  ASSERT_TRUE(pending);
  auto upgraded = std::make_shared<Conn>();
  upgraded->id = 2;
  upgraded->session = s;
  ASSERT_TRUE(upgraded->state.Apply(ConnEvent::kRegistered));
  ASSERT_TRUE(upgraded->state.Apply(ConnEvent::kUpgrade));
  s->Track(upgraded);
  fake->KillBackend();
  EXPECT_FALSE(s->CheckBackend());
  ASSERT_EQ(upgraded->state.phase(), Phase::kResyncing);
  EXPECT_EQ(fake->releases(), 0) << "the resyncing connection may still read its RX ring";
  Unregistered(*upgraded);
  EXPECT_EQ(upgraded->session, nullptr);
  EXPECT_EQ(fake->releases(), 1) << "nothing reads the lost session's rings any more";
  Unregistered(*pending);  // (once only)
  EXPECT_EQ(fake->releases(), 1);
}

// With no connection on its rings when it was lost, the memory goes back
// at once.
TEST_F(SessionTest, ALostSessionWithNothingOnItsRingsGivesItsMemoryBackAtOnce) {
  Session* s = Up(0);
  ASSERT_NE(s, nullptr);
  FakeTransport* fake = g_fake;
  auto pending = PendingConn(s, 1);
  ASSERT_TRUE(pending);
  fake->KillBackend();
  EXPECT_FALSE(s->CheckBackend());
  EXPECT_EQ(pending->state.phase(), Phase::kUnprobed);
  EXPECT_EQ(fake->releases(), 1);
}

// A connection of s, upgraded through the fake, switched over (its FENCE
// posted) with `bytes` in its TX ring (the test's `ring`); the fake takes
// the FENCE from the request queue unless `fence_taken` is false (vsocketd
// died before it read it).
std::shared_ptr<Conn> SwitchedConn(Session* s, uint64_t id, std::vector<uint8_t>& ring, const char* bytes,
                                   bool fence_taken) {
  auto c = std::make_shared<Conn>();
  c->id = id;
  c->session = s;
  EXPECT_TRUE(c->state.Apply(ConnEvent::kRegistered));
  s->Track(c);
  EXPECT_TRUE(g_fake->PostEvent({MsgType::kUpgrade, 0, proto::Upgrade{id, static_cast<uint32_t>(ring.size()), 16}}));
  s->Drain();
  EXPECT_EQ(c->state.phase(), Phase::kUpgraded);
  c->tx = ring.data();
  c->ring_size = static_cast<uint32_t>(ring.size());
  g_fake->set_wedged(!fence_taken);
  {
    MutexLock tx(c->tx_mu);
    EXPECT_TRUE(SwitchTxLocked(*c).ok());
  }
  size_t n = strlen(bytes);
  memcpy(ring.data(), bytes, n);
  c->tx_tail.store(n);
  return c;
}

// Where the backend shares this process's CPUs a connection is held on
// kernel TCP until it streams (decision 51). A forked worker (Apache
// prefork's, PostgreSQL's backends) knows that rule from its parent and
// holds its connections without a session of its own (decision 132):
// before, each worker opened one at its first connection, inside ab's
// window (Apache a connection per request: 0.86-0.88x kernel TCP).
TEST_F(SessionTest, AForkedWorkerHoldsItsConnectionsByItsParentsRuleWithoutASession) {
  g_backend_cpus = CpuShare{2, 2, true};
  ASSERT_NE(Up(0), nullptr);
  g_backend_cpus = CpuShare{};
  ASSERT_TRUE(Session::RegistersStreamsOnly());
  EXPECT_TRUE(Session::PolicyKnown());
  int made = g_transports_made;
  // The worker: a real fork child (the parent's session stays the test's);
  // it exits with the number of the first check that failed, 0 if none.
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    Session::ForgetAfterFork();  // (what the library's fork handler does)
    int failed = 0;
    auto check = [&](bool ok, int n) {
      if (!ok && failed == 0) failed = n;
    };
    check(Session::Existing() == nullptr, 1);
    check(Session::PolicyKnown(), 2);
    int a = -1, b = -1;
    std::shared_ptr<Conn> c = AdoptedPair(&a, &b);
    check(c != nullptr, 3);
    if (c) {
      check(c->held.load(), 4);  // from birth
      EnsureRegistered(a, *c);
      check(c->state.phase() == Phase::kUnprobed, 5);
      check(c->held.load(), 6);
      check(g_transports_made == made, 7);  // no session opened for it
      check(Session::Existing() == nullptr, 8);
      Forget(a, false);
    }
    _exit(failed);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the worker's check " << WEXITSTATUS(status)
                                    << " failed (3-4: held from birth; 5-8: no session opened for it)";
}

// This process's own session lost: the rule is asked for again (a
// connection made then is not held by a backend that may be gone; it
// finds out and says backend-unavailable).
TEST_F(SessionTest, ALostSessionsRuleIsNotTakenForKnown) {
  g_backend_cpus = CpuShare{2, 2, true};
  ASSERT_NE(Up(0), nullptr);
  g_backend_cpus = CpuShare{};
  EXPECT_TRUE(Session::PolicyKnown());
  g_fake->KillBackend();
  Session* s = Session::Existing();
  if (s != nullptr) s->CheckBackend();
  EXPECT_EQ(Session::Existing(), nullptr);
  EXPECT_FALSE(Session::PolicyKnown());
}

// A registration the backend refuses (kernel-faster: every held
// connection across the tcp fabric, or between processes that cannot pair
// directly) leaves the connection on kernel TCP for good and out of the
// session: nothing of the session is on its path any more. It kept its
// session pointer, so epoll never deferred its changes (decision 61):
// redis-benchmark -c 1 across hosts made 5 epoll_ctl and 2 epoll_pwait
// calls per request instead of none and one, 0.90-0.93x kernel TCP.
TEST_F(SessionTest, ARefusedRegistrationLeavesTheConnectionOutOfTheSession) {
  ASSERT_NE(Up(0), nullptr);
  int a = -1, b = -1;
  std::shared_ptr<Conn> c = AdoptedPair(&a, &b);
  ASSERT_NE(c, nullptr);
  g_refuse_with = proto::Reason::kKernelFaster;
  EnsureRegistered(a, *c);
  g_refuse_with = proto::Reason::kNone;
  EXPECT_EQ(c->state.phase(), Phase::kKernel);
  EXPECT_EQ(c->state.reason(), proto::Reason::kKernelFaster);
  EXPECT_EQ(c->session, nullptr);
  EXPECT_TRUE(c->KernelUntilOwnIo());
  Forget(a, false);
  close(a);
  close(b);
}

// The connection ended both ways between the library reading its addresses
// and vsocketd inspecting the socket it proves (e2e grpc_short_channels_auto,
// CI 2026-11-30: a gRPC client's shutdown() from another thread raced its
// poller's registration; the proof found a closed socket, and the
// registration vsocketd then refused was reported spoofed-address). A proof
// refused because the socket is no longer connected registers nothing: the
// connection ended on kernel TCP, and the report says so.
TEST_F(SessionTest, AConnectionOverBeforeItsProofIsNotRegistered) {
  ASSERT_NE(Up(0), nullptr);
  int a = -1, b = -1;
  std::shared_ptr<Conn> c = AdoptedPair(&a, &b);
  ASSERT_NE(c, nullptr);
  size_t before = g_fake->requests().size();
  g_fake->set_prover([b](int fd) {
    // Both ways shut before vsocketd looks: the socket leaves TCP for CLOSE
    // (its 4-tuple goes to a TIME_WAIT of the kernel's own).
    shutdown(fd, SHUT_WR);
    close(b);
    for (int i = 0; i < 2000; ++i) {
      tcp_info info{};
      socklen_t len = sizeof(info);
      if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 && info.tcpi_state == TCP_CLOSE) break;
      usleep(1000);
    }
    return Status(Code::kPermissionDenied, "proof refused: Invalid argument");  // as vsocketd answers
  });
  EnsureRegistered(a, *c);
  g_fake->set_prover(nullptr);
  EXPECT_FALSE(RegisteredSince(before)) << "a registration vsocketd can only refuse";
  EXPECT_EQ(c->state.phase(), Phase::kKernel);
  EXPECT_EQ(c->state.reason(), proto::Reason::kConnectionOver);
  EXPECT_EQ(c->session, nullptr);
  EXPECT_EQ(c->tx, nullptr) << "its rings given back";
  EXPECT_EQ(c->rx, nullptr);
  Forget(a, false);
  close(a);
}

// A proof refused while the socket is still connected (a socket of another
// namespace, say) is vsocketd's to judge: the registration goes out and is
// refused spoofed-address, counted there.
TEST_F(SessionTest, AProofRefusedWhileConnectedStillRegisters) {
  ASSERT_NE(Up(0), nullptr);
  int a = -1, b = -1;
  std::shared_ptr<Conn> c = AdoptedPair(&a, &b);
  ASSERT_NE(c, nullptr);
  size_t before = g_fake->requests().size();
  g_fake->set_prover([](int) { return Status(Code::kPermissionDenied, "proof refused: Invalid cross-device link"); });
  g_refuse_with = proto::Reason::kSpoofedAddress;
  EnsureRegistered(a, *c);
  g_refuse_with = proto::Reason::kNone;
  g_fake->set_prover(nullptr);
  EXPECT_TRUE(RegisteredSince(before));
  EXPECT_EQ(c->state.reason(), proto::Reason::kSpoofedAddress);
  Forget(a, false);
  close(a);
  close(b);
}

// vsocketd died before it took our FENCE from the request queue (e2e
// daemon_restart_grpc_auto, CI 2026-11-30: one gRPC stream of 1,200
// channels reset, both ends logging "fabric link lost before the peer
// confirmed our fence"). The peer cannot have that FENCE, so it reads our
// kernel stream as plain kernel TCP: our ring bytes follow our kernel
// bytes with no RESYNC header, and nothing is reset (decision 124).
TEST_F(SessionTest, AFenceTheBackendNeverTookIsResentWithoutAHeader) {
  Session* s = Up(0);
  ASSERT_NE(s, nullptr);
  auto [a, b] = testing::LoopbackTcpPair();
  ASSERT_GE(a, 0);
  std::vector<uint8_t> ring(4096);
  auto c = SwitchedConn(s, 4, ring, "GET /a", /*fence_taken=*/false);
  g_fake->KillBackend();
  EXPECT_FALSE(s->CheckBackend());
  ASSERT_EQ(c->state.phase(), Phase::kResyncing);
  {
    MutexLock tx(c->tx_mu);
    Status st = FlushResendLocked(*c, a);
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  EXPECT_FALSE(c->state.reset());
  char buf[64];
  ssize_t n = recv(b, buf, sizeof(buf), MSG_DONTWAIT);
  ASSERT_EQ(n, 6) << "the ring bytes, no header";
  EXPECT_EQ(std::string(buf, 6), "GET /a");
  close(a);
  close(b);
}

// A direct pair's FENCE is in the pair's memory as well (the peer reads it
// there, whatever vsocketd took): an untaken request says nothing of it,
// and such a connection is never resent without a header on that account.
TEST_F(SessionTest, ADirectPairsFenceIsNeverTakenForUnread) {
  UniqueFd peer;
  auto c = UpWithDirectConn(6, &peer);
  ASSERT_TRUE(c);
  Session* s = c->session;
  g_fake->set_wedged(true);
  {
    MutexLock tx(c->tx_mu);
    ASSERT_TRUE(SwitchTxLocked(*c).ok());
  }
  g_fake->KillBackend();
  EXPECT_FALSE(s->CheckBackend());
  EXPECT_FALSE(c->fence_unread.load());
}

// Decision 134: a direct pair switched with vsocketd then killed before it
// confirmed our FENCE (no FENCE_DELIVERED, no byte consumed): the FENCE is
// in the pair's memory, which the peer reads before it leaves, so we resend
// after a RESYNC header instead of resetting (decision 124's reset was
// gRPC's "Connection reset by peer" in daemon_restart_grpc_always_x8). And
// the other way round: a peer that left first closed our fence word, so we
// never switch and our kernel stream goes on.
TEST_F(SessionTest, ADirectPairsFenceInItsMemoryIsEnoughForAResyncHeader) {
  UniqueFd peer_fd;
  auto c = UpWithDirectConn(10, &peer_fd);
  ASSERT_TRUE(c);
  Session* s = c->session;
  auto [a, b] = testing::LoopbackTcpPair();
  ASSERT_GE(a, 0);
  g_fake->set_wedged(true);
  SwitchAndWrite(*c, "abcde");
  auto peer = DirectRing::Map(peer_fd.get(), 1);
  ASSERT_TRUE(peer.ok());
  ASSERT_TRUE((*peer)->Attach());  // (it mapped the pair: decision 135)
  uint64_t fence = 99;
  EXPECT_TRUE((*peer)->CloseFence(&fence));  // what the peer finds when it leaves
  EXPECT_EQ(fence, 0u);
  g_fake->KillBackend();
  EXPECT_FALSE(s->CheckBackend());
  std::string got = ResentOn(*c, a, b);
  EXPECT_FALSE(c->state.reset());
  ASSERT_EQ(got.size(), proto::kResyncHeaderSize + 5);
  auto from = proto::DecodeResync(std::span<const uint8_t, proto::kResyncHeaderSize>(
      reinterpret_cast<const uint8_t*>(got.data()), proto::kResyncHeaderSize));
  ASSERT_TRUE(from.ok());
  EXPECT_EQ(*from, 0u);
  EXPECT_EQ(got.substr(proto::kResyncHeaderSize), "abcde");
  close(a);
  close(b);
}

// Decision 135: the same, but the peer never mapped the pair (its fetch
// failed, or had not come yet) when vsocketd went: it reads its kernel
// socket as plain kernel TCP, so our ring stream follows there from byte 0
// with no header, and the peer, mapping late, finds it must not use it.
TEST_F(SessionTest, ADirectPeerThatNeverMappedGetsOurRingStreamWithoutAHeader) {
  UniqueFd peer_fd;
  auto c = UpWithDirectConn(12, &peer_fd);
  ASSERT_TRUE(c);
  Session* s = c->session;
  auto [a, b] = testing::LoopbackTcpPair();
  ASSERT_GE(a, 0);
  g_fake->set_wedged(true);
  SwitchAndWrite(*c, "abcde");
  g_fake->KillBackend();
  EXPECT_FALSE(s->CheckBackend());
  EXPECT_EQ(ResentOn(*c, a, b), "abcde");
  EXPECT_FALSE(c->state.reset());
  auto peer = DirectRing::Map(peer_fd.get(), 1);
  ASSERT_TRUE(peer.ok());
  EXPECT_FALSE((*peer)->Attach());
  close(a);
  close(b);
}

// Decision 135, the side that cannot map: a DIRECT whose memory does not
// come (here the fake has none to give; out of fds in e2e
// direct_fetch_fails) leaves the connection on kernel TCP, withdrawn, and
// tells vsocketd so, which has the peer resend its ring stream.
TEST_F(SessionTest, ADirectPairWeCannotMapIsToldToVsocketd) {
  Session* s = Up(proto::kFeatureDirect | proto::kFeatureDirectResend);
  ASSERT_NE(s, nullptr);
  auto c = std::make_shared<Conn>();
  c->id = 13;
  ASSERT_TRUE(c->state.Apply(ConnEvent::kRegistered));
  s->Track(c);
  size_t from = g_fake->requests().size();
  ASSERT_TRUE(g_fake->PostEvent({MsgType::kDirect, 0, proto::ConnCounter{13, 1}}));
  ASSERT_TRUE(g_fake->PostEvent({MsgType::kUpgrade, 0, proto::Upgrade{13, kDirectRing, 16}}));
  s->Drain();
  EXPECT_FALSE(static_cast<bool>(c->direct));
  EXPECT_EQ(c->state.phase(), Phase::kWithdrawn);  // (its UPGRADE refused: never switched)
  EXPECT_EQ(c->state.reason(), proto::Reason::kDirectUnavailable);
  bool told = false;
  for (size_t i = from; i < g_fake->requests().size(); ++i) {
    const auto* d = std::get_if<proto::Downgrade>(&g_fake->requests()[i].body);
    if (g_fake->requests()[i].type == MsgType::kDowngrade && d != nullptr && d->conn_id == 13 &&
        d->reason == proto::Reason::kDirectUnavailable && d->bytes_received == 0 &&
        d->flags == proto::kDowngradeResendFrom)
      told = true;
  }
  EXPECT_TRUE(told);
}

// Decision 135, the side told: its peer could not map the pair, so what it
// wrote there goes on the kernel socket from byte 0 with no header, and the
// connection stays on kernel TCP (the peer never registers it again).
TEST_F(SessionTest, ADirectPeerThatCouldNotMapIsResentWithoutAHeader) {
  UniqueFd peer_fd;
  auto c = UpWithDirectConn(14, &peer_fd);
  ASSERT_TRUE(c);
  Session* s = c->session;
  auto [a, b] = testing::LoopbackTcpPair();
  ASSERT_GE(a, 0);
  SwitchAndWrite(*c, "vwxyz");
  ASSERT_TRUE(g_fake->PostEvent(
      {MsgType::kDowngrade, 0, proto::Downgrade{14, proto::Reason::kDirectUnavailable, 0, proto::kDowngradeResendFrom}}));
  s->Drain();
  EXPECT_TRUE(c->state.resynced());
  EXPECT_EQ(ResentOn(*c, a, b), "vwxyz");
  close(a);
  close(b);
}

TEST_F(SessionTest, ADirectPeerThatLeftFirstKeepsUsOnKernelTcp) {
  UniqueFd peer_fd;
  auto c = UpWithDirectConn(11, &peer_fd);
  ASSERT_TRUE(c);
  auto peer = DirectRing::Map(peer_fd.get(), 1);
  ASSERT_TRUE(peer.ok());
  uint64_t fence;
  EXPECT_FALSE((*peer)->CloseFence(&fence));
  MutexLock tx(c->tx_mu);
  Status st = SwitchTxLocked(*c);
  EXPECT_EQ(st.code(), Code::kAlreadyExists) << st.ToString();
  EXPECT_FALSE(c->state.tx_on_ring());
}

// Taken but never confirmed (no FENCE_DELIVERED, no credit): the peer may
// or may not have it, so it may or may not wait for a header. The
// connection is reset rather than guessed (an error, never a corrupt
// stream).
TEST_F(SessionTest, AFenceTakenButNeverConfirmedStillResets) {
  Session* s = Up(0);
  ASSERT_NE(s, nullptr);
  auto [a, b] = testing::LoopbackTcpPair();
  ASSERT_GE(a, 0);
  std::vector<uint8_t> ring(4096);
  auto c = SwitchedConn(s, 5, ring, "GET /b", /*fence_taken=*/true);
  g_fake->KillBackend();
  EXPECT_FALSE(s->CheckBackend());
  {
    MutexLock tx(c->tx_mu);
    EXPECT_EQ(FlushResendLocked(*c, a).sys_errno(), ECONNRESET);
  }
  EXPECT_TRUE(c->state.reset());
  close(a);
  close(b);
}

// Two threads on one session, a direct pair (decision 97) read by one of
// them (pgbench -j 2 with every connection direct stalled for good): the
// owner looked at its connection before the peer's bytes came and sleeps
// after; the other thread's last look before sleeping (PrepareSleep) took
// the peer's new count. That thread does not sleep, and the owner must hear
// of it: the peer asked for no wake-up after the owner's look, so nothing
// else would wake it.
TEST_F(SessionTest, ADirectCountTakenBeforeASleepWakesTheOtherWaiters) {
  Session* s = Up(proto::kFeatureDirect);
  ASSERT_NE(s, nullptr);
  UniqueFd peer_fd;
  auto c = DirectConn(s, 7, &peer_fd);
  ASSERT_TRUE(c && c->direct);
  auto peer = DirectRing::Map(peer_fd.get(), 1);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  // The owner (thread B) waits on the session; the peer writes 100 bytes
  // while nobody asked to be woken.
  UniqueFd owner(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  s->AddWaiter(owner.get());
  bool wake;
  (*peer)->PublishFence(0, &wake);
  (*peer)->PublishProduced(100);
  // Thread A's last look before it sleeps takes the count: A stays awake,
  // and B is woken.
  EXPECT_FALSE(s->PrepareSleep());
  EXPECT_EQ(c->rx_tail.load(), 100u);
  pollfd p{owner.get(), POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 1) << "the connection's reader was not woken";
  s->RemoveWaiter(owner.get());
  s->Untrack(7);
}

// Before sleeping, a process asks its direct peers to wake it when they
// write, and when they consume only where something may wait for that: a
// request/response client asked at every sleep was woken twice per round
// trip (the server reading the request, then its answer).
TEST_F(SessionTest, ASleeperAsksForConsumptionOnlyWhereAWriterCouldWait) {
  Session* s = Up(proto::kFeatureDirect);
  ASSERT_NE(s, nullptr);
  UniqueFd peer_fd;
  auto c = DirectConn(s, 7, &peer_fd);
  ASSERT_TRUE(c && c->direct);
  constexpr uint32_t kRing = kDirectRing;
  auto* peer_side = reinterpret_cast<proto::DirectSide*>(
      static_cast<uint8_t*>(mmap(nullptr, 4096, PROT_READ, MAP_SHARED, peer_fd.get(), 0)) + proto::kDirectSideOffset[1]);
  auto asked = [&] { return std::pair{peer_side->want_produced != 0, peer_side->want_consumed != 0}; };
  // Nothing in flight: wake me when you write.
  ArmDirect(*c);
  EXPECT_EQ(asked(), std::pair(true, false));
  EXPECT_FALSE(WaitsForConsumption(*c));
  // A request in flight (100 B of 4 KiB): still only when you write.
  c->tx_tail.store(100);
  EXPECT_FALSE(WaitsForConsumption(*c));
  // Half the ring or more: a writer may soon wait for room.
  c->tx_tail.store(kRing / 2);
  EXPECT_TRUE(WaitsForConsumption(*c));
  ArmDirect(*c);
  EXPECT_EQ(asked(), std::pair(true, true));
  // Leaving the rings (a drain): its wait is for everything consumed.
  c->tx_tail.store(100);
  ASSERT_TRUE(c->state.Apply(ConnEvent::kDrain));
  EXPECT_TRUE(WaitsForConsumption(*c));
  munmap(reinterpret_cast<uint8_t*>(peer_side) - proto::kDirectSideOffset[1], 4096);
  s->Untrack(7);
}

TEST_F(SessionTest, AWedgedBackendTimesOutAndIsNotAnswering) {
  Session* s = Up(0);
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->answering());
  g_fake->set_wedged(true);
  Message resp;
  Status st = s->Call({MsgType::kUnregister, 0, proto::Unregister{9}}, &resp, 20);
  EXPECT_EQ(st.code(), Code::kDeadlineExceeded);
  EXPECT_FALSE(s->answering());
}

// Decision 128: a frontend that gave vsocketd no call eventfd (QEMU, for a
// function whose INTx was disabled as its device started) leaves every
// sleeper to its 1 s timeout. The session counts each such sleep (its
// answer was waiting), and takes three in a row, with no wake-up between
// them, for wake-ups lost for good (logged). Every wait still ends with
// what it waited for.
TEST_F(SessionTest, LostWakeUpsAreCountedAndEveryWaitStillEnds) {
  Session* s = Up(0);
  ASSERT_NE(s, nullptr);
  auto c = std::make_shared<Conn>();
  c->id = 7;
  c->session = s;
  ASSERT_TRUE(c->state.Apply(ConnEvent::kRegistered));
  ASSERT_TRUE(c->state.Apply(ConnEvent::kUpgrade));
  s->Track(c);
  uint64_t tail = 0;
  // One receive's wait: the backend publishes 100 more bytes 200 ms into
  // it, with or without the call.
  auto wait_for_bytes = [&](bool lost) {
    g_fake->set_calls_lost(lost);
    tail += 100;
    std::thread backend([&, t = tail] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      EXPECT_TRUE(g_fake->PostEvent({MsgType::kRxTail, 0, proto::ConnCounter{7, t}}));
    });
    Status st = WaitUntil(*c, [&] { return c->rx_tail.load() >= tail; });
    backend.join();
    return st.ok() && c->rx_tail.load() == tail;
  };
  EXPECT_TRUE(wait_for_bytes(false));
  EXPECT_EQ(s->missed_wakeups(), 0u) << "a wait its call ended is no lost wake-up";
  EXPECT_TRUE(wait_for_bytes(true));
  EXPECT_TRUE(wait_for_bytes(true));
  EXPECT_EQ(s->missed_wakeups(), 2u);
  EXPECT_FALSE(s->WakeUpsLost());
  EXPECT_TRUE(wait_for_bytes(false));  // woken: the streak ends
  EXPECT_TRUE(wait_for_bytes(true));
  EXPECT_TRUE(wait_for_bytes(true));
  EXPECT_FALSE(s->WakeUpsLost()) << "two in a row since the last wake-up";
  EXPECT_TRUE(wait_for_bytes(true));
  EXPECT_EQ(s->missed_wakeups(), 5u);
  EXPECT_TRUE(s->WakeUpsLost());
  EXPECT_TRUE(s->alive());
  EXPECT_EQ(c->state.phase(), Phase::kUpgraded);
  EXPECT_TRUE(wait_for_bytes(false));
  EXPECT_FALSE(s->WakeUpsLost()) << "a wake-up came again";
}

}  // namespace
}  // namespace vsocket::guest
