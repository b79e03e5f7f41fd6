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

}  // namespace vsocket

namespace vsocket {

// One step of a bounded busy-wait: a CPU pause for the first iterations,
// then sched_yield(), so that on a machine with fewer cores than spinning
// threads (2 cores: guest, peer guest, backend) the thread we wait for gets
// to run instead of losing a whole scheduler time slice.
void SpinStep(uint32_t iteration);

}  // namespace vsocket
