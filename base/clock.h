// Monotonic time for deadlines and measurements (~25 ns per call here).
#pragma once

#include <time.h>

#include <cstdint>

namespace vsocket {

inline int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

inline int64_t MonotonicMs() { return MonotonicNs() / 1000000; }

// A relative timeout given as a timespec (ppoll, epoll_pwait2, recvmmsg):
// whether the kernel would take it (else EINVAL), and its length in
// nanoseconds, kForeverNs for anything that long or longer (~73 years: a
// deadline of now plus it cannot overflow).
inline constexpr int64_t kForeverNs = INT64_MAX / 4;
inline bool TimespecValid(const timespec& ts) {
  return ts.tv_sec >= 0 && ts.tv_nsec >= 0 && ts.tv_nsec < 1000000000;
}
inline int64_t TimespecNs(const timespec& ts) {
  if (ts.tv_sec >= kForeverNs / 1000000000) return kForeverNs;
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}
inline timespec NsTimespec(int64_t ns) {
  return timespec{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
}

}  // namespace vsocket

namespace vsocket {

// One step of a bounded busy-wait: a CPU pause for the first iterations,
// then sched_yield(), so that on a machine with fewer cores than spinning
// threads (2 cores: guest, peer guest, backend) the thread we wait for gets
// to run instead of losing a whole scheduler time slice.
void SpinStep(uint32_t iteration);

}  // namespace vsocket
