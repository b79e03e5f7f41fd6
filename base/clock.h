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
