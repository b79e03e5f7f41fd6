#include "guest/core/cpu_share.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <initializer_list>

namespace vsocket::guest {
namespace {

cpu_set_t Cpus(std::initializer_list<int> cpus) {
  cpu_set_t s;
  CPU_ZERO(&s);
  for (int c : cpus) CPU_SET(c, &s);
  return s;
}

TEST(CpuShare, FewSharedCpusSleepAtOnce) {
  CpuShare r = DecideCpuShare(Cpus({0, 1}), Cpus({0, 1}));
  EXPECT_TRUE(r.sleep_at_once);
  EXPECT_EQ(r.mine, 2);
  EXPECT_EQ(r.shared, 2);
  EXPECT_TRUE(DecideCpuShare(Cpus({1}), Cpus({0, 1})).sleep_at_once);
}

TEST(CpuShare, ACpuWithoutTheBackendLetsWaitersPoll) {
  // The operator gave vsocketd its own core.
  CpuShare r = DecideCpuShare(Cpus({0, 1}), Cpus({2}));
  EXPECT_FALSE(r.sleep_at_once);
  EXPECT_EQ(r.shared, 0);
  // vsocketd pinned to one of our CPUs: the other is free for polling.
  r = DecideCpuShare(Cpus({0, 1}), Cpus({1}));
  EXPECT_FALSE(r.sleep_at_once);
  EXPECT_EQ(r.shared, 1);
}

TEST(CpuShare, ManyCpusLetWaitersPoll) {
  EXPECT_FALSE(DecideCpuShare(Cpus({0, 1, 2, 3}), Cpus({0, 1, 2, 3})).sleep_at_once);
  EXPECT_FALSE(DecideCpuShare(Cpus({0, 1, 2, 3, 4, 5, 6, 7}), Cpus({3})).sleep_at_once);
}

TEST(CpuShare, ThisProcessIsVisible) {
  cpu_set_t s, own;
  ASSERT_TRUE(ProcessCpus(getpid(), &s));
  ASSERT_EQ(sched_getaffinity(0, sizeof(own), &own), 0);
  // The union over threads covers this thread's CPUs.
  cpu_set_t both;
  CPU_AND(&both, &s, &own);
  EXPECT_TRUE(CPU_EQUAL(&both, &own));
  EXPECT_FALSE(ProcessCpus(0, &s));
}

TEST(CpuShare, PeerOfAUnixSocket) {
  // The peer of a socketpair is this process: every CPU is shared.
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  CpuShare r = BackendCpuShare(sv[0]);
  cpu_set_t own;
  ASSERT_EQ(sched_getaffinity(0, sizeof(own), &own), 0);
  EXPECT_EQ(r.mine, CPU_COUNT(&own));
  EXPECT_EQ(r.shared, r.mine);
  EXPECT_EQ(r.sleep_at_once, r.mine < kFewCpus);
  close(sv[0]);
  close(sv[1]);
  // Not a unix socket: no peer, no decision.
  EXPECT_FALSE(BackendCpuShare(-1).sleep_at_once);
}

TEST(CpuShare, IdleCpuWhenRunnableThreadsFitTheCpus) {
  EXPECT_TRUE(IdleCpuFrom(1, 2));
  EXPECT_TRUE(IdleCpuFrom(2, 2));  // the caller and its peer, both polling
  EXPECT_FALSE(IdleCpuFrom(3, 2));
  EXPECT_FALSE(IdleCpuFrom(-1, 2));  // unreadable
  EXPECT_FALSE(IdleCpuFrom(1, 0));
}

TEST(CpuShare, LoadavgRunningCount) {
  EXPECT_EQ(LoadavgRunning("0.52 0.58 0.59 2/458 1234\n"), 2);
  EXPECT_EQ(LoadavgRunning("1.00 1.00 1.00 17/3000 99"), 17);
  EXPECT_EQ(LoadavgRunning("0.52 0.58 0.59"), -1);
  EXPECT_EQ(LoadavgRunning(""), -1);
  EXPECT_EQ(LoadavgRunning("garbage"), -1);
}

TEST(CpuShare, LoadavgOfThisMachineCountsTheCaller) {
  // This thread is running: the count read is at least 1.
  FILE* f = std::fopen("/proc/loadavg", "r");
  ASSERT_NE(f, nullptr);
  char line[128] = {};
  ASSERT_NE(std::fgets(line, sizeof(line), f), nullptr);
  std::fclose(f);
  EXPECT_GE(LoadavgRunning(line), 1);
}

}  // namespace
}  // namespace vsocket::guest
