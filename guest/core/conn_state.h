// Where a connection is in its life, and every way it can move on.
//
// One connection has one ConnState. Its phase changes only through
// Apply(event), whose whole table is kTransitions in conn_state.cc (and the
// diagram in docs/connection-lifecycle.md, generated from the same table by
// conn_state_test). An event the table does not allow in the current phase
// is refused: Apply returns false and nothing changes.
//
// Besides the phase, the state keeps what the report and the data path
// need to know about the current registration: whether it was upgraded,
// whether the link was lost (resynced), whether close() lingered; and each
// direction's own progress: TX switched to the ring (our FENCE sent), RX
// switched (the peer's fence reached), and after a link loss the RX steps
// through the peer's RESYNC (ring, header, skip, kernel).
//
// Thread safety: event dispatch (under the session lock) and socket calls
// (under the connection's locks) both apply events; Apply serializes them
// on a lock of its own (transitions are rare: never per byte), and readers
// load lock-free (acquire pairs with the release of the transition). The
// direction flags are written under tx_mu / rx_mu.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>

#include "proto/control.h"

namespace vsocket::guest {

enum class Phase : uint8_t {
  kUnprobed,   // not looked at yet: registered at its first I/O
  kKernel,     // kernel TCP for good (reason() says why)
  kPending,    // registered; kernel TCP until the backend pairs it
  kUpgraded,   // paired: each direction switches to the rings at its fence
  kResyncing,  // the accelerated path was lost: finishing on kernel TCP (RESYNC)
  kLingering,  // closed by the application; the peer has not consumed our bytes yet
  kReset,      // the accelerated path failed: the application sees ECONNRESET
  kClosed,     // unregistered: nothing more happens on the accelerated path
  // The backend withdrew the registration before any upgrade (DOWNGRADE
  // while pending: the peer is not coming): kernel TCP; the registration
  // and its rings are ours to end (UNREGISTER at the next call or close).
  kWithdrawn,
};
inline constexpr int kPhaseCount = 9;
const char* ToString(Phase p);

enum class ConnEvent : uint8_t {
  kRegistered,     // REGISTER_CONN sent: kernel TCP until UPGRADE
  kKernelForGood,  // not eligible, refused, no backend, or a rule: stays on kernel TCP
  kUpgrade,        // the backend's UPGRADE: paired
  kPeerWithdrew,   // DOWNGRADE: before the upgrade the peer is not there; after it, an abort
  kLinkLost,       // DOWNGRADE for a lost link, with byte counts that agree: RESYNC
  kFail,           // the accelerated path failed (protocol error, bytes unaccounted for)
  kBackendLost,    // the session with vsocketd is gone: RESYNC, or register with the next one
  kForked,         // in a forked child: the registration is the parent's
  kResynced,       // both directions finished the RESYNC: register again to re-upgrade
  kLinger,         // close() while the peer has not consumed our accelerated bytes
  kClose,          // UNREGISTER: the end of the registration
  kDrain,          // asked to leave the rings with clean fences (a drain, or the peer's ring end)
  kDrained,        // our ring stream ended and the peer consumed all of it: TX on kernel TCP
  kEndWithdrawn,   // a withdrawn registration ended (UNREGISTER): kernel TCP for good
  kHoldAgain,      // a tentative one ended (decision 83): held, to qualify again later
};
inline constexpr int kEventCount = 15;
const char* ToString(ConnEvent e);

// RX after a link loss: the bytes already in the ring, then the peer's
// RESYNC header on the kernel stream, then the resent bytes we already had
// (skipped), then plain kernel TCP.
enum class RxResync : uint8_t { kRing, kHeader, kSkip, kKernel };
const char* ToString(RxResync r);

// A drain's own steps (connection-lifecycle.md §9), one sub-machine per
// direction, each step taken once per registration: TX ends our ring stream
// (SHUTDOWN ring end posted; the phase's kDrained follows once the peer
// consumed it); RX learns that the peer's ring stream ended (everything of
// it landed in our RX ring), or that the link or vsocketd went first
// (broken: the RESYNC rules apply in full). Table kDrainTransitions in
// conn_state.cc; the diagram in §9 is generated from it.
enum class DrainTx : uint8_t { kOnRing, kRingEnded };
enum class DrainRx : uint8_t { kOnRing, kPeerEnded, kBroken };
enum class DrainEvent : uint8_t {
  kTxRingEnd,    // under tx_mu, while draining: our SHUTDOWN(ring end) posted
  kPeerRingEnd,  // the peer's SHUTDOWN(ring end), after the upgrade
  kBreak,        // the link or the backend went while draining
};
const char* ToString(DrainTx s);
const char* ToString(DrainRx s);
const char* ToString(DrainEvent e);

// The mode a report shows (docs/tenant-guide.md): "kernel", "kernel-pending"
// or "accelerated" ("unprobed" is never reported).
enum class Mode : uint8_t { kUnprobed, kKernel, kPending, kAccel };
const char* ToString(Mode m);

class ConnState {
 public:
  // The table: the phase `e` leads to from `from`, or nullopt (refused).
  static std::optional<Phase> Next(Phase from, ConnEvent e);

  // Moves to Next(phase(), e), recording `why` as the reason (events that
  // carry none keep the current one; kUpgrade clears it). False if the
  // table refuses e in the current phase: then nothing changes.
  bool Apply(ConnEvent e, std::optional<proto::Reason> why = std::nullopt);

  Phase phase() const { return phase_.load(std::memory_order_acquire); }
  proto::Reason reason() const { return reason_.load(std::memory_order_acquire); }

  // Derived views of the phase.
  // Registered with the backend: UNREGISTER is owed at the end.
  bool registered() const;
  // The old "accelerated mode": upgraded in this registration and not
  // closed or back on kernel TCP for good (includes a reset or resyncing
  // connection, whose own checks come first).
  bool accelerated() const;
  bool reset() const { return phase() == Phase::kReset; }
  Mode mode() const;
  // The mode a report shows: after a link loss, or while waiting to
  // register again, "kernel".
  const char* ReportedMode() const;

  // History of the current registration (cleared by kResynced).
  bool upgraded() const { return upgraded_.load(std::memory_order_acquire); }
  // The accelerated path was lost after the upgrade (the phase went
  // resyncing): the RESYNC rules apply from then on, whatever the phase is
  // now.
  bool resynced() const { return resynced_.load(std::memory_order_acquire); }
  // (Not cleared: a report says whether close() ever lingered.)
  bool lingered() const { return lingered_.load(std::memory_order_acquire); }
  // Downgrades over the connection's life (the accelerated path was lost:
  // fabric-down for a link, backend-unavailable for vsocketd), the last
  // one's reason, and the time spent on kernel TCP after them until the next
  // upgrade (or until now). Not cleared either.
  uint32_t downgrades() const { return downgrades_.load(std::memory_order_relaxed); }
  proto::Reason last_downgrade() const { return last_downgrade_.load(std::memory_order_relaxed); }
  int64_t kernel_ns_after_downgrades(int64_t now_ns) const {
    int64_t since = kernel_since_ns_.load(std::memory_order_relaxed);
    return kernel_ns_.load(std::memory_order_relaxed) + (since != 0 ? now_ns - since : 0);
  }

  // Asked to leave the rings (kDrain; cleared by kResynced): each direction
  // ends its ring stream and goes on on kernel TCP (connection-lifecycle.md
  // §9). The RX steps (AdvanceRxResync) may start before the phase changes.
  bool draining() const { return drain_.load(std::memory_order_acquire); }
  // The drain's steps (DrainTx, DrainRx above). Apply refuses a step the
  // table does not allow from the direction's current state, a TX ring end
  // or a break while not draining, and a peer ring end before the upgrade.
  // Release: what the caller stored for the step (the ring end's count, the
  // landed bytes) is seen by whoever sees the step.
  bool ApplyDrain(DrainEvent e);
  static std::optional<DrainTx> NextTx(DrainTx from, DrainEvent e);
  static std::optional<DrainRx> NextRx(DrainRx from, DrainEvent e);
  DrainTx drain_tx() const { return drain_tx_.load(std::memory_order_acquire); }
  DrainRx drain_rx() const { return drain_rx_.load(std::memory_order_acquire); }
  bool tx_ring_ended() const { return drain_tx() == DrainTx::kRingEnded; }
  bool peer_ring_ended() const { return drain_rx() == DrainRx::kPeerEnded; }
  bool drain_broken() const { return drain_rx() == DrainRx::kBroken; }
  // Whether what landed in our RX ring is all of the peer's ring stream
  // (always, but during a drain before the peer's ring end or a break).
  bool ring_final() const { return !draining() || drain_rx() != DrainRx::kOnRing; }

  // Directions. Each switches once per registration and only after the
  // upgrade (false: refused).
  bool tx_on_ring() const { return tx_ring_.load(std::memory_order_acquire); }
  bool rx_on_ring() const { return rx_ring_.load(std::memory_order_acquire); }
  bool SwitchTx();  // under tx_mu: our FENCE is posted, writes go to the TX ring
  bool SwitchRx();  // under rx_mu: the peer's fence is reached, reads come from RX

  RxResync rx_resync() const { return rx_resync_.load(std::memory_order_acquire); }
  // Under rx_mu, only while resynced() or draining(): kRing -> kHeader | kKernel,
  // kHeader -> kSkip | kKernel, kSkip -> kKernel. False: refused.
  bool AdvanceRxResync(RxResync to);

  // Refused events since the process started (for tests and the debug log).
  static uint64_t refused_total();
  // In a forked child: the lock another thread may have held is released.
  void AfterForkInChild();

 private:
  std::mutex mu_;  // serializes Apply
  std::atomic<Phase> phase_{Phase::kUnprobed};
  std::atomic<proto::Reason> reason_{proto::Reason::kPending};
  std::atomic<bool> upgraded_{false};
  std::atomic<bool> resynced_{false};
  std::atomic<bool> lingered_{false};
  std::atomic<bool> drain_{false};
  std::atomic<uint32_t> downgrades_{0};
  std::atomic<proto::Reason> last_downgrade_{proto::Reason::kNone};
  std::atomic<int64_t> kernel_since_ns_{0};
  std::atomic<int64_t> kernel_ns_{0};
  std::atomic<bool> tx_ring_{false};
  std::atomic<bool> rx_ring_{false};
  std::atomic<RxResync> rx_resync_{RxResync::kRing};
  std::atomic<DrainTx> drain_tx_{DrainTx::kOnRing};
  std::atomic<DrainRx> drain_rx_{DrainRx::kOnRing};
};

}  // namespace vsocket::guest
