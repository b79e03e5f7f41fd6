#include "host-backend/conn/tx_hold.h"

#include <gtest/gtest.h>

namespace vsocket::backend {
namespace {

// Only the frame numbers matter: the test moves them by hand.
class NumberedLink : public fabric::Link {
 public:
  bool Send(const proto::FrameHeader&, std::span<const iovec>, const fabric::RemoteBuffer*) override {
    ++next;
    return true;
  }
  Status Flush() override { return Status::Ok(); }
  bool Writable() const override { return true; }
  uint64_t NextFrameNumber() const override { return next; }
  uint64_t ReleasedThrough() const override { return released; }
  Status Poll(fabric::FrameSink&, int) override { return Status::Ok(); }
  int wake_fd() const override { return -1; }
  bool WantsWritable() const override { return false; }

  uint64_t next = 0, released = 0;
};

// Sends one frame of [start, end) and marks it.
void SendMarked(TxHold& h, NumberedLink& link, uint64_t start, uint64_t end) {
  uint64_t frame = link.NextFrameNumber();
  ASSERT_TRUE(link.Send({}, {}, nullptr));
  h.Sent(&link, 7, frame, start, end);
}

TEST(TxHold, NothingSentReleasesEverythingCopied) {
  TxHold h;
  EXPECT_FALSE(h.Busy());
  EXPECT_EQ(h.Released(1000), 1000u);
  EXPECT_FALSE(h.Withdrawn(5));  // nothing in flight: drop it at once
}

TEST(TxHold, ReleasedFollowsCompletionsInOrder) {
  NumberedLink link;
  link.next = link.released = 10;  // other connections' frames came first
  TxHold h;
  SendMarked(h, link, 0, 100);
  SendMarked(h, link, 100, 250);
  link.Send({}, {}, nullptr);  // another connection's frame in between
  SendMarked(h, link, 250, 300);
  std::vector<uint64_t> drop;
  h.Reap(&drop);
  EXPECT_TRUE(h.Busy());
  EXPECT_EQ(h.Released(300), 0u);  // nothing completed: the credit stays at 0
  link.released = 11;              // the first frame completed
  h.Reap(&drop);
  EXPECT_EQ(h.Released(300), 100u);
  link.released = 13;  // through the other connection's frame
  h.Reap(&drop);
  EXPECT_EQ(h.Released(300), 250u);
  link.released = 14;
  h.Reap(&drop);
  EXPECT_FALSE(h.Busy());
  EXPECT_EQ(h.Released(320), 320u);  // later bytes were copied: all released
  EXPECT_EQ(h.host(), 7u);
  EXPECT_TRUE(drop.empty());
}

TEST(TxHold, CopiedBytesBeforeTheFirstMarkAreReleased) {
  NumberedLink link;
  TxHold h;
  SendMarked(h, link, 500, 600);  // bytes below 500 went bounced
  std::vector<uint64_t> drop;
  h.Reap(&drop);
  EXPECT_EQ(h.Released(600), 500u);
}

TEST(TxHold, WithdrawnRegistrationWaitsForTheLastMarkedFrame) {
  NumberedLink link;
  TxHold h;
  SendMarked(h, link, 0, 10);
  SendMarked(h, link, 10, 20);
  EXPECT_TRUE(h.Withdrawn(42));
  link.Send({}, {}, nullptr);  // frames after the withdrawal do not matter
  std::vector<uint64_t> drop;
  link.released = 1;
  h.Reap(&drop);
  EXPECT_TRUE(drop.empty());
  EXPECT_TRUE(h.HasWithdrawn());
  link.released = 2;
  h.Reap(&drop);
  ASSERT_EQ(drop.size(), 1u);
  EXPECT_EQ(drop[0], 42u);
  EXPECT_FALSE(h.Busy());
}

TEST(TxHold, MarksAreBoundedAndTheNewestAbsorbs) {
  NumberedLink link;
  TxHold h;
  for (uint64_t i = 0; i < 3 * TxHold::kMaxMarks; ++i) SendMarked(h, link, i * 10, i * 10 + 10);
  EXPECT_EQ(h.marks(), TxHold::kMaxMarks);
  std::vector<uint64_t> drop;
  // Everything but the last frame completed: the absorbed ones wait for it.
  link.released = link.next - 1;
  h.Reap(&drop);
  EXPECT_TRUE(h.Busy());
  EXPECT_LT(h.Released(3 * TxHold::kMaxMarks * 10), 3 * TxHold::kMaxMarks * 10);
  link.released = link.next;
  h.Reap(&drop);
  EXPECT_FALSE(h.Busy());
}

TEST(TxHold, ForgetReleasesEverything) {
  NumberedLink link;
  TxHold h;
  SendMarked(h, link, 0, 64);
  EXPECT_TRUE(h.Withdrawn(3));
  std::vector<uint64_t> drop;
  h.Forget(&drop);
  EXPECT_EQ(drop, std::vector<uint64_t>{3});
  EXPECT_FALSE(h.Busy());
  EXPECT_EQ(h.Released(64), 64u);
}

}  // namespace
}  // namespace vsocket::backend
