// The red-team suite's fixture for attacks from a peer host: a real
// vsocketd whose only configured peer is the test (RoguePeer), two VMs of
// different tenants with the same address (192.0.2.1) on it, and helpers to
// pair a guest's connection with the rogue host and deliver bytes into it.
// Used by peer_forgery_test (finding 7) and inbound_data_test (finding 1).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "proto/control.h"
#include "host-backend/remote/frame.h"
#include "proto/fabric.h"
#include "tests/hostile/raw_guest.h"
#include "tests/hostile/rogue_peer.h"
#include "tests/integration/daemon_fixture.h"

namespace vsocket::testing {

using proto::FrameHeader;
using proto::FrameType;
using proto::Role;

// Every ring of the test, and so the window each side grants.
constexpr uint32_t kRing = 64 * 1024;
// Our guests are 192.0.2.1 (tenants 1 and 2, on the daemon); their peer
// 192.0.2.2:80 runs on the rogue host, says the locator.
constexpr uint16_t kServerPort = 80;

// Frame headers as a genuine peer host builds them.
using backend::Frame;

inline RoguePeer::Match Is(FrameType t, uint64_t handle) {
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

class PeerHostTest : public ::testing::Test {
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
    EXPECT_TRUE(rogue_.SendControl(Frame(FrameType::kPairAccept, c.tenant, c.mine, c.theirs, window), info));
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
    if (!rogue_.SendLink(Frame(FrameType::kData, c.tenant, c.mine, c.rx_tail), bytes)) return false;
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

  static inline std::string* certs_ = nullptr;
  static inline Status* certs_made_ = nullptr;
  // Destroyed in reverse: the guest, the daemon, then the rogue's sessions
  // and its directory.
  RoguePeer rogue_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<RawGuest> guest_;
  uint8_t fill_ = 0x40;
};

}  // namespace vsocket::testing
