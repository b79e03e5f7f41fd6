// Whether this process runs a busy event loop: many connections active
// together, and waits that find several of them ready at once (decision 83).
//
// Where vsocketd shares the few CPUs, a request/response connection on the
// rings pays two wake-ups per one-way where kernel TCP pays one (decision
// 51), unless many connections are busy at once: then one wake-up of the
// loop, and one pass of vsocketd, serve many of them, and the rings win.
// Measured on these machines (kernel TCP = 1.0, --upgrade always):
// redis-benchmark with 2, 4, 8 clients 0.4-0.5, 16 clients 1.0-1.1, 50
// clients 1.7-2.0; nginx with wrk -t2 -c16 (16 connections, 8 per wrk
// thread) 1.5. So two signals, both needed:
// - activity: the process's connections that turned (a request after an
//   answer, an answer after a request) within one epoch of ~16.8 ms
//   (kEpochShift), at least kBusyConns (16; back below kIdleConns, 8);
// - batching: the application's waits return on average at least
//   `on_events` (2) ready events per wait over a window of
//   kBusyWindowWaits (back below 1.5; a thousand mostly idle connections
//   are active, but one at a time).
// The loop's state is judged at the end of each window of waits, with
// hysteresis (the flips are counted). While busy, a held connection that
// has turned kBusyTurns times (a keep-alive connection, not a short one)
// registers, tentatively: vsocketd withdraws it unless its peer registers
// within proto::kTentativeWaitMs (the peer's process may not be busy).
//
// Thread safety: any thread may note; plain relaxed loads and stores (a
// lost update moves a window's end by a wait, or an epoch's count by one,
// which a heuristic affords).
#pragma once

#include <atomic>
#include <cstdint>

namespace vsocket::guest {

inline constexpr uint32_t kBusyWindowWaits = 32;
inline constexpr uint64_t kBusyTurns = 16;  // a held connection's turns before busy registers it
inline constexpr uint32_t kBusyConns = 16;  // connections turning in an epoch: busy
inline constexpr uint32_t kIdleConns = 8;   // fewer: not busy any more
inline constexpr int kEpochShift = 24;      // an epoch: 2^24 ns of the monotonic clock

class BusyLoop {
 public:
  // on_events: the average ready events per wait that (with kBusyConns
  // active) turns the loop busy; 0: never.
  explicit BusyLoop(uint32_t on_events) : on_events_(on_events) {}
  // One of the application's waits returned `ready` events (0 on a time-out).
  void NoteWait(int ready);
  // A connection turned; conn_epoch is its own mark (counted once an epoch).
  void NoteTurn(std::atomic<uint32_t>& conn_epoch) { NoteTurnAt(conn_epoch, Epoch()); }
  void NoteTurnAt(std::atomic<uint32_t>& conn_epoch, uint32_t epoch);
  bool busy() const { return busy_.load(std::memory_order_relaxed); }
  // Connections that turned in the last whole epoch (or this one, if more).
  uint32_t active(uint32_t epoch) const;
  uint32_t active() const { return active(Epoch()); }
  // Times the loop turned busy or back (the hysteresis at work).
  uint64_t flips() const { return flips_.load(std::memory_order_relaxed); }
  // How long it has been not busy (0 while busy): since its last flip, or
  // since it was made.
  int64_t quiet_ns(int64_t now_ns) const {
    return busy() ? 0 : now_ns - since_ns_.load(std::memory_order_relaxed);
  }
  // Every wait noted, and their ready events (reports, tuning).
  uint64_t waits_total() const { return waits_total_.load(std::memory_order_relaxed); }
  uint64_t ready_total() const { return ready_total_.load(std::memory_order_relaxed); }
  static uint32_t Epoch();
  // For tests: judge at this epoch instead of the clock's.
  void set_epoch_for_testing(uint32_t e) { test_epoch_ = e; }

 private:
  uint32_t on_events_;
  std::atomic<uint32_t> waits_{0};
  std::atomic<uint64_t> events_{0};
  std::atomic<bool> busy_{false};
  std::atomic<uint64_t> flips_{0};
  std::atomic<int64_t> since_ns_{0};  // MonotonicNs() of the last flip
  std::atomic<uint64_t> waits_total_{0};
  std::atomic<uint64_t> ready_total_{0};
  std::atomic<uint32_t> epoch_{0};
  std::atomic<uint32_t> count_{0};       // connections that turned in epoch_
  std::atomic<uint32_t> last_count_{0};  // in the epoch before it
  uint32_t test_epoch_ = 0;
};

// The process's loop signal: noted by the epoll waits (only while the
// upgrade policy holds connections and the backend withdraws tentative
// registrations: Session::BusyLoopRule), read by the stream detector's
// callers.
BusyLoop& ProcessBusyLoop();
// ProcessBusyLoop() while the rule is on, else null (nothing to note).
BusyLoop* ActiveBusyLoop();
// The application's wait returned `ready`: noted if the rule is on.
void NoteAppWait(int ready);

}  // namespace vsocket::guest
