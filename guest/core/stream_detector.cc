#include "guest/core/stream_detector.h"

namespace vsocket::guest {

bool StreamDetector::Note(Dir d, uint64_t n, uint64_t window) {
  if (streaming()) return true;
  if (n == 0) return false;
  if (d == Dir::kOut) calls_out_.fetch_add(1, std::memory_order_relaxed);
  auto dir = static_cast<uint8_t>(d);
  uint8_t prev = last_.exchange(dir, std::memory_order_relaxed);
  if (prev != 0 && prev != dir) {
    window_turns_.fetch_add(1, std::memory_order_relaxed);
    turns_total_.fetch_add(1, std::memory_order_relaxed);
    run_calls_.store(1, std::memory_order_relaxed);
  } else if (run_calls_.fetch_add(1, std::memory_order_relaxed) + 1 >= kRunCalls) {
    streaming_.store(true, std::memory_order_relaxed);
    return true;
  }
  uint64_t bytes = window_bytes_.fetch_add(n, std::memory_order_relaxed) + n;
  if (bytes < window) return false;
  if (window_turns_.load(std::memory_order_relaxed) <= kMaxTurnsPerWindow) {
    streaming_.store(true, std::memory_order_relaxed);
    return true;
  }
  // A window of request/response: the next one starts afresh, so a
  // connection that turns to bulk later is seen within one window.
  window_bytes_.store(0, std::memory_order_relaxed);
  window_turns_.store(0, std::memory_order_relaxed);
  return false;
}

}  // namespace vsocket::guest
