#include "guest/core/busy_loop.h"

#include "guest/core/config.h"
#include "guest/core/session.h"

namespace vsocket::guest {

void BusyLoop::NoteWait(int ready) {
  if (on_events_ == 0) return;
  uint32_t waits = waits_.load(std::memory_order_relaxed) + 1;
  uint64_t events = events_.load(std::memory_order_relaxed) + static_cast<uint64_t>(ready > 0 ? ready : 0);
  if (waits < kBusyWindowWaits) {
    waits_.store(waits, std::memory_order_relaxed);
    events_.store(events, std::memory_order_relaxed);
    return;
  }
  waits_.store(0, std::memory_order_relaxed);
  events_.store(0, std::memory_order_relaxed);
  bool was = busy();
  bool now = was ? events >= uint64_t{kBusyOffEvents} * waits : events >= uint64_t{on_events_} * waits;
  if (now != was) {
    busy_.store(now, std::memory_order_relaxed);
    flips_.store(flips_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
}

BusyLoop& ProcessBusyLoop() {
  static BusyLoop* loop = new BusyLoop(Config().busy_events);  // (never destroyed: waits run until exit)
  return *loop;
}

void NoteAppWait(int ready) {
  if (Session::BusyLoopRule()) ProcessBusyLoop().NoteWait(ready);
}

}  // namespace vsocket::guest
