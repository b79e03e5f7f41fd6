#include "guest/core/stream_detector.h"

#include <gtest/gtest.h>

#include <thread>

namespace vsocket::guest {
namespace {

using Dir = StreamDetector::Dir;
constexpr uint64_t kWindow = 256 * 1024;

TEST(StreamDetector, OneWayBulkStreams) {
  StreamDetector d;
  uint64_t moved = 0;
  while (!d.Note(Dir::kOut, 64 * 1024, kWindow)) {
    moved += 64 * 1024;
    ASSERT_LT(moved, kWindow) << "not seen within one window";
  }
  EXPECT_TRUE(d.streaming());
  EXPECT_TRUE(d.Note(Dir::kIn, 1, kWindow)) << "for good";
}

// Decision 98: where the direct-peer rule applies, a ping-pong qualifies
// after kDirectTurns turns (cause kDirectPeer), never before; without the
// rule it never does; declined once, never again by that rule.
TEST(StreamDetector, DirectPeerRuleTakesAKeepAliveConversation) {
  StreamDetector d;
  uint64_t turns = 0;
  bool qualified = false;
  for (int i = 0; i < 100 && !qualified; ++i) {
    qualified = d.Note(i % 2 ? Dir::kIn : Dir::kOut, 64, kWindow, nullptr, true);
    if (!qualified) turns = d.turns();
  }
  ASSERT_TRUE(qualified);
  EXPECT_EQ(d.cause(), StreamDetector::Cause::kDirectPeer);
  EXPECT_EQ(d.turns(), kDirectTurns);
  EXPECT_EQ(turns, kDirectTurns - 1) << "not before kDirectTurns turns";

  StreamDetector off;
  for (int i = 0; i < 200; ++i) ASSERT_FALSE(off.Note(i % 2 ? Dir::kIn : Dir::kOut, 64, kWindow)) << i;

  d.NoDirectPeer();
  EXPECT_FALSE(d.streaming());
  EXPECT_TRUE(d.direct_peer_declined());
  for (int i = 0; i < 200; ++i) ASSERT_FALSE(d.Note(i % 2 ? Dir::kIn : Dir::kOut, 64, kWindow, nullptr, true)) << i;
}

TEST(StreamDetector, ReceivingSideStreamsToo) {
  StreamDetector d;
  bool seen = false;
  for (int i = 0; i < 100 && !seen; ++i) seen = d.Note(Dir::kIn, 16 * 1024, kWindow);
  EXPECT_TRUE(seen);
}

TEST(StreamDetector, ManySmallWritesInARowStream) {
  // A producer of 16 B messages (one of 64 connections of netload): seen
  // after kRunCalls writes, long before a window's bytes.
  StreamDetector d;
  int calls = 0;
  while (!d.Note(Dir::kOut, 16, kWindow)) ASSERT_LT(++calls, 1000);
  EXPECT_EQ(calls + 1, static_cast<int>(kRunCalls));
}

TEST(StreamDetector, ResponsesInAFewPiecesDoNotStream) {
  // Each answer written in 8 pieces (a header, then the body in chunks).
  StreamDetector d;
  for (int i = 0; i < 100'000; ++i) {
    ASSERT_FALSE(d.Note(Dir::kIn, 100, kWindow));
    for (int k = 0; k < 8; ++k) ASSERT_FALSE(d.Note(Dir::kOut, 300, kWindow));
  }
}

TEST(StreamDetector, PingPongNeverStreams) {
  // A million 16 B round trips, and 4 KiB requests with 4 KiB answers.
  StreamDetector small, page;
  for (int i = 0; i < 1'000'000; ++i) {
    ASSERT_FALSE(small.Note(Dir::kOut, 16, kWindow));
    ASSERT_FALSE(small.Note(Dir::kIn, 16, kWindow));
  }
  for (int i = 0; i < 100'000; ++i) {
    ASSERT_FALSE(page.Note(Dir::kOut, 4096, kWindow));
    ASSERT_FALSE(page.Note(Dir::kIn, 4096, kWindow));
  }
  EXPECT_EQ(small.turns(), 1'999'999u);
}

TEST(StreamDetector, PipelinedSmallRequestsDoNotStream) {
  // redis-benchmark -P 16: 16 requests, then 16 answers.
  StreamDetector d;
  for (int i = 0; i < 100'000; ++i) {
    for (int k = 0; k < 16; ++k) ASSERT_FALSE(d.Note(Dir::kOut, 40, kWindow));
    ASSERT_FALSE(d.Note(Dir::kIn, 16 * 8, kWindow));
  }
}

TEST(StreamDetector, LargeAnswersStream) {
  // A small request, then a 1 MiB answer: seen inside the answer.
  StreamDetector d;
  ASSERT_FALSE(d.Note(Dir::kIn, 200, kWindow));
  bool seen = false;
  for (int i = 0; i < 16 && !seen; ++i) seen = d.Note(Dir::kOut, 64 * 1024, kWindow);
  EXPECT_TRUE(seen);
}

TEST(StreamDetector, BulkAfterLongRequestResponseIsSeenWithinAWindow) {
  StreamDetector d;
  for (int i = 0; i < 50'000; ++i) {
    ASSERT_FALSE(d.Note(Dir::kOut, 100, kWindow));
    ASSERT_FALSE(d.Note(Dir::kIn, 100, kWindow));
  }
  uint64_t moved = 0;
  while (!d.Note(Dir::kOut, 8192, kWindow)) {
    moved += 8192;
    ASSERT_LT(moved, 2 * kWindow);
  }
}

TEST(StreamDetector, FullDuplexLargeWritesStream) {
  // Two threads, 64 KiB each way per call, interleaved: 64 KiB per turn.
  StreamDetector d;
  bool seen = false;
  for (int i = 0; i < 8 && !seen; ++i) {
    seen = d.Note(Dir::kOut, 64 * 1024, kWindow) || d.Note(Dir::kIn, 64 * 1024, kWindow);
  }
  EXPECT_TRUE(seen);
}

TEST(StreamDetector, ZeroBytesAreNotATurn) {
  StreamDetector d;
  d.Note(Dir::kOut, 100, kWindow);
  d.Note(Dir::kIn, 0, kWindow);  // EOF or an empty read
  d.Note(Dir::kOut, 100, kWindow);
  EXPECT_EQ(d.turns(), 0u);
}

TEST(StreamDetector, ConcurrentSenderAndReceiverAreSafe) {
  // Run under TSan by the suite: no data race, and a stream is still seen.
  StreamDetector d;
  std::thread tx([&] {
    for (int i = 0; i < 10'000; ++i) d.Note(Dir::kOut, 1024, kWindow);
  });
  std::thread rx([&] {
    for (int i = 0; i < 10'000; ++i) d.Note(Dir::kIn, 16, kWindow);
  });
  tx.join();
  rx.join();
  SUCCEED();
}

}  // namespace
}  // namespace vsocket::guest
