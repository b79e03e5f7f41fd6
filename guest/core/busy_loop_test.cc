#include "guest/core/busy_loop.h"

#include <gtest/gtest.h>

#include <vector>

#include "guest/core/stream_detector.h"

namespace vsocket::guest {
namespace {

constexpr uint32_t kEpoch = 1000;

// n connections turn in epoch e (each once; more turns change nothing).
void Active(BusyLoop& l, std::vector<std::atomic<uint32_t>>& marks, uint32_t n, uint32_t e) {
  for (uint32_t i = 0; i < n; ++i) {
    l.NoteTurnAt(marks[i], e);
    l.NoteTurnAt(marks[i], e);
  }
}

void Waits(BusyLoop& l, uint32_t n, int ready) {
  for (uint32_t i = 0; i < n; ++i) l.NoteWait(ready);
}

struct Fixture : ::testing::Test {
  BusyLoop loop{2};
  std::vector<std::atomic<uint32_t>> marks = std::vector<std::atomic<uint32_t>>(64);
  void SetUp() override { loop.set_epoch_for_testing(kEpoch); }
};

using BusyLoopTest = Fixture;

TEST_F(BusyLoopTest, ManyActiveConnectionsAndBatchedWaitsTurnItBusy) {
  Active(loop, marks, 32, kEpoch);
  EXPECT_EQ(loop.active(kEpoch), 32u);
  Waits(loop, kBusyWindowWaits - 1, 4);
  EXPECT_FALSE(loop.busy()) << "judged only at the end of a window";
  loop.NoteWait(4);
  EXPECT_TRUE(loop.busy());
  EXPECT_EQ(loop.flips(), 1u);
  EXPECT_EQ(loop.waits_total(), kBusyWindowWaits);
  EXPECT_EQ(loop.ready_total(), 4u * kBusyWindowWaits);
}

TEST_F(BusyLoopTest, FewActiveConnectionsNeverTurnItBusy) {
  // redis-benchmark with 8 clients: every wait finds several ready, but
  // there the rings lose (0.4-0.5x).
  Active(loop, marks, 8, kEpoch);
  Waits(loop, 4 * kBusyWindowWaits, 6);
  EXPECT_FALSE(loop.busy());
}

TEST_F(BusyLoopTest, OneReadyPerWaitNeverTurnsItBusy) {
  // Many connections, each active now and then, found one at a time.
  Active(loop, marks, 64, kEpoch);
  Waits(loop, 10 * kBusyWindowWaits, 1);
  EXPECT_FALSE(loop.busy());
  EXPECT_EQ(loop.flips(), 0u);
}

TEST_F(BusyLoopTest, ActivityCountsTheLastWholeEpoch) {
  Active(loop, marks, 20, kEpoch - 1);
  EXPECT_EQ(loop.active(kEpoch), 20u) << "the epoch just ended";
  EXPECT_EQ(loop.active(kEpoch + 1), 0u) << "nothing for two epochs";
  Active(loop, marks, 5, kEpoch);
  EXPECT_EQ(loop.active(kEpoch), 20u) << "the last whole epoch, until this one has more";
  Active(loop, marks, 30, kEpoch);
  EXPECT_EQ(loop.active(kEpoch), 30u);
}

TEST_F(BusyLoopTest, HysteresisKeepsALoopNearTheLineFromFlipping) {
  Active(loop, marks, 16, kEpoch);
  Waits(loop, kBusyWindowWaits, 3);
  ASSERT_TRUE(loop.busy());
  // Fewer connections (12: between off 8 and on 16) and fewer ready per
  // wait (1.75: between off 1.5 and on 2): stays busy, window after window.
  for (int w = 0; w < 8; ++w) {
    loop.set_epoch_for_testing(kEpoch + 1 + w);
    Active(loop, marks, 12, kEpoch + 1 + w);
    Waits(loop, kBusyWindowWaits / 4, 1);
    Waits(loop, 3 * kBusyWindowWaits / 4, 2);
  }
  EXPECT_TRUE(loop.busy());
  EXPECT_EQ(loop.flips(), 1u);
  // Below the line: back.
  Waits(loop, kBusyWindowWaits, 1);
  EXPECT_FALSE(loop.busy());
  // Between the lines again: stays not busy.
  Waits(loop, 8 * kBusyWindowWaits, 3);
  EXPECT_FALSE(loop.busy()) << "12 connections active: below kBusyConns";
  EXPECT_EQ(loop.flips(), 2u);
}

TEST_F(BusyLoopTest, TimeoutsCountAsIdleWaits) {
  Active(loop, marks, 32, kEpoch);
  Waits(loop, kBusyWindowWaits / 2, 4);
  Waits(loop, kBusyWindowWaits / 2, 0);  // average 2: busy
  EXPECT_TRUE(loop.busy());
  Waits(loop, kBusyWindowWaits / 2, 2);
  Waits(loop, kBusyWindowWaits / 2, 0);  // average 1
  EXPECT_FALSE(loop.busy());
}

TEST(BusyLoop, ZeroNeverTurnsBusy) {
  BusyLoop l(0);  // VSOCKET_BUSY_EVENTS=0
  std::vector<std::atomic<uint32_t>> marks(64);
  l.set_epoch_for_testing(kEpoch);
  Active(l, marks, 64, kEpoch);
  Waits(l, 4 * kBusyWindowWaits, 64);
  EXPECT_FALSE(l.busy());
}

// The detector's side: a request/response connection qualifies by the busy
// loop only after kBusyTurns turns (a short connection never does), says
// why, and its turns count as activity.
TEST(BusyLoopDetector, LongLivedRequestResponseQualifiesOnlyWhileBusy) {
  using D = StreamDetector::Dir;
  BusyLoop quiet(2), busy(2);
  std::vector<std::atomic<uint32_t>> marks(32);
  busy.set_epoch_for_testing(kEpoch);
  Active(busy, marks, 32, kEpoch);
  Waits(busy, kBusyWindowWaits, 4);
  ASSERT_TRUE(busy.busy());
  StreamDetector on_quiet, on_busy, short_lived;
  for (int i = 0; i < 200; ++i) EXPECT_FALSE(on_quiet.Note(i % 2 ? D::kIn : D::kOut, 100, 256 * 1024, &quiet));
  EXPECT_EQ(on_quiet.cause(), StreamDetector::Cause::kNone);
  EXPECT_EQ(quiet.active(), 1u) << "its turns counted as activity";
  bool q = false;
  for (int calls = 0; calls < 200 && !q; ++calls) q = on_busy.Note(calls % 2 ? D::kIn : D::kOut, 100, 256 * 1024, &busy);
  EXPECT_TRUE(q);
  EXPECT_EQ(on_busy.turns(), kBusyTurns) << "qualified at its kBusyTurns-th turn";
  EXPECT_EQ(on_busy.cause(), StreamDetector::Cause::kBusyLoop);
  EXPECT_TRUE(on_busy.streaming());
  // Connection: close: a request, a response, the end.
  EXPECT_FALSE(short_lived.Note(D::kIn, 100, 256 * 1024, &busy));
  EXPECT_FALSE(short_lived.Note(D::kOut, 4096, 256 * 1024, &busy));
  EXPECT_FALSE(short_lived.streaming());
}

TEST(BusyLoopDetector, RingTurnsCountAsActivity) {
  BusyLoop l(2);
  StreamDetector d;
  d.NoteRingIo(StreamDetector::Dir::kOut, &l);
  EXPECT_EQ(l.active(), 0u) << "no turn yet";
  d.NoteRingIo(StreamDetector::Dir::kIn, &l);
  EXPECT_EQ(l.active(), 1u);
}

TEST(BusyLoopDetector, AStreamSaysStream) {
  BusyLoop l(2);
  StreamDetector d;
  bool q = false;
  for (uint32_t i = 0; i < kRunCalls && !q; ++i) q = d.Note(StreamDetector::Dir::kOut, 16, 256 * 1024, &l);
  EXPECT_TRUE(q);
  EXPECT_EQ(d.cause(), StreamDetector::Cause::kStream);
}

}  // namespace
}  // namespace vsocket::guest
