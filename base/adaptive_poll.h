// How long to poll before going to sleep, learned from how long waits
// took. A wait that typically ends within `max` (a request/response peer
// answering in tens of microseconds) is polled for twice its typical length,
// never less than `min`: the answer is caught without a sleep and a
// wake-up, which on a loaded machine cost more than the answer itself. A
// wait that typically takes longer than `max` (an idle connection) is slept
// through after `min`, so idle threads do not spin. max <= min: a fixed
// `min` (adaptation off); min = 0: never polls (lowest CPU, as asked).
//
// Not thread-safe: one per thread (guest library) or per worker.
#pragma once

#include <algorithm>
#include <cstdint>

namespace vsocket {

class AdaptivePoll {
 public:
  AdaptivePoll(int64_t min_ns, int64_t max_ns) : min_(std::max<int64_t>(0, min_ns)), max_(max_ns) {}

  int64_t budget_ns() const {
    if (min_ == 0 || max_ <= min_ || ewma_ > max_) return min_;
    return std::clamp<int64_t>(2 * ewma_, min_, max_);
  }

  // A wait that had to wait (not ready at once) ended after `waited_ns`,
  // ready or timed out. Exponential average, weight 1/4.
  void Record(int64_t waited_ns) {
    waited_ns = std::clamp<int64_t>(waited_ns, 0, 1'000'000'000);
    ewma_ += (waited_ns - ewma_) / 4;
  }

  int64_t typical_ns() const { return ewma_; }

 private:
  int64_t min_, max_;
  int64_t ewma_ = 0;
};

}  // namespace vsocket
