#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "vhost/ring/ring_test_util.h"
#include "vhost/ring/virtqueue_device.h"
#include "vhost/ring/virtqueue_driver.h"

namespace vsocket::vhost {
namespace {

using testing::RingArena;
using Buf = VirtqueueDriver::Buf;

class VirtqueueTest : public ::testing::TestWithParam<bool> {
 protected:
  explicit VirtqueueTest(uint16_t qsize = 8) : arena_(qsize), drv_(arena_.ring, GetParam()) {
    dev_ = VirtqueueDevice(arena_.ring, &arena_.guest, GetParam(), 0, 0);
  }

  uint8_t* buf(size_t off) { return arena_.data + off; }
  uint64_t gpa(size_t off) { return RingArena::Gpa(buf(off)); }

  // One request/response through the queue; returns the response length.
  void RoundTrip(uint8_t tag) {
    *buf(0) = tag;
    Buf out{gpa(0), 1}, in{gpa(64), 4};
    ASSERT_TRUE(drv_.Add({&out, 1}, {&in, 1}, tag + 1000).ok());
    drv_.Publish();
    DescChain c;
    ASSERT_EQ(dev_.Pop(&c), PopResult::kChain);
    ASSERT_EQ(c.num_readable, 1);
    ASSERT_EQ(c.num_writable, 1);
    EXPECT_EQ(c.readable()[0].data[0], tag);
    uint8_t resp[2] = {tag, static_cast<uint8_t>(tag ^ 0xff)};
    EXPECT_EQ(c.CopyIn(resp), 2u);
    dev_.Push(c.head, 2);
    dev_.PublishUsed();
    auto u = drv_.PopUsed();
    ASSERT_TRUE(u.has_value());
    EXPECT_EQ(u->cookie, tag + 1000u);
    EXPECT_EQ(u->len, 2u);
    EXPECT_EQ(*buf(65), static_cast<uint8_t>(tag ^ 0xff));
  }

  RingArena arena_;
  VirtqueueDriver drv_;
  VirtqueueDevice dev_;
};

TEST_P(VirtqueueTest, RequestResponseRoundTrip) { RoundTrip(7); }

TEST_P(VirtqueueTest, EmptyQueuePopsNothing) {
  DescChain c;
  EXPECT_EQ(dev_.Pop(&c), PopResult::kEmpty);
  EXPECT_FALSE(drv_.PopUsed().has_value());
  EXPECT_FALSE(dev_.PublishUsed());
}

TEST_P(VirtqueueTest, FullQueueRefusesThenRecovers) {
  Buf b{gpa(0), 16};
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(drv_.Add({&b, 1}, {}, i).ok());
  EXPECT_EQ(drv_.num_free(), 0);
  EXPECT_EQ(drv_.Add({&b, 1}, {}, 99).status().code(), Code::kResourceExhausted);
  drv_.Publish();
  DescChain c;
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(dev_.Pop(&c), PopResult::kChain);
    dev_.Push(c.head, 0);
  }
  EXPECT_EQ(dev_.Pop(&c), PopResult::kEmpty);
  dev_.PublishUsed();
  for (int i = 0; i < 8; ++i) {
    auto u = drv_.PopUsed();
    ASSERT_TRUE(u.has_value());
    EXPECT_EQ(u->cookie, static_cast<uint64_t>(i));
  }
  EXPECT_EQ(drv_.num_free(), 8);
}

TEST_P(VirtqueueTest, MultiSegmentChainsKeepOrderAndFreeAllDescriptors) {
  Buf out[3] = {{gpa(0), 3}, {gpa(8), 5}, {gpa(16), 7}};
  Buf in[2] = {{gpa(64), 4}, {gpa(72), 4}};
  for (int round = 0; round < 100; ++round) {
    ASSERT_TRUE(drv_.Add(out, in, round).ok());
    drv_.Publish();
    DescChain c;
    ASSERT_EQ(dev_.Pop(&c), PopResult::kChain);
    EXPECT_EQ(c.num_readable, 3);
    EXPECT_EQ(c.num_writable, 2);
    EXPECT_EQ(c.readable_bytes, 15u);
    EXPECT_EQ(c.writable_bytes, 8u);
    dev_.Push(c.head, 8);
    dev_.PublishUsed();
    ASSERT_TRUE(drv_.PopUsed().has_value());
    ASSERT_EQ(drv_.num_free(), 8);
  }
}

TEST_P(VirtqueueTest, IndicesWrapAroundSixteenBits) {
  for (int i = 0; i < 70000; ++i) {
    RoundTrip(static_cast<uint8_t>(i));
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(drv_.avail_idx(), static_cast<uint16_t>(70000));
  EXPECT_EQ(dev_.used_idx(), static_cast<uint16_t>(70000));
}

// Event-idx and flag suppression: exactly one notification per
// enable, including when the indices wrap from 65535 to 0.
TEST_P(VirtqueueTest, NotificationSuppressionAcrossIndexWrap) {
  for (int i = 0; i < 65533; ++i) RoundTrip(1);
  Buf b{gpa(0), 1};
  for (int step = 0; step < 6; ++step) {  // crosses 65535 -> 0
    EXPECT_FALSE(dev_.EnableNotify());
    ASSERT_TRUE(drv_.Add({&b, 1}, {}, 0).ok());
    EXPECT_TRUE(drv_.Publish()) << "device asked for a kick";
    dev_.DisableNotify();
    ASSERT_TRUE(drv_.Add({&b, 1}, {}, 0).ok());
    EXPECT_FALSE(drv_.Publish()) << "kick suppressed while device polls";
    DescChain c;
    for (int k = 0; k < 2; ++k) {
      ASSERT_EQ(dev_.Pop(&c), PopResult::kChain);
      dev_.Push(c.head, 0);
    }
    EXPECT_FALSE(drv_.EnableInterrupts());
    EXPECT_TRUE(dev_.PublishUsed()) << "driver asked for a call";
    drv_.DisableInterrupts();
    ASSERT_TRUE(drv_.PopUsed().has_value());
    ASSERT_TRUE(drv_.PopUsed().has_value());
    ASSERT_TRUE(drv_.Add({&b, 1}, {}, 0).ok());
    drv_.Publish();
    ASSERT_EQ(dev_.Pop(&c), PopResult::kChain);
    dev_.Push(c.head, 0);
    EXPECT_FALSE(dev_.PublishUsed()) << "call suppressed while driver polls";
    ASSERT_TRUE(drv_.PopUsed().has_value());
  }
}

TEST_P(VirtqueueTest, EnableReportsWorkThatRacedIn) {
  Buf b{gpa(0), 1};
  ASSERT_TRUE(drv_.Add({&b, 1}, {}, 0).ok());
  drv_.Publish();
  EXPECT_TRUE(dev_.EnableNotify()) << "must not sleep with a buffer pending";
  DescChain c;
  ASSERT_EQ(dev_.Pop(&c), PopResult::kChain);
  dev_.Push(c.head, 0);
  dev_.PublishUsed();
  EXPECT_TRUE(drv_.EnableInterrupts()) << "must not sleep with a used entry pending";
}

// Decision 129: the device's "I cannot call you" flag reaches the driver and
// survives the notification flag's own changes (used->flags holds both).
TEST_P(VirtqueueTest, NoCallFlagSurvivesNotifySuppression) {
  const bool flags_mode = !GetParam();  // (with event-idx, used->flags says nothing about kicks)
  EXPECT_FALSE(drv_.DeviceCannotCall());
  dev_.SetUsedFlag(proto::kUsedFlagNoCall, true);
  EXPECT_TRUE(drv_.DeviceCannotCall());
  dev_.DisableNotify();
  EXPECT_TRUE(drv_.DeviceCannotCall());
  Buf b{gpa(0), 1};
  ASSERT_TRUE(drv_.Add({&b, 1}, {}, 0).ok());
  bool kick = drv_.Publish();
  if (flags_mode) EXPECT_FALSE(kick) << "kicks stay suppressed with the no-call flag set";
  EXPECT_TRUE(dev_.EnableNotify()) << "a buffer is pending";
  EXPECT_TRUE(drv_.DeviceCannotCall());
  ASSERT_TRUE(drv_.Add({&b, 1}, {}, 0).ok());
  kick = drv_.Publish();
  if (flags_mode) EXPECT_TRUE(kick) << "the no-call flag must not read as NO_NOTIFY";
  dev_.SetUsedFlag(proto::kUsedFlagNoCall, false);
  EXPECT_FALSE(drv_.DeviceCannotCall());
  dev_.DisableNotify();
  EXPECT_FALSE(drv_.DeviceCannotCall());
  DescChain c;
  for (int k = 0; k < 2; ++k) {
    ASSERT_EQ(dev_.Pop(&c), PopResult::kChain);
    dev_.Push(c.head, 0);
  }
  dev_.PublishUsed();
  ASSERT_TRUE(drv_.PopUsed().has_value());
  ASSERT_TRUE(drv_.PopUsed().has_value());
  RoundTrip(3);
}

INSTANTIATE_TEST_SUITE_P(EventIdx, VirtqueueTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "EventIdx" : "Flags"; });

TEST(NeedEventTest, WindowSemantics) {
  EXPECT_TRUE(proto::NeedEvent(0, 1, 0));
  EXPECT_FALSE(proto::NeedEvent(1, 1, 0));
  EXPECT_TRUE(proto::NeedEvent(65535, 0, 65535));  // wrap: event at old
  EXPECT_TRUE(proto::NeedEvent(65535, 2, 65534));  // event inside a wrapped window
  EXPECT_FALSE(proto::NeedEvent(3, 2, 65534));
  EXPECT_FALSE(proto::NeedEvent(5, 5, 5));  // nothing published
}

// ---- the device side against a hostile driver -------------------------

class HostileDriverTest : public ::testing::Test {
 protected:
  HostileDriverTest() : arena_(8) { dev_ = VirtqueueDevice(arena_.ring, &arena_.guest, true, 0, 0); }
  void SetDesc(uint16_t i, uint64_t addr, uint32_t len, uint16_t flags, uint16_t next) {
    arena_.ring.desc()[i] = proto::VringDesc{addr, len, flags, next};
  }
  void Offer(uint16_t head) {
    uint16_t idx = arena_.ring.avail_idx().load();
    arena_.ring.avail_slot(idx) = head;
    arena_.ring.avail_idx().store(idx + 1);
  }
  uint64_t good() { return RingArena::Gpa(arena_.data); }
  void ExpectBroken(const char* fragment) {
    DescChain c;
    EXPECT_EQ(dev_.Pop(&c), PopResult::kBroken);
    EXPECT_NE(std::string(dev_.broken_reason()).find(fragment), std::string::npos) << dev_.broken_reason();
    EXPECT_TRUE(dev_.broken());
    EXPECT_EQ(dev_.Pop(&c), PopResult::kBroken) << "broken is latched";
    EXPECT_FALSE(dev_.PublishUsed());
  }

  RingArena arena_;
  VirtqueueDevice dev_;
};

TEST_F(HostileDriverTest, AvailIndexJump) {
  arena_.ring.avail_idx().store(9);
  ExpectBroken("further than the queue size");
}

TEST_F(HostileDriverTest, HeadOutOfRange) {
  Offer(8);
  ExpectBroken("beyond the queue");
}

TEST_F(HostileDriverTest, LoopedChain) {
  SetDesc(0, good(), 1, proto::kDescFlagNext, 1);
  SetDesc(1, good(), 1, proto::kDescFlagNext, 0);
  Offer(0);
  ExpectBroken("loops");
}

TEST_F(HostileDriverTest, SelfLoop) {
  SetDesc(3, good(), 1, proto::kDescFlagNext, 3);
  Offer(3);
  ExpectBroken("loops");
}

TEST_F(HostileDriverTest, NextOutOfRange) {
  SetDesc(0, good(), 1, proto::kDescFlagNext, 200);
  Offer(0);
  ExpectBroken("next index");
}

TEST_F(HostileDriverTest, AddressOutsideGuestMemory) {
  SetDesc(0, 0x1000, 16, 0, 0);
  Offer(0);
  ExpectBroken("outside guest memory");
}

TEST_F(HostileDriverTest, LengthRunsPastRegionEnd) {
  SetDesc(0, good(), 0xffffffff, 0, 0);
  Offer(0);
  ExpectBroken("outside guest memory");
}

TEST_F(HostileDriverTest, AddressPlusLengthOverflows) {
  SetDesc(0, ~uint64_t{0} - 4, 64, 0, 0);
  Offer(0);
  ExpectBroken("outside guest memory");
}

TEST_F(HostileDriverTest, IndirectDescriptorNotNegotiated) {
  SetDesc(0, good(), 16, proto::kDescFlagIndirect, 0);
  Offer(0);
  ExpectBroken("indirect");
}

TEST_F(HostileDriverTest, ReadableAfterWritable) {
  SetDesc(0, good(), 1, proto::kDescFlagWrite | proto::kDescFlagNext, 1);
  SetDesc(1, good(), 1, 0, 0);
  Offer(0);
  ExpectBroken("readable descriptor after");
}

TEST_F(HostileDriverTest, GoodChainAfterBadIndexIsNotProcessed) {
  SetDesc(0, good(), 1, 0, 0);
  Offer(0);
  DescChain c;
  ASSERT_EQ(dev_.Pop(&c), PopResult::kChain);
  arena_.ring.avail_idx().store(500);
  ExpectBroken("further");
}

// Random ring contents: the device must either produce chains whose every
// segment lies inside guest memory, or latch broken. Never anything else.
TEST(HostileDriverPropertyTest, RandomRingContentsNeverEscapeGuestMemory) {
  std::mt19937_64 rng(12345);
  for (int iter = 0; iter < 2000; ++iter) {
    RingArena arena(16, 4096);
    VirtqueueDevice dev(arena.ring, &arena.guest, iter % 2 == 0, 0, 0);
    uint64_t base = RingArena::Gpa(arena.mem.get());
    for (uint16_t i = 0; i < 16; ++i) {
      uint64_t addr = (rng() % 4 == 0) ? rng() : base + rng() % (arena.size + 64);
      arena.ring.desc()[i] = proto::VringDesc{addr, static_cast<uint32_t>(rng() % 8192),
                                              static_cast<uint16_t>(rng() % 8), static_cast<uint16_t>(rng() % 20)};
      arena.ring.avail_slot(i) = static_cast<uint16_t>(rng() % 20);
    }
    arena.ring.avail_idx().store(static_cast<uint16_t>(rng() % 24));
    DescChain c;
    for (int n = 0; n < 32; ++n) {
      PopResult r = dev.Pop(&c);
      if (r != PopResult::kChain) break;
      for (size_t s = 0; s < size_t{c.num_readable} + c.num_writable; ++s)
        ASSERT_TRUE(arena.guest.ContainsLocal(c.segs[s].data, c.segs[s].len));
    }
  }
}

// ---- the driver side against a hostile device --------------------------

TEST(HostileDeviceTest, UsedEntryForIdleDescriptorBreaksDriver) {
  RingArena arena(8);
  VirtqueueDriver drv(arena.ring, true);
  proto::VringUsedElem e{3, 0};
  arena.ring.used_slot(0) = e;
  arena.ring.used_idx().store(1);
  EXPECT_FALSE(drv.PopUsed().has_value());
  EXPECT_TRUE(drv.broken());
  VirtqueueDriver::Buf b{RingArena::Gpa(arena.data), 1};
  EXPECT_EQ(drv.Add({&b, 1}, {}, 0).status().code(), Code::kDataLoss);
}

TEST(HostileDeviceTest, UsedLengthBeyondCapacityBreaksDriver) {
  RingArena arena(8);
  VirtqueueDriver drv(arena.ring, true);
  VirtqueueDriver::Buf in{RingArena::Gpa(arena.data), 16};
  auto head = drv.Add({}, {&in, 1}, 0);
  ASSERT_TRUE(head.ok());
  drv.Publish();
  arena.ring.used_slot(0) = proto::VringUsedElem{*head, 17};
  arena.ring.used_idx().store(1);
  EXPECT_FALSE(drv.PopUsed().has_value());
  EXPECT_TRUE(drv.broken());
}

TEST(HostileDeviceTest, UsedIndexJumpBreaksDriver) {
  RingArena arena(8);
  VirtqueueDriver drv(arena.ring, false);
  arena.ring.used_idx().store(100);
  EXPECT_FALSE(drv.PopUsed().has_value());
  EXPECT_TRUE(drv.broken());
}

}  // namespace
}  // namespace vsocket::vhost
