// Whether this process runs a busy event loop: one whose waits return many
// ready connections at once (decision 83).
//
// Where vsocketd shares the few CPUs, a request/response connection on the
// rings pays two wake-ups per one-way where kernel TCP pays one (decision
// 51), unless many connections are busy at once: then one wake-up of the
// loop, and one pass of vsocketd, serve many of them, and the rings win
// (redis 50 clients 1.7-1.9x, keep-alive HTTP with 32 connections 1.4-1.7x;
// one client 0.6x). An application's own waits say which it is: redis and
// nginx under 50 or 32 busy clients find tens of connections ready per
// wait, under one client one. So the library counts what the application's
// waits return, in windows of kBusyWindowWaits waits; a window averaging at
// least `on_events` turns the loop busy, one below kBusyOffEvents turns it
// back (hysteresis: a loop near the line does not flip every window). While
// busy, a held connection that has turned kBusyTurns times (a keep-alive
// connection, not a short one) registers, tentatively: vsocketd withdraws
// it unless its peer registers within proto::kTentativeWaitMs (the peer's
// process may not be busy).
//
// Thread safety: any thread may note; plain relaxed loads and stores (a
// lost update moves a window's end by a wait, which a heuristic affords).
#pragma once

#include <atomic>
#include <cstdint>

namespace vsocket::guest {

inline constexpr uint32_t kBusyWindowWaits = 32;
inline constexpr uint32_t kBusyOffEvents = 2;  // a window below this average: not busy
inline constexpr uint64_t kBusyTurns = 16;     // a held connection's turns before busy registers it

class BusyLoop {
 public:
  // on_events: the average events per wait that turns the loop busy (0:
  // never).
  explicit BusyLoop(uint32_t on_events) : on_events_(on_events) {}
  // One of the application's waits returned `ready` events (0 on a time-out).
  void NoteWait(int ready);
  bool busy() const { return busy_.load(std::memory_order_relaxed); }
  // Times the loop turned busy or back (the hysteresis at work).
  uint64_t flips() const { return flips_.load(std::memory_order_relaxed); }
  void set_on_events(uint32_t v) { on_events_ = v; }

 private:
  uint32_t on_events_;
  std::atomic<uint32_t> waits_{0};
  std::atomic<uint64_t> events_{0};
  std::atomic<bool> busy_{false};
  std::atomic<uint64_t> flips_{0};
};

// The process's loop signal: noted by the epoll waits (only while the
// upgrade policy holds connections and the backend withdraws tentative
// registrations: Session::BusyLoopRule), read by the stream detector's
// callers.
BusyLoop& ProcessBusyLoop();
// The application's wait returned `ready`: noted if the rule is on.
void NoteAppWait(int ready);

}  // namespace vsocket::guest
