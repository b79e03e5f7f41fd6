#include "base/own_fd.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "base/unique_fd.h"
#include "gtest/gtest.h"

namespace vsocket {
namespace {

using Runs = std::vector<std::pair<unsigned, unsigned>>;

Runs RunsOf(unsigned first, unsigned last) {
  Runs runs;
  ForEachRunWithoutOwnFds(first, last, [&](unsigned lo, unsigned hi) { runs.emplace_back(lo, hi); });
  return runs;
}

// (One binary, one order: protection cannot be turned off again.)
TEST(OwnFd, OffLeavesFdsAsTheyAreThenOnNumbersThemHighAndKnowsThem) {
  int e = eventfd(0, EFD_CLOEXEC);
  ASSERT_GE(e, 0);
  EXPECT_EQ(OwnFd(e), e);
  EXPECT_FALSE(IsOwnFd(e));
  EXPECT_EQ(RunsOf(3, 100), (Runs{{3, 100}}));
  close(e);

  ProtectOwnFds();
  int low = eventfd(0, EFD_CLOEXEC);
  ASSERT_GE(low, 0);
  ASSERT_LT(low, OwnFdFloor());
  int mine = OwnFd(low);
  EXPECT_GE(mine, OwnFdFloor());
  EXPECT_TRUE(IsOwnFd(mine));
  EXPECT_FALSE(IsOwnFd(low));
  EXPECT_EQ(fcntl(low, F_GETFD), -1) << "the low number is closed";
  EXPECT_EQ(fcntl(mine, F_GETFD), FD_CLOEXEC);
  {
    UniqueFd owned(mine);  // closing through UniqueFd forgets it first
  }
  EXPECT_FALSE(IsOwnFd(mine));
  EXPECT_EQ(OwnFd(-1), -1);
}

TEST(OwnFd, RunsSkipOwnFdsAcrossWordsAndToTheEnd) {
  ProtectOwnFds();
  for (int fd : {5, 63, 64, 65, 200}) MarkOwnFd(fd);
  EXPECT_EQ(RunsOf(3, 300), (Runs{{3, 4}, {6, 62}, {66, 199}, {201, 300}}));
  EXPECT_EQ(RunsOf(63, 65), Runs{});
  EXPECT_EQ(RunsOf(64, 64), Runs{});
  EXPECT_EQ(RunsOf(6, 6), (Runs{{6, 6}}));
  EXPECT_EQ(RunsOf(190, ~0u), (Runs{{190, 199}, {201, ~0u}}));
  EXPECT_EQ(RunsOf(70000, ~0u), (Runs{{70000, ~0u}}));
  EXPECT_EQ(RunsOf(10, 9), Runs{});
  MarkOwnFd(kOwnFdLimit - 1);
  EXPECT_EQ(RunsOf(kOwnFdLimit - 2, kOwnFdLimit),
            (Runs{{kOwnFdLimit - 2, kOwnFdLimit - 2}, {kOwnFdLimit, kOwnFdLimit}}));
  MarkOwnFd(kOwnFdLimit);  // beyond the registry: not held
  EXPECT_FALSE(IsOwnFd(kOwnFdLimit));
  for (int fd : {5, 63, 64, 65, 200, kOwnFdLimit - 1}) DisownFd(fd);
  EXPECT_EQ(RunsOf(0, 1000), (Runs{{0, 1000}}));
}

}  // namespace
}  // namespace vsocket
