// The directory threads' backoff: a sleep that a stop ends early.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "base/clock.h"
#include "base/mutex.h"

namespace vsocket::directory {

// Sleeps up to `ms` on `cv`, which the stopping thread notifies (holding
// `mu`) after it set `stop`. True if the time ran out, false once stopped.
inline bool PauseUnlessStopped(Mutex& mu, CondVar& cv, const std::atomic<bool>& stop, int ms) EXCLUDES(mu) {
  int64_t until = MonotonicMs() + ms;
  UniqueLock lock(mu);
  while (!stop.load()) {
    int64_t left = until - MonotonicMs();
    if (left <= 0) return true;
    cv.WaitFor(lock, std::chrono::milliseconds(left));
  }
  return false;
}

}  // namespace vsocket::directory
