// Whether a connection still on kernel TCP streams: moves many bytes per
// turn of the conversation, where acceleration pays even when vsocketd has
// no CPU of its own (decision 51).
//
// A turn is a change of direction: a send after a receive, or a receive
// after a send. Request/response traffic (redis, PostgreSQL, HTTP with a
// small body, a ping-pong) turns once per message; a bulk transfer, a
// pipelined producer or a large response turns rarely. Two signs of a
// stream, either marks the connection for good:
// - kRunCalls calls in a row in one direction, with no turn (however small
//   each is: a producer of small messages, which on kernel TCP may take
//   seconds to move a window's bytes);
// - a window of `window` bytes with at most kMaxTurnsPerWindow turns (at
//   least window/8 bytes per turn: large messages both ways).
//
// Thread safety: a sender and a receiver may note at once. The counters are
// atomics, updated with plain loads and stores (no locked read-modify-write
// on the kernel path of every call): a race may lose an update, which only
// moves the moment a window closes by a call, and a heuristic can afford.
#pragma once

#include <atomic>
#include <cstdint>

#include "guest/core/busy_loop.h"

namespace vsocket::guest {

inline constexpr uint32_t kMaxTurnsPerWindow = 8;
inline constexpr uint32_t kRunCalls = 64;
// A held connection's turns before the direct-peer rule registers it
// (decision 98): a keep-alive conversation, never a connection per request.
inline constexpr uint64_t kDirectTurns = 16;

class StreamDetector {
 public:
  enum class Dir : uint8_t { kNone = 0, kOut = 1, kIn = 2 };
  // Why the connection qualified: it streams, or it has turned kBusyTurns
  // times while its process's event loop is busy (busy_loop.h), or it has
  // turned kDirectTurns times where its peer may be a direct pair's
  // (decision 98).
  enum class Cause : uint8_t { kNone = 0, kStream = 1, kBusyLoop = 2, kDirectPeer = 3 };

  // n bytes moved on the kernel path in direction d; true once the
  // connection qualifies (and from then on). loop: the process's busy-loop
  // signal (its turns are counted there; null: no busy-loop rule).
  // direct_rule: the direct-peer rule applies (Session::DirectPeerRule).
  bool Note(Dir d, uint64_t n, uint64_t window, BusyLoop* loop = nullptr, bool direct_rule = false);
  // Bytes moved on the rings in direction d: only its turns, for the loop's
  // activity (an accelerated connection is as active as a held one).
  void NoteRingIo(Dir d, BusyLoop* loop) {
    auto dir = static_cast<uint8_t>(d);
    uint8_t prev = last_.load(std::memory_order_relaxed);
    if (prev == dir) return;
    last_.store(dir, std::memory_order_relaxed);
    if (prev == 0) return;
    turns_total_.store(turns_total_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    if (loop != nullptr) loop->NoteTurn(active_epoch_);
  }
  // Qualified for registration (it streams, or a busy loop's long-lived
  // connection: cause()).
  bool streaming() const { return streaming_.load(std::memory_order_relaxed); }
  Cause cause() const { return static_cast<Cause>(cause_.load(std::memory_order_relaxed)); }

  uint64_t turns() const { return turns_total_.load(std::memory_order_relaxed); }
  // Its tentative registration was withdrawn (decision 83) and it is held
  // again at now_ns: it qualifies by the busy loop again only after
  // another kBusyTurns turns and a pause of 1 s, doubled with each
  // withdrawal (up to 64 s), so a peer that never comes costs a
  // registration (and 500 ms pending) ever more rarely.
  void HoldAgain(int64_t now_ns);
  // Its registration for a direct pair was declined (its peer is not a
  // process this one may share memory with, decision 98): held again, at
  // once, and never registered for that rule again (the others still
  // apply).
  void NoDirectPeer();
  bool direct_peer_declined() const { return direct_off_.load(std::memory_order_relaxed); }
  uint32_t withdrawals() const { return withdrawals_.load(std::memory_order_relaxed); }
  // Calls noted in direction kOut (until it streams): with the bytes sent,
  // the average write (REGISTER_CONN's kRegisterBulk, decision 62).
  uint64_t calls_out() const { return calls_out_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint8_t> last_{0};
  std::atomic<uint32_t> run_calls_{0};
  std::atomic<uint64_t> window_bytes_{0};
  std::atomic<uint32_t> window_turns_{0};
  std::atomic<uint64_t> turns_total_{0};
  std::atomic<uint64_t> calls_out_{0};
  bool BusyPauseOver() const;
  std::atomic<bool> streaming_{false};
  std::atomic<uint8_t> cause_{0};
  std::atomic<uint32_t> active_epoch_{0};  // BusyLoop::NoteTurn's mark
  std::atomic<uint64_t> busy_turns_{kBusyTurns};  // turns before the busy loop takes it
  std::atomic<int64_t> busy_not_before_ns_{0};    // ... and not before this time
  std::atomic<uint32_t> withdrawals_{0};
  std::atomic<uint64_t> direct_turns_{kDirectTurns};  // turns before the direct-peer rule takes it
  std::atomic<bool> direct_off_{false};               // declined: never for that rule again
};

}  // namespace vsocket::guest
