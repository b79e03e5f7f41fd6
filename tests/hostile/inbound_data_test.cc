// A DATA frame from a peer host whose payload arrives in parts, with the
// receiving guest's memory remapped or the guest gone in between (issue 17,
// finding 1), against a real vsocketd.
//
// The tcp fabric reads a frame's payload straight into the connection's RX
// ring as its bytes arrive, over as many polls as the peer takes. A link that
// kept the first part's destination wrote the rest through a stale pointer:
// into memory rte_vhost had unmapped and mapped again elsewhere (the guest
// sent a new memory table: SIGSEGV, or bytes written where the ring no longer
// is), or into the memory of a guest that had exited. The test is the peer
// host (RoguePeer): it sends the frame's header and the first half of its
// payload, waits until those bytes are in the guest's ring (the link is now
// in the middle of the payload), has the guest change its memory table or
// exit, then sends the rest. vsocketd must put every byte where the ring is
// now (or nowhere, for a guest that left), keep the link, and keep serving
// the connection beside it. Shown failing with StreamLink reusing the first
// part's destination (the old code): the remap case loses the second half
// (or the daemon crashes), the exit case crashes vsocketd under ASan.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "proto/fabric.h"
#include "tests/hostile/peer_fixture.h"

namespace vsocket {
namespace {

using proto::FrameType;
using testing::Conn;
using testing::Frame;
using testing::kRing;
using testing::RawGuest;
using testing::RoguePeer;
using InboundDataTest = testing::PeerHostTest;

// A payload whose every byte says where it belongs.
std::vector<uint8_t> Pattern(size_t n, uint8_t salt) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + salt + (i >> 8));
  return v;
}

// Waits (5 s at most) until `ring` holds `want` at stream offset `from`.
bool Landed(const uint8_t* ring, uint64_t from, const std::vector<uint8_t>& want, size_t upto) {
  for (int i = 0; i < 250; ++i) {
    bool all = true;
    for (size_t k = 0; k < upto && all; ++k) all = ring[(from + k) % kRing] == want[k];
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// The frame is sent as its header plus the first half of its payload, then
// (after `between`) the rest.
struct SplitFrame {
  std::vector<uint8_t> payload;
  std::vector<uint8_t> bytes;  // encoded frame
  size_t first = 0;            // bytes of `bytes` in the first part
};

SplitFrame Split(const Conn& c, size_t n, uint8_t salt) {
  SplitFrame f;
  f.payload = Pattern(n, salt);
  f.bytes = RoguePeer::EncodeFrame(Frame(FrameType::kData, c.tenant, c.mine, c.rx_tail), f.payload);
  f.first = proto::kFrameHeaderSize + n / 2;
  return f;
}

// The guest adds a memory region (rte_vhost unmaps and maps its memory
// again) while a frame for it is half-way in: the rest lands in the ring
// where it is now, byte for byte, and the connection goes on. Three times,
// each a new table (every one changes the memory).
TEST_F(InboundDataTest, PayloadSplitAcrossAMemoryRemapLandsWhole) {
  Conn good = Paired(*guest_, 1, 40700);
  Conn c = Paired(*guest_, 1, 40701);
  long long reconfigs = Counter("reconfigurations");
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const size_t n = 16000;  // 3 x n < kRing: the rogue keeps within the window
    SplitFrame f = Split(c, n, static_cast<uint8_t>(round * 31 + 1));
    long long in = Counter("fabric_bytes_in");
    ASSERT_TRUE(rogue_.SendLinkBytes({f.bytes.data(), f.first})) << rogue_.error();
    // The first half is in the ring: the link is now inside the payload.
    ASSERT_TRUE(Landed(c.rx, c.rx_tail, f.payload, n / 2)) << "first half never landed";
    Status st = guest_->AddRegion(2u << 20);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE(rogue_.SendLinkBytes({f.bytes.data() + f.first, f.bytes.size() - f.first})) << rogue_.error();
    for (int i = 0; i < 250 && Counter("fabric_bytes_in") < in + static_cast<long long>(n); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(Counter("fabric_bytes_in"), in + static_cast<long long>(n)) << "the frame completed";
    EXPECT_TRUE(Landed(c.rx, c.rx_tail, f.payload, n)) << "every byte where the ring is now";
    c.rx_tail += n;
    // The guest consumed nothing: the window shrinks; keep below it.
    if (c.rx_tail + n > kRing) break;
  }
  EXPECT_GT(Counter("reconfigurations"), reconfigs) << "the daemon paused the device around each table";
  EXPECT_EQ(State(c), "accelerated accelerated");
  EXPECT_FALSE(rogue_.AwaitLink(testing::Is(FrameType::kAbort, c.theirs), std::chrono::milliseconds(100)));
  ExpectUntouched(good, "the connection beside it");
}

// The guest process exits while a frame for it is half-way in (its memory
// is unmapped once vsocketd lets it go): the rest of the payload, and a
// whole frame after it, go nowhere; vsocketd survives and another guest's
// connection on the same link keeps receiving.
TEST_F(InboundDataTest, PayloadSplitAcrossTheGuestsExitGoesNowhere) {
  auto other = std::make_unique<RawGuest>(daemon_->socket_path("client"));
  ASSERT_TRUE(other->ok()) << other->error();
  Conn good = Paired(*other, 1, 40710);
  Conn c = Paired(*guest_, 1, 40711);
  const size_t n = 60000;
  SplitFrame f = Split(c, n, 77);
  ASSERT_TRUE(rogue_.SendLinkBytes({f.bytes.data(), f.first})) << rogue_.error();
  ASSERT_TRUE(Landed(c.rx, c.rx_tail, f.payload, n / 2)) << "first half never landed";
  guest_.reset();  // the process is gone: its session closes
  std::string state;
  for (int i = 0; i < 50; ++i) {
    state = State(c);
    if (state != "accelerated accelerated") break;
  }
  EXPECT_NE(state, "accelerated accelerated") << "vsocketd noticed the guest left";
  ASSERT_TRUE(rogue_.SendLinkBytes({f.bytes.data() + f.first, f.bytes.size() - f.first})) << rogue_.error();
  std::vector<uint8_t> more(4000, 0x33);
  EXPECT_TRUE(rogue_.SendLink(Frame(FrameType::kData, c.tenant, c.mine, c.rx_tail + n), more)) << rogue_.error();
  ExpectUntouched(good, "another guest's connection on the same link");
  EXPECT_TRUE(daemon_->Alive());
  // (TearDown: the daemon answers and exits cleanly on SIGTERM.)
}

}  // namespace
}  // namespace vsocket
