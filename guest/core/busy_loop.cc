#include "guest/core/busy_loop.h"

#include <time.h>

#include "base/clock.h"
#include "base/log.h"
#include "guest/core/config.h"
#include "guest/core/session.h"

namespace vsocket::guest {

// Read at every turn of every held connection: the coarse clock (a read of
// the kernel's last tick, ~1-4 ms old, no TSC read: the fine clock's read
// was ~2% of a held connection's library time, bench/conn_cost) is fine
// for epochs of ~16.8 ms, and epochs are compared only with each other.
uint32_t BusyLoop::Epoch() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<uint32_t>((int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec) >> kEpochShift);
}

void BusyLoop::NoteTurnAt(std::atomic<uint32_t>& conn_epoch, uint32_t epoch) {
  if (conn_epoch.load(std::memory_order_relaxed) == epoch) return;
  conn_epoch.store(epoch, std::memory_order_relaxed);
  uint32_t cur = epoch_.load(std::memory_order_relaxed);
  if (cur != epoch) {
    // A new epoch: the one that ended is the last whole one (if it was the
    // one just before).
    last_count_.store(cur + 1 == epoch ? count_.load(std::memory_order_relaxed) : 0, std::memory_order_relaxed);
    count_.store(0, std::memory_order_relaxed);
    epoch_.store(epoch, std::memory_order_relaxed);
  }
  count_.store(count_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

uint32_t BusyLoop::active(uint32_t epoch) const {
  uint32_t cur = epoch_.load(std::memory_order_relaxed);
  uint32_t n = count_.load(std::memory_order_relaxed), last = last_count_.load(std::memory_order_relaxed);
  if (cur == epoch) return n > last ? n : last;
  if (cur + 1 == epoch) return n;  // the last whole epoch
  return 0;                        // nothing turned for two epochs
}

void BusyLoop::NoteWait(int ready) {
  if (on_events_ == 0) return;
  uint64_t r = static_cast<uint64_t>(ready > 0 ? ready : 0);
  waits_total_.store(waits_total_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  ready_total_.store(ready_total_.load(std::memory_order_relaxed) + r, std::memory_order_relaxed);
  uint32_t waits = waits_.load(std::memory_order_relaxed) + 1;
  uint64_t events = events_.load(std::memory_order_relaxed) + r;
  if (waits < kBusyWindowWaits) {
    waits_.store(waits, std::memory_order_relaxed);
    events_.store(events, std::memory_order_relaxed);
    return;
  }
  waits_.store(0, std::memory_order_relaxed);
  events_.store(0, std::memory_order_relaxed);
  uint32_t conns = active(test_epoch_ != 0 ? test_epoch_ : Epoch());
  bool was = busy();
  bool now = was ? 2 * events >= 3 * uint64_t{waits} && conns >= kIdleConns
                 : events >= uint64_t{on_events_} * waits && conns >= kBusyConns;
  if (now != was) {
    busy_.store(now, std::memory_order_relaxed);
    since_ns_.store(MonotonicNs(), std::memory_order_relaxed);
    flips_.store(flips_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    VS_LOG(kDebug, "event loop %s: %.1f ready per wait, %u connections active", now ? "busy" : "no longer busy",
           static_cast<double>(events) / waits, conns);
  }
}

BusyLoop& ProcessBusyLoop() {
  static BusyLoop* loop = new BusyLoop(Config().busy_events);  // (never destroyed: waits run until exit)
  return *loop;
}

BusyLoop* ActiveBusyLoop() { return Session::BusyLoopRule() ? &ProcessBusyLoop() : nullptr; }

void NoteAppWait(int ready) {
  if (BusyLoop* loop = ActiveBusyLoop()) loop->NoteWait(ready);
}

}  // namespace vsocket::guest
