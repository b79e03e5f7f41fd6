// The doorbell (kFeatureDoorbell) against the real daemon, driven by hand:
// negotiation, a connection pair whose counts travel through the block,
// arming, and a guest that lies in its block. The library's use of it is
// covered by the socket suite and the end-to-end tests (every byte
// checked); here each rule of proto/control.h is checked on its own.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "tests/integration/control_channel.h"
#include "tests/integration/daemon_fixture.h"

namespace vsocket {
namespace {

using guest::ControlChannel;
using proto::DoorbellBlock;
using proto::MsgType;
using testing::Daemon;

constexpr uint32_t kRing = 4096;

class DoorbellTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.Start());
    guest::ChannelOptions o;
    o.frontend.socket_path = daemon_.socket_path("vm1");
    auto ch = ControlChannel::Open(o);
    ASSERT_TRUE(ch.ok()) << ch.status().ToString();
    ch_ = std::move(ch).value();
  }

  uint64_t Hello(uint64_t features) {
    proto::Message resp;
    Status st = ch_->Call({MsgType::kHello, 1, proto::Hello{1, 0, 1, features}}, &resp, scratch_);
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(resp.type, MsgType::kHelloAck);
    return std::get<proto::HelloAck>(resp.body).features;
  }

  // One end: TX ring + block, RX ring, in the shared region.
  struct End {
    uint64_t id;
    uint8_t* tx;
    uint8_t* rx;
    DoorbellBlock* db;
  };
  End Alloc(uint64_t id) {
    auto& a = ch_->frontend().allocator();
    End e{id, a.Allocate(kRing + proto::kDoorbellBytes, 64), a.Allocate(kRing, 64), nullptr};
    EXPECT_NE(e.tx, nullptr);
    EXPECT_NE(e.rx, nullptr);
    e.db = new (e.tx + kRing) DoorbellBlock{};
    e.db->want_tx = e.db->want_consumed = 1;
    return e;
  }
  proto::RegisterAck Register(const End& e, proto::Role role, uint16_t lport, uint16_t pport) {
    proto::RegisterConn r{e.id, role, Lo(lport), Lo(pport), Gpa(e.tx), Gpa(e.rx), kRing, kRing};
    proto::Message resp;
    Status st = ch_->Call({MsgType::kRegisterConn, e.id, r}, &resp, scratch_);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return std::get<proto::RegisterAck>(resp.body);
  }
  void Post(MsgType t, uint64_t id, uint64_t v) {
    ASSERT_TRUE(ch_->Submit({t, 0, proto::ConnCounter{id, v}}, next_cookie_++).ok());
    ch_->Flush();
    std::vector<ControlChannel::Completion> done;
    while (ch_->in_flight() > 0) ASSERT_TRUE(ch_->Reap(&done, 5000).ok());
  }
  // What the library does for a new count: store, fence, post only if asked.
  bool Announce(uint64_t DoorbellBlock::*count, uint32_t DoorbellBlock::*want, MsgType t, End& e, uint64_t v) {
    std::atomic_ref<uint64_t>(e.db->*count).store(v, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    std::atomic_ref<uint32_t> flag(e.db->*want);
    if (flag.load(std::memory_order_relaxed) == 0 || flag.exchange(0) == 0) return false;
    Post(t, e.id, v);
    return true;
  }
  int64_t Stat(const char* name) { return Daemon::Number(daemon_.Stats(), name); }
  // Waits (bounded) for a daemon counter to reach `want`.
  bool WaitStat(const char* name, int64_t want, int timeout_ms = 5000) {
    for (int i = 0; i < timeout_ms / 5; ++i) {
      if (Stat(name) >= want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  static uint64_t Gpa(const void* p) { return reinterpret_cast<uint64_t>(p); }
  static proto::Endpoint Lo(uint16_t port) {
    proto::Endpoint e;
    e.addr[0] = 127;
    e.addr[3] = 1;
    e.port = port;
    return e;
  }
  // A loopback pair on the one VM, paired and fenced (no kernel bytes).
  void Pair(End& a, End& b) {
    ASSERT_EQ(Register(a, proto::Role::kClient, 5100, 5200).status, proto::WireError::kOk);
    ASSERT_EQ(Register(b, proto::Role::kServer, 5200, 5100).status, proto::WireError::kOk);
    Post(MsgType::kFence, a.id, 0);
    Post(MsgType::kFence, b.id, 0);
    ASSERT_TRUE(WaitStat("upgrades", 1));
  }

  Daemon daemon_{{"vm1"}};
  std::unique_ptr<ControlChannel> ch_;
  std::vector<uint8_t> scratch_ = std::vector<uint8_t>(proto::kMaxMessageSize);
  uint64_t next_cookie_ = 100;
};

TEST_F(DoorbellTest, NegotiatedOnlyWhenOffered) {
  EXPECT_EQ(Hello(0), 0u);
  EXPECT_EQ(Hello(proto::kFeatureDoorbell | (1ull << 40)), proto::kFeatureDoorbell) << "unknown bits are not taken";
  EXPECT_EQ(Stat("doorbell_sessions"), 1);
  // Once connections live, another HELLO keeps what the session has.
  End a = Alloc(1);
  ASSERT_EQ(Register(a, proto::Role::kClient, 5100, 5200).status, proto::WireError::kOk);
  EXPECT_EQ(Hello(0), proto::kFeatureDoorbell);
  EXPECT_EQ(Stat("doorbell_sessions"), 1);
}

// The block's counts are atomics: a ring (so a block) off 64-byte alignment
// is refused (by the decoder, before the connection manager sees it).
TEST_F(DoorbellTest, MisalignedBlockIsRefused) {
  ASSERT_EQ(Hello(proto::kFeatureDoorbell), proto::kFeatureDoorbell);
  End a = Alloc(1);
  proto::RegisterConn r{1, proto::Role::kClient, Lo(5100), Lo(5200), Gpa(a.tx) + 8, Gpa(a.rx), kRing, kRing};
  proto::Message resp;
  ASSERT_TRUE(ch_->Call({MsgType::kRegisterConn, 1, r}, &resp, scratch_).ok());
  ASSERT_EQ(resp.type, MsgType::kError);
  EXPECT_EQ(std::get<proto::Error>(resp.body).code, proto::WireError::kBadMessage);
  EXPECT_EQ(Register(a, proto::Role::kClient, 5100, 5200).status, proto::WireError::kOk) << "the aligned one is fine";
}

// 256 KiB in random pieces through a 4 KiB ring: the producer announces
// each tail, the consumer each consumed count, as the library does; every
// byte lands in order, and most counts need no message at all.
TEST_F(DoorbellTest, CountsThroughTheBlockMoveEveryByte) {
  ASSERT_EQ(Hello(proto::kFeatureDoorbell), proto::kFeatureDoorbell);
  End a = Alloc(1), b = Alloc(2);
  Pair(a, b);
  std::mt19937 rng(5);
  constexpr uint64_t kTotal = 256 * 1024;
  // credit: what the producer may count on the daemon having seen of the
  // consumer (a real sender learns it from CREDIT events, which the daemon
  // raises only after taking the consumed count; here a message naming the
  // consumer, processed before its completion, makes sure of it).
  uint64_t tail = 0, consumed = 0, credit = 0;
  int messages = 0, counts = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (consumed < kTotal && std::chrono::steady_clock::now() < deadline) {
    // Produce what the window allows.
    uint64_t room = kRing - (tail - credit);
    uint64_t n = std::min<uint64_t>({room, kTotal - tail, 1 + rng() % 700});
    if (n > 0) {
      for (uint64_t i = 0; i < n; ++i) a.tx[(tail + i) % kRing] = static_cast<uint8_t>((tail + i) * 7 + 1);
      tail += n;
      messages += Announce(&DoorbellBlock::tx_tail, &DoorbellBlock::want_tx, MsgType::kTxTail, a, tail);
      ++counts;
    }
    // Consume what the daemon says it moved (no event queue here: its
    // accel_bytes counter says how far B's RX ring is filled).
    uint64_t landed = static_cast<uint64_t>(Stat("accel_bytes"));
    ASSERT_LE(landed, tail);
    if (landed > consumed) {
      for (uint64_t p = consumed; p < landed; ++p)
        ASSERT_EQ(b.rx[p % kRing], static_cast<uint8_t>(p * 7 + 1)) << "byte " << p;
      consumed = landed;
      bool posted = Announce(&DoorbellBlock::consumed, &DoorbellBlock::want_consumed, MsgType::kConsumed, b, consumed);
      messages += posted;
      ++counts;
      if (posted) credit = consumed;
    }
    if (tail - credit == kRing && consumed > credit) {
      Post(MsgType::kConsumed, b.id, consumed);  // the sender waits for its credit
      credit = consumed;
    }
  }
  EXPECT_EQ(consumed, kTotal);
  EXPECT_EQ(Stat("protocol_violations"), 0);
  EXPECT_GT(Stat("doorbell_counts"), 0) << "counts were read from blocks";
  EXPECT_LE(messages, counts);
  std::printf("doorbell: %d counts, %d needed a message\n", counts, messages);
  // Idle, the daemon arms both blocks (then sleeps).
  for (int i = 0; i < 400 && !(a.db->want_tx && b.db->want_consumed); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(std::atomic_ref<uint32_t>(a.db->want_tx).load(), 1u);
  EXPECT_EQ(std::atomic_ref<uint32_t>(b.db->want_consumed).load(), 1u);
  EXPECT_GT(Stat("doorbell_arms"), 0);
}

// A guest that lies in its block: a count going backwards is ignored (a
// message may carry an older count than the block already showed); one
// beyond the window resets that connection only.
TEST_F(DoorbellTest, LyingBlockResetsOnlyItsConnection) {
  ASSERT_EQ(Hello(proto::kFeatureDoorbell), proto::kFeatureDoorbell);
  End a = Alloc(1), b = Alloc(2);
  Pair(a, b);
  std::memset(a.tx, 0x5a, 100);
  a.db->tx_tail = 100;
  Post(MsgType::kTxTail, a.id, 100);
  ASSERT_TRUE(WaitStat("accel_bytes", 100));
  a.db->tx_tail = 50;  // backwards
  Post(MsgType::kTxTail, a.id, 50);
  EXPECT_EQ(Stat("protocol_violations"), 0);
  a.db->tx_tail = 100 + 2 * kRing;  // beyond the window
  Post(MsgType::kTxTail, a.id, 0);
  EXPECT_TRUE(WaitStat("protocol_violations", 1));
  EXPECT_EQ(Stat("accel_bytes"), 100) << "nothing beyond the window moved";
  // Consumed beyond what landed: also a violation, for that connection.
  b.db->consumed = 1000;
  Post(MsgType::kConsumed, b.id, 1000);
  EXPECT_TRUE(WaitStat("protocol_violations", 2));
  EXPECT_TRUE(daemon_.Alive());
  // The device itself still works: a fresh pair moves bytes.
  End c = Alloc(3), d = Alloc(4);
  ASSERT_EQ(Register(c, proto::Role::kClient, 5300, 5400).status, proto::WireError::kOk);
  ASSERT_EQ(Register(d, proto::Role::kServer, 5400, 5300).status, proto::WireError::kOk);
  Post(MsgType::kFence, c.id, 0);
  std::memset(c.tx, 0x33, 10);
  c.db->tx_tail = 10;
  Post(MsgType::kTxTail, c.id, 10);
  ASSERT_TRUE(WaitStat("accel_bytes", 110));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(d.rx[i], 0x33);
}

}  // namespace
}  // namespace vsocket
