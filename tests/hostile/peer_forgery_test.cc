// Forged frames from an authenticated peer host (issue 17, finding 7).
//
// The test is the peer host: a configured peer with a certificate of the
// daemon's CA (RoguePeer), so the daemon under test pairs its guests'
// connections with it, and then it lies. What a peer says is checked before
// it is used: a pairing window that is not a ring size refuses the pairing;
// a PAIR_REJECT or DOWNGRADE reason outside the valid set reads as
// protocol-error; a second FENCE in one pairing, a RELEASE of a connection
// neither side left, DATA outside the credit window or a CREDIT for bytes
// never sent resets that connection only (our guest: DOWNGRADE
// protocol-error, which the library turns into ECONNRESET; the peer: ABORT);
// a frame naming another tenant's connection or an unknown one is dropped.
// Every case keeps a well-behaved connection beside the attacked one and
// checks that bytes still land in its ring, and that vsocketd survives.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <fstream>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "proto/control.h"
#include "proto/fabric.h"
#include "tests/hostile/raw_guest.h"
#include "tests/hostile/rogue_peer.h"
#include "tests/integration/daemon_fixture.h"

#include "tests/hostile/peer_fixture.h"

namespace vsocket {
namespace {

using proto::FrameHeader;
using proto::FrameType;
using proto::Role;
using testing::Conn;
using testing::Daemon;
using testing::Ep;
using testing::Frame;
using testing::Is;
using testing::kRing;
using testing::kServerPort;
using testing::PairInfoPayload;
using testing::PeerFrame;
using testing::RawGuest;
using testing::RoguePeer;
using vsocket::UniqueFd;
using PeerForgeryTest = testing::PeerHostTest;

// Case 1: the rogue accepts our PAIR_REQUEST but grants a window that is no
// ring size. Unchecked, our guest was upgraded with that window (3 bytes, or
// 2 GiB it would write into).
TEST_F(PeerForgeryTest, PairAcceptWithAWindowThatIsNotARingSizeIsRefused) {
  Conn good = Paired(*guest_, 1, 40000);
  long long violations = Counter("fabric_violations");
  const uint32_t kBad[] = {3, 0, 1u << 31, kRing + 1};
  std::vector<Conn> refused;
  for (uint32_t window : kBad) {
    Conn c = Request(*guest_, 1, static_cast<uint16_t>(40001 + refused.size()));
    Accept(c, window);
    // The daemon withdraws (PAIR_CANCEL naming the rogue's handle, then ours)
    // and leaves its guest on kernel TCP, told why.
    auto cancel = rogue_.AwaitControl(
        [&](const PeerFrame& f) { return f.h.type == FrameType::kPairCancel && f.h.handle == c.theirs; });
    EXPECT_TRUE(cancel) << "window " << window;
    if (cancel) EXPECT_EQ(cancel->h.value, c.mine);
    EXPECT_EQ(WaitState("client", c.port, "kernel protocol-error"), "kernel protocol-error") << "window " << window;
    // Never paired: a link frame cannot upgrade it either.
    EXPECT_TRUE(rogue_.SendLink(Frame(FrameType::kPairConfirm, 1, c.mine)));
    refused.push_back(c);
  }
  EXPECT_EQ(Counter("fabric_violations"), violations + 4);
  ExpectUntouched(good, "the paired connection beside them");
  for (const Conn& c : refused) EXPECT_EQ(State(c), "kernel protocol-error") << "port " << c.port;
}

// Case 1, the other direction: the rogue asks to pair with our guest's
// server connection and names a window that is no ring size. Unchecked, the
// daemon accepted (and would have written up to that window).
TEST_F(PeerForgeryTest, PairRequestWithAWindowThatIsNotARingSizeIsRejected) {
  Conn good = Paired(*guest_, 1, 40100);
  long long refused = Counter("pair_refused");
  const uint32_t kBad[] = {3, 0, 1u << 31};
  for (size_t i = 0; i < std::size(kBad); ++i) {
    uint16_t port = static_cast<uint16_t>(41000 + i);
    uint64_t theirs = 9000 + i;
    ASSERT_EQ(guest_->Register(port, Role::kServer, Ep(1, kServerPort), Ep(2, port)), "pending");
    std::vector<uint8_t> info = PairInfoPayload(Ep(2, port), Ep(1, kServerPort), Role::kClient);
    ASSERT_TRUE(rogue_.SendControl(Frame(FrameType::kPairRequest, 1, 0, theirs, kBad[i]), info));
    auto answer = rogue_.AwaitControl([&](const PeerFrame& f) {
      return (f.h.type == FrameType::kPairReject || f.h.type == FrameType::kPairAccept) && f.h.handle == theirs;
    });
    ASSERT_TRUE(answer) << "window " << kBad[i] << ": no answer " << rogue_.error();
    EXPECT_STREQ(proto::ToString(answer->h.type), "PAIR_REJECT") << "window " << kBad[i];
    EXPECT_EQ(answer->h.aux, static_cast<uint32_t>(proto::Reason::kProtocolError)) << "window " << kBad[i];
    EXPECT_EQ(WaitState("client", kServerPort, "kernel pending", port), "kernel pending") << "window " << kBad[i];
  }
  EXPECT_EQ(Counter("pair_refused"), refused + 3);
  // The registration itself was never at fault: asked properly, it pairs.
  std::vector<uint8_t> info = PairInfoPayload(Ep(2, 41000), Ep(1, kServerPort), Role::kClient);
  ASSERT_TRUE(rogue_.SendControl(Frame(FrameType::kPairRequest, 1, 0, 9100, kRing), info));
  auto accept = rogue_.AwaitControl(Is(FrameType::kPairAccept, 9100));
  ASSERT_TRUE(accept) << rogue_.error();
  EXPECT_EQ(accept->h.aux, kRing);
  ASSERT_TRUE(rogue_.SendLink(Frame(FrameType::kPairConfirm, 1, accept->h.value)));
  EXPECT_EQ(WaitState("client", kServerPort, "accelerated accelerated", 41000), "accelerated accelerated");
  ExpectUntouched(good, "the paired connection beside them");
}

// Decision 63: PAIR_DECLINE, the peer host's word that its side of a
// connection stays on kernel TCP. Believed only for an address the peer runs
// (a forged one is ignored and counted: the registration still pairs), and
// only for a registration still waiting for its peer; one that comes before
// the registration answers it at once.
TEST_F(PeerForgeryTest, PairDeclineOnlyForWhatThePeerRunsAndOnlyForWaitingRegistrations) {
  Conn good = Paired(*guest_, 1, 40200);
  const uint32_t faster = static_cast<uint32_t>(proto::Reason::kKernelFaster);
  long long refused = Counter("pair_refused"), heard = Counter("pair_declines_received");
  // Our server connection from 192.0.2.2:42000 waits for its peer.
  ASSERT_EQ(guest_->Register(42000, Role::kServer, Ep(1, kServerPort), Ep(2, 42000)), "pending");
  // Forged: the rogue speaks for an address it does not run (ours).
  ASSERT_TRUE(rogue_.SendControl(Frame(FrameType::kPairDecline, 1, 0, 0, faster),
                                 PairInfoPayload(Ep(1, 42000), Ep(1, kServerPort), Role::kClient)));
  // Another tenant's address of the rogue: not tenant 1's connection either.
  ASSERT_TRUE(rogue_.SendControl(Frame(FrameType::kPairDecline, 2, 0, 0, faster),
                                 PairInfoPayload(Ep(2, 42000), Ep(1, kServerPort), Role::kClient)));
  // Control frames are applied in order: this request was looked at after them.
  ASSERT_TRUE(rogue_.SendControl(Frame(FrameType::kPairRequest, 1, 0, 9200, kRing),
                                 PairInfoPayload(Ep(2, 42000), Ep(1, kServerPort), Role::kClient)));
  auto accept = rogue_.AwaitControl(Is(FrameType::kPairAccept, 9200));
  ASSERT_TRUE(accept) << "a forged decline stopped the pairing " << rogue_.error();
  ASSERT_TRUE(rogue_.SendLink(Frame(FrameType::kPairConfirm, 1, accept->h.value)));
  EXPECT_EQ(WaitState("client", kServerPort, "accelerated accelerated", 42000), "accelerated accelerated");
  EXPECT_EQ(Counter("pair_refused"), refused + 1) << "the forged decline is counted";
  // Genuine, for a registration that waits: it stops waiting (DOWNGRADE).
  ASSERT_EQ(guest_->Register(42001, Role::kServer, Ep(1, kServerPort), Ep(2, 42001)), "pending");
  ASSERT_TRUE(rogue_.SendControl(Frame(FrameType::kPairDecline, 1, 0, 0, faster),
                                 PairInfoPayload(Ep(2, 42001), Ep(1, kServerPort), Role::kClient)));
  EXPECT_EQ(WaitState("client", kServerPort, "kernel kernel-faster", 42001), "kernel kernel-faster");
  // Genuine, before the registration: the registration is answered at once,
  // and only that one (the next with the same 4-tuple is a new connection).
  ASSERT_TRUE(rogue_.SendControl(Frame(FrameType::kPairDecline, 1, 0, 0, faster),
                                 PairInfoPayload(Ep(2, 42002), Ep(1, kServerPort), Role::kClient)));
  for (int i = 0; i < 50 && Counter("pair_declines_received") < heard + 4; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(Counter("pair_declines_received"), heard + 4);
  EXPECT_EQ(guest_->Register(42002, Role::kServer, Ep(1, kServerPort), Ep(2, 42002)), "kernel-faster");
  EXPECT_EQ(guest_->Register(42003, Role::kServer, Ep(1, kServerPort), Ep(2, 42002)), "pending");
  ExpectUntouched(good, "the paired connection beside them");
}

// Case 2: reasons a peer may not give for leaving ("accelerated", "pending",
// "rings-held"). Unchecked, a rejected guest read "accelerated" while on
// kernel TCP, or "pending" and waited for a pairing that would never come.
TEST_F(PeerForgeryTest, RejectOrDowngradeReasonOutsideTheValidSetReadsAsProtocolError) {
  Conn good = Paired(*guest_, 1, 40200);
  const proto::Reason kInvalid[] = {proto::Reason::kNone, proto::Reason::kPending, proto::Reason::kRingsHeld};
  uint16_t port = 40201;
  for (proto::Reason r : kInvalid) {
    Conn c = Request(*guest_, 1, port++);
    ASSERT_TRUE(rogue_.SendControl(Frame(FrameType::kPairReject, 1, c.mine, 0, static_cast<uint32_t>(r))));
    EXPECT_EQ(WaitState("client", c.port, "kernel protocol-error"), "kernel protocol-error")
        << "PAIR_REJECT " << proto::ToString(r);
  }
  for (proto::Reason r : kInvalid) {
    Conn c = Paired(*guest_, 1, port++);
    ASSERT_TRUE(rogue_.SendLink(Frame(FrameType::kDowngrade, 1, c.mine, 0, static_cast<uint32_t>(r))));
    EXPECT_EQ(WaitState("client", c.port, "accelerated protocol-error"), "accelerated protocol-error")
        << "DOWNGRADE " << proto::ToString(r);
  }
  // Valid reasons pass as given.
  Conn rejected = Request(*guest_, 1, port++);
  ASSERT_TRUE(rogue_.SendControl(
      Frame(FrameType::kPairReject, 1, rejected.mine, 0, static_cast<uint32_t>(proto::Reason::kPeerNotRegistered))));
  EXPECT_EQ(WaitState("client", rejected.port, "kernel peer-not-registered"), "kernel peer-not-registered");
  Conn downgraded = Paired(*guest_, 1, port++);
  ASSERT_TRUE(rogue_.SendLink(
      Frame(FrameType::kDowngrade, 1, downgraded.mine, 0, static_cast<uint32_t>(proto::Reason::kFabricDown))));
  EXPECT_EQ(WaitState("client", downgraded.port, "accelerated fabric-down"), "accelerated fabric-down");
  ExpectUntouched(good, "the paired connection beside them");
}

// A reason code beyond every known one does not parse: the link is torn
// down (docs/multi-host.md "Trust": a frame that does not parse tears the
// link down), its connections go back to kernel TCP, the daemon stays up.
TEST_F(PeerForgeryTest, UnknownReasonCodeTearsTheLinkDown) {
  Conn c = Paired(*guest_, 1, 40300);
  ASSERT_TRUE(rogue_.SendLink(Frame(FrameType::kDowngrade, 1, c.mine, 0, proto::kMaxReason + 1)));
  EXPECT_TRUE(rogue_.LinkClosedWithin(std::chrono::milliseconds(5000))) << "the daemon closes the link";
  EXPECT_EQ(WaitState("client", c.port, "accelerated fabric-down"), "accelerated fabric-down");
  EXPECT_EQ(Counter("fabric_downgrades"), 1);
}

// Case 3: one pairing, one FENCE. Unchecked, a second FENCE moved the point
// where our guest's reader switches from the kernel stream to the ring.
TEST_F(PeerForgeryTest, SecondFenceResetsOnlyThatConnection) {
  Conn victim = Paired(*guest_, 1, 40400), good = Paired(*guest_, 1, 40401);
  ASSERT_TRUE(rogue_.SendLink(Frame(FrameType::kFence, 1, victim.mine, 0)));
  ASSERT_TRUE(rogue_.SendLink(Frame(FrameType::kFence, 1, good.mine, 0)));
  ASSERT_TRUE(Deliver(good, 100, 0x11));
  long long violations = Counter("fabric_violations"), protocol = Counter("protocol_violations");
  EXPECT_EQ(State(victim), "accelerated accelerated") << "the first FENCE is the peer's right";
  ASSERT_TRUE(rogue_.SendLink(Frame(FrameType::kFence, 1, victim.mine, 1234)));
  ExpectReset(victim, "second FENCE");
  EXPECT_EQ(Counter("fabric_violations"), violations + 1);
  EXPECT_EQ(Counter("protocol_violations"), protocol + 1);
  ExpectUntouched(good, "the other connection on the link");
}

// Case 4: RELEASE is the peer forgetting a connection after one side left.
// Unchecked, a RELEASE under a live connection stranded our guest upgraded,
// with nobody to send it anything (the application hung).
TEST_F(PeerForgeryTest, ReleaseOfAConnectionNeitherSideLeftResetsIt) {
  Conn victim = Paired(*guest_, 1, 40500), left = Paired(*guest_, 1, 40501), good = Paired(*guest_, 1, 40502);
  long long violations = Counter("fabric_violations");
  ASSERT_TRUE(rogue_.SendLink(Frame(FrameType::kRelease, 1, victim.mine)));
  ExpectReset(victim, "RELEASE of a live connection");
  EXPECT_EQ(Counter("fabric_violations"), violations + 1);
  // The legitimate order (the peer's side left, then it forgets the
  // connection) is no violation.
  ASSERT_TRUE(rogue_.SendLink(
      Frame(FrameType::kDowngrade, 1, left.mine, 0, static_cast<uint32_t>(proto::Reason::kPeerDowngraded))));
  ASSERT_TRUE(rogue_.SendLink(Frame(FrameType::kRelease, 1, left.mine)));
  ExpectUntouched(good, "the other connection on the link");
  EXPECT_EQ(State(left), "accelerated peer-downgraded");
  EXPECT_FALSE(rogue_.AwaitLink(Is(FrameType::kAbort, left.theirs), std::chrono::milliseconds(100)));
  EXPECT_EQ(Counter("fabric_violations"), violations + 1);
}

// Case 5: DATA beyond the window our guest granted, DATA at a stream
// position that is not the RX tail, a CREDIT for bytes never sent.
TEST_F(PeerForgeryTest, DataOutsideTheCreditWindowResetsTheConnection) {
  Conn full = Paired(*guest_, 1, 40600), skew = Paired(*guest_, 1, 40601), credit = Paired(*guest_, 1, 40602),
       good = Paired(*guest_, 1, 40603);
  long long violations = Counter("fabric_violations");
  // Our guest reads nothing: one ring's worth fills the window.
  ASSERT_TRUE(Deliver(full, kRing, 0x21));
  std::vector<uint8_t> one(1, 0x99);
  ASSERT_TRUE(rogue_.SendLink(Frame(FrameType::kData, 1, full.mine, full.rx_tail), one));
  ExpectReset(full, "DATA beyond the window");
  EXPECT_EQ(full.rx[0], 0x21) << "the excess byte wrapped over unread data";
  std::vector<uint8_t> some(100, 0x99);
  ASSERT_TRUE(rogue_.SendLink(Frame(FrameType::kData, 1, skew.mine, 4096), some));
  ExpectReset(skew, "DATA away from the RX tail");
  EXPECT_EQ(skew.rx[4096], 0) << "bytes placed where the stream is not";
  ASSERT_TRUE(rogue_.SendLink(Frame(FrameType::kCredit, 1, credit.mine, 1)));
  ExpectReset(credit, "CREDIT for bytes never sent");
  EXPECT_EQ(Counter("fabric_violations"), violations + 3);
  ExpectUntouched(good, "the other connection on the link");
}

// Case 5: frames for a connection the rogue does not share with us: another
// tenant's (the same addresses, tenant 2) or an unknown handle. Dropped and
// counted; the other tenant's connection never hears of them.
TEST_F(PeerForgeryTest, FramesForAnotherTenantsOrUnknownConnectionsAreDropped) {
  RawGuest other(daemon_->socket_path("other"));
  ASSERT_TRUE(other.ok()) << other.error();
  Conn neighbour = Paired(other, 2, 40700), good = Paired(*guest_, 1, 40701);
  long long cross = Counter("frames_cross_tenant"), dropped = Counter("frames_dropped"),
            violations = Counter("fabric_violations");
  std::vector<uint8_t> some(100, 0x99);
  // Tenant 1's frames naming tenant 2's connection.
  ASSERT_TRUE(rogue_.SendLink(Frame(FrameType::kData, 1, neighbour.mine, 0), some));
  ASSERT_TRUE(rogue_.SendLink(Frame(FrameType::kAbort, 1, neighbour.mine)));
  ASSERT_TRUE(rogue_.SendLink(Frame(FrameType::kRelease, 1, neighbour.mine)));
  // A handle the daemon never gave out.
  ASSERT_TRUE(rogue_.SendLink(Frame(FrameType::kData, 1, 0xdead0000, 0), some));
  ASSERT_TRUE(rogue_.SendLink(Frame(FrameType::kAbort, 1, 0xdead0000)));
  ExpectUntouched(good, "tenant 1's connection");
  EXPECT_EQ(Counter("frames_cross_tenant"), cross + 3);
  EXPECT_EQ(Counter("frames_dropped"), dropped + 5);
  EXPECT_EQ(Counter("fabric_violations"), violations);
  EXPECT_EQ(neighbour.rx[0], 0) << "another tenant's bytes landed in tenant 2's ring";
  EXPECT_EQ(State(neighbour), "accelerated accelerated");
  EXPECT_TRUE(Deliver(neighbour, 100, 0x22)) << "tenant 2's connection still carries its own bytes";
}

// Case 5, pairing frames: a PAIR_REJECT or PAIR_CANCEL that names another
// tenant's connection (the rogue hosts both tenants: it is asked to pair
// tenant 2's connection, then speaks for tenant 1 about it). Dropped and
// counted like the link frames above; tenant 2's connection pairs and stays
// paired as if nothing had been said.
TEST_F(PeerForgeryTest, PairingFramesNamingAnotherTenantsConnectionAreDropped) {
  RawGuest other(daemon_->socket_path("other"));
  ASSERT_TRUE(other.ok()) << other.error();
  long long cross = Counter("frames_cross_tenant");
  Conn asked = Request(other, 2, 40710);
  ASSERT_TRUE(rogue_.SendControl(
      Frame(FrameType::kPairReject, 1, asked.mine, 0, static_cast<uint32_t>(proto::Reason::kPeerNotRegistered))));
  ASSERT_TRUE(rogue_.SendControl(Frame(FrameType::kPairCancel, 1, asked.mine, asked.theirs)));
  // Control frames are applied in order: once the accept pairs it, the two
  // before it were looked at.
  Accept(asked, kRing);
  EXPECT_TRUE(rogue_.AwaitLink(Is(FrameType::kPairConfirm, asked.theirs))) << rogue_.error();
  EXPECT_EQ(WaitState("other", asked.port, "accelerated accelerated"), "accelerated accelerated")
      << "tenant 1's PAIR_REJECT or PAIR_CANCEL reached tenant 2's connection";
  ASSERT_TRUE(rogue_.SendControl(Frame(FrameType::kPairCancel, 1, asked.mine, asked.theirs)));
  EXPECT_TRUE(Deliver(asked, 100, 0x33)) << "tenant 2's connection still carries its bytes";
  EXPECT_EQ(State(asked), "accelerated accelerated");
  EXPECT_EQ(Counter("frames_cross_tenant"), cross + 3);
}

// Handshake flood (issue 17, finding 6): anyone who reaches peer_listen
// can open connections that start TLS and then stall. The daemon used to keep
// 64 half-open connections in all, on the worker, and close every new one
// beyond them: 300 stalled connections from one address (127.0.0.2) shut the
// real peer out until they timed out. Now half-open connections are bounded
// per address (8) and in all (256), handshakes run on a thread of their own
// ("vsocketd-tls"), and the peer (from 127.0.0.1) connects through the flood.
TEST_F(PeerForgeryTest, HandshakeFloodFromOneAddressLeavesRoomForThePeer) {
  Conn before = Paired(*guest_, 1, 40800);
  std::vector<UniqueFd> flood;
  sockaddr_in src{}, dst{};
  src.sin_family = dst.sin_family = AF_INET;
  src.sin_addr.s_addr = htonl(0x7F000002);  // 127.0.0.2
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  dst.sin_port = htons(static_cast<uint16_t>(rogue_.listen_port()));
  // Non-blocking: the 300 are open within a few milliseconds, long before
  // the setup timeout (5 s) would free a slot.
  for (int i = 0; i < 300; ++i) {
    UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(fd.valid());
    ASSERT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&src), sizeof(src)), 0) << strerror(errno);
    if (connect(fd.get(), reinterpret_cast<sockaddr*>(&dst), sizeof(dst)) != 0 && errno != EINPROGRESS) continue;
    flood.push_back(std::move(fd));
  }
  const uint8_t tls_record = 0x16;  // the first byte of a TLS handshake record, then nothing
  std::vector<bool> sent(flood.size(), false);
  size_t said = 0;
  for (int round = 0; round < 200 && said < flood.size(); ++round) {
    for (size_t i = 0; i < flood.size(); ++i) {
      if (sent[i]) continue;
      pollfd p{flood[i].get(), POLLOUT, 0};
      if (poll(&p, 1, 0) == 1 && (p.revents & POLLOUT) && send(flood[i].get(), &tls_record, 1, MSG_NOSIGNAL) == 1) {
        sent[i] = true;
        ++said;
      }
    }
    if (said < flood.size()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GT(flood.size(), 100u);
  // The real peer connects again while the flood hangs.
  Status st = rogue_.Connect(*daemon_);
  ASSERT_TRUE(st.ok()) << "the peer connects through the flood: " << st.ToString();
  // Counted against the connections that got through the kernel's handshake
  // (said: they took the byte): one whose SYN was dropped is not half-open in
  // vsocketd at all (CI once saw 281 of 300 while 11 still waited for a SYN
  // retransmit).
  const long long expect_busy = static_cast<long long>(said) - 8;
  long long busy = 0;
  for (int i = 0; i < 250 && busy < expect_busy; ++i) {
    busy = Daemon::Number(daemon_->Stats(), "refused_busy", "\"peering\"");
    if (busy < expect_busy) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GT(said, 100u) << "the flood reached vsocketd";
  EXPECT_GE(busy, expect_busy) << "all but 8 of one address's half-open connections shed (" << said << " took the byte)";
  EXPECT_EQ(WaitState("client", before.port, "accelerated fabric-down"), "accelerated fabric-down")
      << "(the reconnection ended the old session)";
  Conn after = Paired(*guest_, 1, 40801);
  EXPECT_TRUE(Deliver(after, 1000, NextFill())) << "bytes land on the new session";
  // The handshakes ran on their own thread, not the data path's worker.
  bool tls_thread = false;
  std::string task_dir = "/proc/" + std::to_string(daemon_->pid()) + "/task";
  if (DIR* d = opendir(task_dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::ifstream comm(task_dir + "/" + e->d_name + "/comm");
      std::string name;
      if (comm && std::getline(comm, name) && name == "vsocketd-tls") tls_thread = true;
    }
    closedir(d);
  }
  EXPECT_TRUE(tls_thread) << "vsocketd has a thread vsocketd-tls";
}

// Revocation (issue 17, finding 8): vsocketd re-reads tls_crl when the file
// changes and cuts the link of a peer whose certificate it now lists; the
// peer's next try is refused. The case has its own certificates: it revokes
// the rogue's.
class RevokedPeerTest : public PeerForgeryTest {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vsocket-crl-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    Status st = RoguePeer::MakeCertificates(dir_);
    ASSERT_TRUE(st.ok()) << st.ToString();
    st = RoguePeer::MakeCrl(dir_);  // revokes nothing yet
    ASSERT_TRUE(st.ok()) << st.ToString();
    PeerForgeryTest::SetUp();
  }
  void TearDown() override {
    PeerForgeryTest::TearDown();
    std::string cmd = "rm -rf '" + dir_ + "'";
    (void)!std::system(cmd.c_str());
  }
  std::string CertsDir() override { return dir_; }
  std::string Crl() override { return dir_ + "/ca.crl"; }
  std::string dir_;
};

TEST_F(RevokedPeerTest, RevokingThePeersCertificateCutsItsLinkAndRefusesItsNextTry) {
  Conn c = Paired(*guest_, 1, 40600);
  Status st = RoguePeer::MakeCrl(dir_, {RoguePeer::kName});
  ASSERT_TRUE(st.ok()) << st.ToString();
  // Looked at every 5 s.
  EXPECT_TRUE(rogue_.LinkClosedWithin(std::chrono::milliseconds(15000))) << "the daemon cuts the link";
  EXPECT_EQ(WaitState("client", c.port, "accelerated fabric-down"), "accelerated fabric-down");
  EXPECT_EQ(Daemon::Number(daemon_->Stats(), "refused_revoked", "\"peering\""), 1);
  // Refused at the handshake (what the rogue hears depends on timing: the
  // alert, or the closed channel; the daemon counts a TLS refusal).
  const long long refused = Daemon::Number(daemon_->Stats(), "refused_tls", "\"peering\"");
  Status again = rogue_.Connect(*daemon_);
  EXPECT_FALSE(again.ok()) << "a revoked peer connects again";
  long long now = refused;
  for (int i = 0; i < 50 && now == refused; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    now = Daemon::Number(daemon_->Stats(), "refused_tls", "\"peering\"");
  }
  EXPECT_EQ(now, refused + 1) << "the daemon refused the handshake (" << again.ToString() << ")";
}

}  // namespace
}  // namespace vsocket
