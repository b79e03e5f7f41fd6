#include "base/adaptive_poll.h"

#include <gtest/gtest.h>

namespace vsocket {
namespace {

TEST(AdaptivePoll, StartsAtTheMinimum) {
  AdaptivePoll p(50'000, 500'000);
  EXPECT_EQ(p.budget_ns(), 50'000);
}

TEST(AdaptivePoll, ShortWaitsArePolledForTwiceTheirLength) {
  AdaptivePoll p(50'000, 500'000);
  for (int i = 0; i < 40; ++i) p.Record(90'000);
  EXPECT_NEAR(p.typical_ns(), 90'000, 1'000);
  EXPECT_NEAR(p.budget_ns(), 180'000, 2'000);
}

TEST(AdaptivePoll, BudgetNeverExceedsTheMaximum) {
  AdaptivePoll p(50'000, 500'000);
  for (int i = 0; i < 40; ++i) p.Record(400'000);
  EXPECT_EQ(p.budget_ns(), 500'000);
}

TEST(AdaptivePoll, LongWaitsAreSleptThroughAfterTheMinimum) {
  AdaptivePoll p(50'000, 500'000);
  for (int i = 0; i < 40; ++i) p.Record(90'000);
  for (int i = 0; i < 40; ++i) p.Record(5'000'000);  // the peer went quiet
  EXPECT_EQ(p.budget_ns(), 50'000);
  for (int i = 0; i < 40; ++i) p.Record(80'000);  // and came back
  EXPECT_NEAR(p.budget_ns(), 160'000, 5'000);
}

TEST(AdaptivePoll, OffWhenMaxIsNotAboveMin) {
  AdaptivePoll p(50'000, 0);
  for (int i = 0; i < 40; ++i) p.Record(90'000);
  EXPECT_EQ(p.budget_ns(), 50'000);
}

TEST(AdaptivePoll, ZeroMinimumNeverPolls) {
  AdaptivePoll p(0, 500'000);
  for (int i = 0; i < 40; ++i) p.Record(90'000);
  EXPECT_EQ(p.budget_ns(), 0);
}

TEST(AdaptivePoll, AbsurdSamplesAreClamped) {
  AdaptivePoll p(10'000, 100'000);
  p.Record(-5);
  p.Record(INT64_MAX);
  EXPECT_LE(p.typical_ns(), 1'000'000'000);
  EXPECT_GE(p.typical_ns(), 0);
}

}  // namespace
}  // namespace vsocket
