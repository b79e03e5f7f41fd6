#include "guest/core/stream_detector.h"

#include <algorithm>

#include "base/clock.h"

namespace vsocket::guest {
namespace {

// Every kernel call of a held connection passes here: plain loads and
// stores, no locked read-modify-write (each of those costs tens of cycles,
// and a ping-pong makes four such calls per round trip). Two threads of one
// connection noting at once may lose an update; a heuristic can afford it.
template <typename T>
T Bump(std::atomic<T>& a, T by) {
  T v = a.load(std::memory_order_relaxed) + by;
  a.store(v, std::memory_order_relaxed);
  return v;
}

}  // namespace

bool StreamDetector::BusyPauseOver() const {
  int64_t not_before = busy_not_before_ns_.load(std::memory_order_relaxed);
  return not_before == 0 || MonotonicNs() >= not_before;
}

void StreamDetector::HoldAgain(int64_t now_ns) {
  uint32_t n = withdrawals_.load(std::memory_order_relaxed) + 1;
  withdrawals_.store(n, std::memory_order_relaxed);
  busy_turns_.store(turns_total_.load(std::memory_order_relaxed) + kBusyTurns, std::memory_order_relaxed);
  direct_turns_.store(turns_total_.load(std::memory_order_relaxed) + kDirectTurns, std::memory_order_relaxed);
  int64_t pause = int64_t{1000000000} << std::min<uint32_t>(n - 1, 6);
  busy_not_before_ns_.store(now_ns + pause, std::memory_order_relaxed);
  run_calls_.store(0, std::memory_order_relaxed);
  window_bytes_.store(0, std::memory_order_relaxed);
  window_turns_.store(0, std::memory_order_relaxed);
  streaming_.store(false, std::memory_order_relaxed);  // (cause_ says what it was)
}

void StreamDetector::NoDirectPeer() {
  direct_off_.store(true, std::memory_order_relaxed);
  cause_.store(static_cast<uint8_t>(Cause::kNone), std::memory_order_relaxed);
  streaming_.store(false, std::memory_order_relaxed);
}

bool StreamDetector::Note(Dir d, uint64_t n, uint64_t window, BusyLoop* loop, bool direct_rule) {
  if (streaming()) return true;
  if (n == 0) return false;
  if (d == Dir::kOut) Bump<uint64_t>(calls_out_, 1);
  auto dir = static_cast<uint8_t>(d);
  uint8_t prev = last_.load(std::memory_order_relaxed);
  if (prev != dir) last_.store(dir, std::memory_order_relaxed);
  if (prev != 0 && prev != dir) {
    Bump<uint32_t>(window_turns_, 1);
    if (loop != nullptr) loop->NoteTurn(active_epoch_);
    uint64_t turns = Bump<uint64_t>(turns_total_, 1);
    if (turns >= busy_turns_.load(std::memory_order_relaxed) && loop != nullptr && loop->busy() && BusyPauseOver()) {
      cause_.store(static_cast<uint8_t>(Cause::kBusyLoop), std::memory_order_relaxed);
      streaming_.store(true, std::memory_order_relaxed);
      return true;
    }
    if (direct_rule && turns >= direct_turns_.load(std::memory_order_relaxed) &&
        !direct_off_.load(std::memory_order_relaxed) && BusyPauseOver()) {
      cause_.store(static_cast<uint8_t>(Cause::kDirectPeer), std::memory_order_relaxed);
      streaming_.store(true, std::memory_order_relaxed);
      return true;
    }
    run_calls_.store(1, std::memory_order_relaxed);
  } else if (Bump<uint32_t>(run_calls_, 1) >= kRunCalls) {
    cause_.store(static_cast<uint8_t>(Cause::kStream), std::memory_order_relaxed);
    streaming_.store(true, std::memory_order_relaxed);
    return true;
  }
  uint64_t bytes = Bump<uint64_t>(window_bytes_, n);
  if (bytes < window) return false;
  if (window_turns_.load(std::memory_order_relaxed) <= kMaxTurnsPerWindow) {
    cause_.store(static_cast<uint8_t>(Cause::kStream), std::memory_order_relaxed);
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
