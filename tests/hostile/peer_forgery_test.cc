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
#include <gtest/gtest.h>

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

namespace vsocket {
namespace {

using proto::FrameHeader;
using proto::FrameType;
using proto::Role;
using testing::Daemon;
using testing::Ep;
using testing::PairInfoPayload;
using testing::PeerFrame;
using testing::RawGuest;
using testing::RegistryState;
using testing::RoguePeer;

// Every ring of the test, and so the window each side grants.
constexpr uint32_t kRing = 64 * 1024;
// Our guests are 192.0.2.1 (tenants 1 and 2, on the daemon); their peer
// 192.0.2.2:80 runs on the rogue host, says the locator.
constexpr uint16_t kServerPort = 80;

FrameHeader Hdr(FrameType t, uint32_t tenant, uint64_t handle, uint64_t value = 0, uint32_t aux = 0) {
  FrameHeader h;
  h.type = t;
  h.tenant = tenant;
  h.handle = handle;
  h.value = value;
  h.aux = aux;
  return h;
}

RoguePeer::Match Is(FrameType t, uint64_t handle) {
  return [t, handle](const PeerFrame& f) { return f.h.type == t && f.h.handle == handle; };
}

// One connection of a guest of ours whose peer is on the rogue host.
struct Conn {
  uint32_t tenant = 1;
  uint16_t port = 0;      // our guest's local port
  uint64_t mine = 0;      // the daemon's handle: frames from the rogue name it
  uint64_t theirs = 0;    // the rogue's handle: frames from the daemon name it
  uint8_t* rx = nullptr;  // our guest's RX ring (kRing bytes)
  uint64_t rx_tail = 0;   // bytes the rogue delivered into it
};

class PeerForgeryTest : public ::testing::Test {
 protected:
  // One set of certificates for every case (making them takes ~0.6 s).
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/vsocket-certs-XXXXXX";
    if (const char* d = mkdtemp(tmpl)) {
      certs_ = new std::string(d);
      certs_made_ = new Status(RoguePeer::MakeCertificates(*certs_));
    }
  }
  static void TearDownTestSuite() {
    if (certs_ != nullptr) {
      std::string cmd = "rm -rf '" + *certs_ + "'";
      (void)!std::system(cmd.c_str());
    }
    delete certs_;
    delete certs_made_;
    certs_ = nullptr;
    certs_made_ = nullptr;
  }

  void SetUp() override {
    ASSERT_TRUE(certs_made_ != nullptr) << "mkdtemp failed";
    ASSERT_TRUE(certs_made_->ok()) << certs_made_->ToString();
    Status st = rogue_.Prepare(CertsDir(),
                               {"1 192.0.2.1 hostA", "1 192.0.2.2 arogue", "2 192.0.2.1 hostA", "2 192.0.2.2 arogue"},
                               Crl());
    ASSERT_TRUE(st.ok()) << st.ToString();
    daemon_ = std::make_unique<Daemon>(std::vector<std::string>{"client:1,192.0.2.1", "other:2,192.0.2.1"},
                                       std::vector<std::string>{"--config", rogue_.config_path()});
    ASSERT_TRUE(daemon_->Start());
    st = rogue_.Connect(*daemon_);
    ASSERT_TRUE(st.ok()) << st.ToString();
    guest_ = std::make_unique<RawGuest>(daemon_->socket_path("client"));
    ASSERT_TRUE(guest_->ok()) << guest_->error();
  }
  void TearDown() override {
    if (!daemon_) return;
    EXPECT_NE(daemon_->Command("counters").find("fabric_violations"), std::string::npos) << "vsocketd answers";
    EXPECT_TRUE(daemon_->Alive()) << "vsocketd survived";
    EXPECT_TRUE(daemon_->StopsCleanly()) << "vsocketd exits with status 0 on SIGTERM";
  }

  // The certificates and the daemon's tls_crl (none) of a case.
  virtual std::string CertsDir() { return *certs_; }
  virtual std::string Crl() { return ""; }

  long long Counter(const char* key) { return Daemon::Number(daemon_->Stats(), key); }

  // The registry's "mode reason" of vm's connection from `port` (to
  // `peer_port`, if given) once it is `want`, or what it is after 5 s.
  std::string WaitState(const std::string& vm, uint16_t port, const std::string& want, uint16_t peer_port = 0) {
    std::string s;
    for (int i = 0; i < 40; ++i) {
      s = RegistryState(*daemon_, vm, port, peer_port);  // sleeps 100 ms first
      if (s == want) break;
    }
    return s;
  }
  std::string State(const Conn& c) { return RegistryState(*daemon_, c.tenant == 1 ? "client" : "other", c.port); }

  // Guest g (of `tenant`) registers a client connection from 192.0.2.1:port
  // to 192.0.2.2:80: the daemon asks the rogue host to pair it.
  Conn Request(RawGuest& g, uint32_t tenant, uint16_t port) {
    Conn c;
    c.tenant = tenant;
    c.port = port;
    c.theirs = 7000 + port;
    uint8_t* tx = g.Alloc(kRing);
    c.rx = g.Alloc(kRing);
    EXPECT_EQ(g.Register(port, Role::kClient, Ep(1, port), Ep(2, kServerPort), tx, kRing, c.rx, kRing), "pending");
    auto req = rogue_.AwaitControl([&](const PeerFrame& f) {
      if (f.h.type != FrameType::kPairRequest || f.h.tenant != tenant) return false;
      auto info = proto::DecodePairInfo(f.payload);
      return info.ok() && info->local.port == port;
    });
    EXPECT_TRUE(req) << "no PAIR_REQUEST for port " << port << " " << rogue_.error();
    if (req) {
      c.mine = req->h.value;
      EXPECT_EQ(req->h.aux, kRing) << "the daemon grants its ring as the window";
    }
    return c;
  }
  // The rogue accepts c's pairing, granting `window`.
  void Accept(const Conn& c, uint32_t window) {
    std::vector<uint8_t> info = PairInfoPayload(Ep(2, kServerPort), Ep(1, c.port), Role::kServer);
    EXPECT_TRUE(rogue_.SendControl(Hdr(FrameType::kPairAccept, c.tenant, c.mine, c.theirs, window), info));
  }
  // A connection paired with the rogue as a genuine peer pairs: accepted,
  // PAIR_CONFIRM on the link, our guest upgraded.
  Conn Paired(RawGuest& g, uint32_t tenant, uint16_t port) {
    Conn c = Request(g, tenant, port);
    Accept(c, kRing);
    EXPECT_TRUE(rogue_.AwaitLink(Is(FrameType::kPairConfirm, c.theirs))) << "port " << port << " " << rogue_.error();
    EXPECT_EQ(WaitState(tenant == 1 ? "client" : "other", port, "accelerated accelerated"), "accelerated accelerated");
    return c;
  }
  // The rogue sends n bytes of `fill` at c's RX tail, as a genuine peer
  // would; true once they are in our guest's RX ring. Frames on the link are
  // applied in order: every frame sent before these has been applied too.
  bool Deliver(Conn& c, uint32_t n, uint8_t fill) {
    long long before = Counter("fabric_bytes_in");
    std::vector<uint8_t> bytes(n, fill);
    if (!rogue_.SendLink(Hdr(FrameType::kData, c.tenant, c.mine, c.rx_tail), bytes)) return false;
    for (int i = 0; i < 250 && Counter("fabric_bytes_in") < before + n; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (Counter("fabric_bytes_in") != before + n) return false;
    for (uint32_t k = 0; k < n; ++k)
      if (c.rx[(c.rx_tail + k) % kRing] != fill) return false;
    c.rx_tail += n;
    return true;
  }
  // A byte value not used before (rings start zeroed).
  uint8_t NextFill() {
    if (++fill_ == 0) ++fill_;
    return fill_;
  }
  // c was reset for the peer's sake: the rogue got ABORT for it and our
  // guest was told protocol-error (its library answers ECONNRESET).
  void ExpectReset(const Conn& c, const char* what) {
    EXPECT_TRUE(rogue_.AwaitLink(Is(FrameType::kAbort, c.theirs))) << what << ": no ABORT to the peer";
    EXPECT_EQ(WaitState("client", c.port, "accelerated protocol-error"), "accelerated protocol-error") << what;
  }
  // Nothing happened to c: still upgraded, bytes still land, no ABORT.
  void ExpectUntouched(Conn& c, const char* what) {
    EXPECT_TRUE(Deliver(c, 1000, NextFill())) << what << ": bytes still land";
    EXPECT_EQ(State(c), "accelerated accelerated") << what;
    EXPECT_FALSE(rogue_.AwaitLink(Is(FrameType::kAbort, c.theirs), std::chrono::milliseconds(100))) << what;
  }

  static std::string* certs_;
  static Status* certs_made_;
  // Destroyed in reverse: the guest, the daemon, then the rogue's sessions
  // and its directory.
  RoguePeer rogue_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<RawGuest> guest_;
  uint8_t fill_ = 0x40;
};

std::string* PeerForgeryTest::certs_ = nullptr;
Status* PeerForgeryTest::certs_made_ = nullptr;

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
    EXPECT_TRUE(rogue_.SendLink(Hdr(FrameType::kPairConfirm, 1, c.mine)));
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
    ASSERT_TRUE(rogue_.SendControl(Hdr(FrameType::kPairRequest, 1, 0, theirs, kBad[i]), info));
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
  ASSERT_TRUE(rogue_.SendControl(Hdr(FrameType::kPairRequest, 1, 0, 9100, kRing), info));
  auto accept = rogue_.AwaitControl(Is(FrameType::kPairAccept, 9100));
  ASSERT_TRUE(accept) << rogue_.error();
  EXPECT_EQ(accept->h.aux, kRing);
  ASSERT_TRUE(rogue_.SendLink(Hdr(FrameType::kPairConfirm, 1, accept->h.value)));
  EXPECT_EQ(WaitState("client", kServerPort, "accelerated accelerated", 41000), "accelerated accelerated");
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
    ASSERT_TRUE(rogue_.SendControl(Hdr(FrameType::kPairReject, 1, c.mine, 0, static_cast<uint32_t>(r))));
    EXPECT_EQ(WaitState("client", c.port, "kernel protocol-error"), "kernel protocol-error")
        << "PAIR_REJECT " << proto::ToString(r);
  }
  for (proto::Reason r : kInvalid) {
    Conn c = Paired(*guest_, 1, port++);
    ASSERT_TRUE(rogue_.SendLink(Hdr(FrameType::kDowngrade, 1, c.mine, 0, static_cast<uint32_t>(r))));
    EXPECT_EQ(WaitState("client", c.port, "accelerated protocol-error"), "accelerated protocol-error")
        << "DOWNGRADE " << proto::ToString(r);
  }
  // Valid reasons pass as given.
  Conn rejected = Request(*guest_, 1, port++);
  ASSERT_TRUE(rogue_.SendControl(
      Hdr(FrameType::kPairReject, 1, rejected.mine, 0, static_cast<uint32_t>(proto::Reason::kPeerNotAccelerated))));
  EXPECT_EQ(WaitState("client", rejected.port, "kernel peer-not-accelerated"), "kernel peer-not-accelerated");
  Conn downgraded = Paired(*guest_, 1, port++);
  ASSERT_TRUE(rogue_.SendLink(
      Hdr(FrameType::kDowngrade, 1, downgraded.mine, 0, static_cast<uint32_t>(proto::Reason::kFabricDown))));
  EXPECT_EQ(WaitState("client", downgraded.port, "accelerated fabric-down"), "accelerated fabric-down");
  ExpectUntouched(good, "the paired connection beside them");
}

// A reason code beyond every known one does not parse: the link is torn
// down (docs/multi-host.md "Trust": a frame that does not parse tears the
// link down), its connections go back to kernel TCP, the daemon stays up.
TEST_F(PeerForgeryTest, UnknownReasonCodeTearsTheLinkDown) {
  Conn c = Paired(*guest_, 1, 40300);
  ASSERT_TRUE(rogue_.SendLink(Hdr(FrameType::kDowngrade, 1, c.mine, 0, proto::kMaxReason + 1)));
  EXPECT_TRUE(rogue_.LinkClosedWithin(std::chrono::milliseconds(5000))) << "the daemon closes the link";
  EXPECT_EQ(WaitState("client", c.port, "accelerated fabric-down"), "accelerated fabric-down");
  EXPECT_EQ(Counter("fabric_downgrades"), 1);
}

// Case 3: one pairing, one FENCE. Unchecked, a second FENCE moved the point
// where our guest's reader switches from the kernel stream to the ring.
TEST_F(PeerForgeryTest, SecondFenceResetsOnlyThatConnection) {
  Conn victim = Paired(*guest_, 1, 40400), good = Paired(*guest_, 1, 40401);
  ASSERT_TRUE(rogue_.SendLink(Hdr(FrameType::kFence, 1, victim.mine, 0)));
  ASSERT_TRUE(rogue_.SendLink(Hdr(FrameType::kFence, 1, good.mine, 0)));
  ASSERT_TRUE(Deliver(good, 100, 0x11));
  long long violations = Counter("fabric_violations"), protocol = Counter("protocol_violations");
  EXPECT_EQ(State(victim), "accelerated accelerated") << "the first FENCE is the peer's right";
  ASSERT_TRUE(rogue_.SendLink(Hdr(FrameType::kFence, 1, victim.mine, 1234)));
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
  ASSERT_TRUE(rogue_.SendLink(Hdr(FrameType::kRelease, 1, victim.mine)));
  ExpectReset(victim, "RELEASE of a live connection");
  EXPECT_EQ(Counter("fabric_violations"), violations + 1);
  // The legitimate order (the peer's side left, then it forgets the
  // connection) is no violation.
  ASSERT_TRUE(rogue_.SendLink(
      Hdr(FrameType::kDowngrade, 1, left.mine, 0, static_cast<uint32_t>(proto::Reason::kPeerDowngraded))));
  ASSERT_TRUE(rogue_.SendLink(Hdr(FrameType::kRelease, 1, left.mine)));
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
  ASSERT_TRUE(rogue_.SendLink(Hdr(FrameType::kData, 1, full.mine, full.rx_tail), one));
  ExpectReset(full, "DATA beyond the window");
  EXPECT_EQ(full.rx[0], 0x21) << "the excess byte wrapped over unread data";
  std::vector<uint8_t> some(100, 0x99);
  ASSERT_TRUE(rogue_.SendLink(Hdr(FrameType::kData, 1, skew.mine, 4096), some));
  ExpectReset(skew, "DATA away from the RX tail");
  EXPECT_EQ(skew.rx[4096], 0) << "bytes placed where the stream is not";
  ASSERT_TRUE(rogue_.SendLink(Hdr(FrameType::kCredit, 1, credit.mine, 1)));
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
  ASSERT_TRUE(rogue_.SendLink(Hdr(FrameType::kData, 1, neighbour.mine, 0), some));
  ASSERT_TRUE(rogue_.SendLink(Hdr(FrameType::kAbort, 1, neighbour.mine)));
  ASSERT_TRUE(rogue_.SendLink(Hdr(FrameType::kRelease, 1, neighbour.mine)));
  // A handle the daemon never gave out.
  ASSERT_TRUE(rogue_.SendLink(Hdr(FrameType::kData, 1, 0xdead0000, 0), some));
  ASSERT_TRUE(rogue_.SendLink(Hdr(FrameType::kAbort, 1, 0xdead0000)));
  ExpectUntouched(good, "tenant 1's connection");
  EXPECT_EQ(Counter("frames_cross_tenant"), cross + 3);
  EXPECT_EQ(Counter("frames_dropped"), dropped + 5);
  EXPECT_EQ(Counter("fabric_violations"), violations);
  EXPECT_EQ(neighbour.rx[0], 0) << "another tenant's bytes landed in tenant 2's ring";
  EXPECT_EQ(State(neighbour), "accelerated accelerated");
  EXPECT_TRUE(Deliver(neighbour, 100, 0x22)) << "tenant 2's connection still carries its own bytes";
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
