#include "guest/core/busy_loop.h"

#include <gtest/gtest.h>

#include "guest/core/stream_detector.h"

namespace vsocket::guest {
namespace {

void Waits(BusyLoop& l, uint32_t n, int ready) {
  for (uint32_t i = 0; i < n; ++i) l.NoteWait(ready);
}

TEST(BusyLoop, AWindowOfManyReadyPerWaitTurnsItBusy) {
  BusyLoop l(4);
  Waits(l, kBusyWindowWaits - 1, 8);
  EXPECT_FALSE(l.busy()) << "judged only at the end of a window";
  l.NoteWait(8);
  EXPECT_TRUE(l.busy());
  EXPECT_EQ(l.flips(), 1u);
}

TEST(BusyLoop, OneReadyPerWaitNeverTurnsItBusy) {
  BusyLoop l(4);
  Waits(l, 10 * kBusyWindowWaits, 1);  // redis with one client, nginx with Connection: close
  EXPECT_FALSE(l.busy());
  EXPECT_EQ(l.flips(), 0u);
}

TEST(BusyLoop, HysteresisKeepsALoopNearTheLineFromFlipping) {
  BusyLoop l(4);
  Waits(l, kBusyWindowWaits, 6);
  ASSERT_TRUE(l.busy());
  // Between off (2) and on (4): stays busy window after window.
  Waits(l, 8 * kBusyWindowWaits, 3);
  EXPECT_TRUE(l.busy());
  EXPECT_EQ(l.flips(), 1u);
  // Below off: back.
  Waits(l, kBusyWindowWaits, 1);
  EXPECT_FALSE(l.busy());
  // Between again: stays not busy.
  Waits(l, 8 * kBusyWindowWaits, 3);
  EXPECT_FALSE(l.busy());
  EXPECT_EQ(l.flips(), 2u);
}

TEST(BusyLoop, TimeoutsCountAsIdleWaits) {
  BusyLoop l(4);
  Waits(l, kBusyWindowWaits / 2, 8);
  Waits(l, kBusyWindowWaits / 2, 0);  // average 4: busy
  EXPECT_TRUE(l.busy());
  Waits(l, kBusyWindowWaits / 2, 2);
  Waits(l, kBusyWindowWaits / 2, 0);  // average 1
  EXPECT_FALSE(l.busy());
}

TEST(BusyLoop, ZeroNeverTurnsBusy) {
  BusyLoop l(0);  // VSOCKET_BUSY_EVENTS=0
  Waits(l, 4 * kBusyWindowWaits, 64);
  EXPECT_FALSE(l.busy());
}

// The detector's side: a request/response connection qualifies by the busy
// loop only after kBusyTurns turns (a short connection never does), and
// says why.
TEST(BusyLoopDetector, LongLivedRequestResponseQualifiesOnlyWhileBusy) {
  StreamDetector idle, busy, short_lived;
  using D = StreamDetector::Dir;
  for (int i = 0; i < 200; ++i) {
    EXPECT_FALSE(idle.Note(i % 2 ? D::kIn : D::kOut, 100, 256 * 1024, false));
  }
  EXPECT_EQ(idle.cause(), StreamDetector::Cause::kNone);
  bool q = false;
  int calls = 0;
  for (; calls < 200 && !q; ++calls) q = busy.Note(calls % 2 ? D::kIn : D::kOut, 100, 256 * 1024, true);
  EXPECT_TRUE(q);
  EXPECT_EQ(busy.turns(), kBusyTurns) << "qualified at its kBusyTurns-th turn";
  EXPECT_EQ(busy.cause(), StreamDetector::Cause::kBusyLoop);
  EXPECT_TRUE(busy.streaming());
  // Connection: close: a request, a response, the end.
  EXPECT_FALSE(short_lived.Note(D::kIn, 100, 256 * 1024, true));
  EXPECT_FALSE(short_lived.Note(D::kOut, 4096, 256 * 1024, true));
  EXPECT_FALSE(short_lived.streaming());
}

TEST(BusyLoopDetector, AStreamSaysStream) {
  StreamDetector d;
  bool q = false;
  for (uint32_t i = 0; i < kRunCalls && !q; ++i) q = d.Note(StreamDetector::Dir::kOut, 16, 256 * 1024, true);
  EXPECT_TRUE(q);
  EXPECT_EQ(d.cause(), StreamDetector::Cause::kStream);
}

}  // namespace
}  // namespace vsocket::guest
