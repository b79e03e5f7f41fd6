#include "guest/core/conn_state.h"

#include <new>

#include "base/clock.h"
#include "base/log.h"

namespace vsocket::guest {

using proto::Reason;

namespace {

struct Transition {
  Phase from;
  ConnEvent event;
  Phase to;
};

// Every allowed change of phase; anything else is refused. Read it by
// phase: what can happen to a connection in it.
constexpr Transition kTransitions[] = {
    // First I/O: registered, or kernel TCP for good.
    {Phase::kUnprobed, ConnEvent::kRegistered, Phase::kPending},
    {Phase::kUnprobed, ConnEvent::kKernelForGood, Phase::kKernel},
    // No backend now, for a connection that had one: registered later.
    {Phase::kUnprobed, ConnEvent::kBackendLost, Phase::kUnprobed},
    // Waiting to register again when the process forks: the parent's.
    {Phase::kUnprobed, ConnEvent::kForked, Phase::kKernel},
    // Registered, waiting for the peer. Whatever goes wrong here leaves the
    // kernel stream exact: back to kernel TCP, never a reset.
    {Phase::kPending, ConnEvent::kUpgrade, Phase::kUpgraded},
    {Phase::kPending, ConnEvent::kKernelForGood, Phase::kKernel},  // the registration was refused
    {Phase::kPending, ConnEvent::kPeerWithdrew, Phase::kWithdrawn},
    {Phase::kPending, ConnEvent::kBackendLost, Phase::kUnprobed},  // registers again with the next backend
    {Phase::kPending, ConnEvent::kForked, Phase::kKernel},
    {Phase::kPending, ConnEvent::kClose, Phase::kClosed},
    // Upgraded: bytes may be in the rings. A lost link or a lost backend is
    // repaired on kernel TCP (RESYNC); anything that loses track of bytes
    // resets.
    {Phase::kUpgraded, ConnEvent::kLinkLost, Phase::kResyncing},
    {Phase::kUpgraded, ConnEvent::kBackendLost, Phase::kResyncing},
    {Phase::kUpgraded, ConnEvent::kPeerWithdrew, Phase::kReset},  // the peer aborted
    {Phase::kUpgraded, ConnEvent::kFail, Phase::kReset},
    {Phase::kUpgraded, ConnEvent::kForked, Phase::kReset},
    {Phase::kUpgraded, ConnEvent::kLinger, Phase::kLingering},
    {Phase::kUpgraded, ConnEvent::kClose, Phase::kClosed},
    // A drain: still upgraded until our ring stream ended and the peer
    // consumed it, then kernel TCP with a clean fence (nothing to resend).
    {Phase::kUpgraded, ConnEvent::kDrain, Phase::kUpgraded},
    {Phase::kUpgraded, ConnEvent::kDrained, Phase::kResyncing},
    // Closed by the application, our bytes not yet consumed (close.cc).
    {Phase::kLingering, ConnEvent::kLinkLost, Phase::kResyncing},
    {Phase::kLingering, ConnEvent::kPeerWithdrew, Phase::kReset},
    {Phase::kLingering, ConnEvent::kFail, Phase::kReset},
    {Phase::kLingering, ConnEvent::kBackendLost, Phase::kResyncing},
    {Phase::kLingering, ConnEvent::kClose, Phase::kClosed},
    // Back on kernel TCP after a link loss (resync.cc).
    {Phase::kResyncing, ConnEvent::kResynced, Phase::kUnprobed},
    {Phase::kResyncing, ConnEvent::kKernelForGood, Phase::kKernel},  // could not register again
    {Phase::kResyncing, ConnEvent::kPeerWithdrew, Phase::kReset},
    {Phase::kResyncing, ConnEvent::kFail, Phase::kReset},
    {Phase::kResyncing, ConnEvent::kBackendLost, Phase::kResyncing},  // it needs no backend
    {Phase::kResyncing, ConnEvent::kForked, Phase::kReset},
    {Phase::kResyncing, ConnEvent::kClose, Phase::kClosed},
    // Reset: only its registration is left to end (the reason may change:
    // a later failure names itself).
    {Phase::kReset, ConnEvent::kFail, Phase::kReset},
    {Phase::kReset, ConnEvent::kBackendLost, Phase::kReset},
    {Phase::kReset, ConnEvent::kForked, Phase::kReset},
    {Phase::kReset, ConnEvent::kClose, Phase::kClosed},
    // Withdrawn before any upgrade: kernel TCP exact; our UNREGISTER ends
    // it (or the close's, or the backend's loss, or the fork's parent).
    {Phase::kWithdrawn, ConnEvent::kEndWithdrawn, Phase::kKernel},
    {Phase::kWithdrawn, ConnEvent::kHoldAgain, Phase::kUnprobed},
    {Phase::kWithdrawn, ConnEvent::kBackendLost, Phase::kKernel},
    {Phase::kWithdrawn, ConnEvent::kForked, Phase::kKernel},
    {Phase::kWithdrawn, ConnEvent::kClose, Phase::kClosed},
};

std::atomic<uint64_t> g_refused{0};

}  // namespace

const char* ToString(Phase p) {
  switch (p) {
    case Phase::kUnprobed: return "unprobed";
    case Phase::kKernel: return "kernel";
    case Phase::kPending: return "pending";
    case Phase::kUpgraded: return "upgraded";
    case Phase::kResyncing: return "resyncing";
    case Phase::kLingering: return "lingering";
    case Phase::kReset: return "reset";
    case Phase::kClosed: return "closed";
    case Phase::kWithdrawn: return "withdrawn";
  }
  return "?";
}

const char* ToString(ConnEvent e) {
  switch (e) {
    case ConnEvent::kRegistered: return "registered";
    case ConnEvent::kKernelForGood: return "kernel-for-good";
    case ConnEvent::kUpgrade: return "upgrade";
    case ConnEvent::kPeerWithdrew: return "peer-withdrew";
    case ConnEvent::kLinkLost: return "link-lost";
    case ConnEvent::kFail: return "fail";
    case ConnEvent::kBackendLost: return "backend-lost";
    case ConnEvent::kForked: return "forked";
    case ConnEvent::kResynced: return "resynced";
    case ConnEvent::kLinger: return "linger";
    case ConnEvent::kClose: return "close";
    case ConnEvent::kDrain: return "drain";
    case ConnEvent::kDrained: return "drained";
    case ConnEvent::kEndWithdrawn: return "end-withdrawn";
    case ConnEvent::kHoldAgain: return "hold-again";
  }
  return "?";
}

const char* ToString(RxResync r) {
  switch (r) {
    case RxResync::kRing: return "ring";
    case RxResync::kHeader: return "header";
    case RxResync::kSkip: return "skip";
    case RxResync::kKernel: return "kernel";
  }
  return "?";
}

const char* ToString(Mode m) {
  switch (m) {
    case Mode::kUnprobed: return "unprobed";
    case Mode::kKernel: return "kernel";
    case Mode::kPending: return "kernel-pending";
    case Mode::kAccel: return "accelerated";
  }
  return "?";
}

std::optional<Phase> ConnState::Next(Phase from, ConnEvent e) {
  for (const Transition& t : kTransitions)
    if (t.from == from && t.event == e) return t.to;
  return std::nullopt;
}

bool ConnState::Apply(ConnEvent e, std::optional<Reason> why) {
  std::lock_guard<std::mutex> lock(mu_);
  Phase from = phase_.load(std::memory_order_relaxed);
  std::optional<Phase> to = Next(from, e);
  if (!to) {
    g_refused.fetch_add(1, std::memory_order_relaxed);
    VS_LOG(kDebug, "connection %s: event %s refused", ToString(from), ToString(e));
    return false;
  }
  if (e == ConnEvent::kUpgrade) reason_.store(Reason::kNone, std::memory_order_relaxed);
  else if (why) reason_.store(*why, std::memory_order_relaxed);
  switch (e) {
    case ConnEvent::kUpgrade: upgraded_.store(true, std::memory_order_release); break;
    case ConnEvent::kLinger: lingered_.store(true, std::memory_order_release); break;
    case ConnEvent::kDrain: drain_.store(true, std::memory_order_release); break;
    case ConnEvent::kResynced:
      // A fresh registration: the history of the old one is gone (the
      // kernel byte counts go on, in Conn).
      upgraded_.store(false, std::memory_order_relaxed);
      resynced_.store(false, std::memory_order_relaxed);
      tx_ring_.store(false, std::memory_order_relaxed);
      rx_ring_.store(false, std::memory_order_relaxed);
      rx_resync_.store(RxResync::kRing, std::memory_order_relaxed);
      drain_.store(false, std::memory_order_relaxed);
      drain_tx_.store(DrainTx::kOnRing, std::memory_order_relaxed);
      drain_rx_.store(DrainRx::kOnRing, std::memory_order_relaxed);
      reason_.store(Reason::kPending, std::memory_order_relaxed);
      break;
    default: break;
  }
  // Downgrades (the accelerated path lost: link or backend; or left: a
  // drain) and the time
  // spent on kernel TCP after them until the next upgrade, for the report.
  if (*to == Phase::kResyncing && from != Phase::kResyncing) {
    downgrades_.fetch_add(1, std::memory_order_relaxed);
    last_downgrade_.store(why.value_or(Reason::kProtocolError), std::memory_order_relaxed);
    int64_t none = 0;
    kernel_since_ns_.compare_exchange_strong(none, MonotonicNs(), std::memory_order_relaxed);
  }
  if (e == ConnEvent::kUpgrade) {
    if (int64_t since = kernel_since_ns_.exchange(0, std::memory_order_relaxed); since != 0)
      kernel_ns_.fetch_add(MonotonicNs() - since, std::memory_order_relaxed);
  }
  // Release: resynced() is read on its own (before the phase), and what the
  // caller stored for the RESYNC (landed, fence acked) must be seen with it.
  if (*to == Phase::kResyncing) resynced_.store(true, std::memory_order_release);
  // Release: pairs with the acquire in phase(); whoever sees the new phase
  // sees the reason and history stored above.
  phase_.store(*to, std::memory_order_release);
  return true;
}

void ConnState::AfterForkInChild() { new (&mu_) std::mutex(); }

bool ConnState::registered() const {
  switch (phase()) {
    case Phase::kPending:
    case Phase::kUpgraded:
    case Phase::kResyncing:
    case Phase::kLingering:
    case Phase::kReset: return true;
    default: return false;
  }
}

bool ConnState::accelerated() const {
  switch (phase()) {
    case Phase::kUpgraded:
    case Phase::kResyncing:
    case Phase::kLingering: return true;
    case Phase::kReset: return upgraded();
    default: return false;
  }
}

Mode ConnState::mode() const {
  if (accelerated()) return Mode::kAccel;
  switch (phase()) {
    case Phase::kUnprobed: return Mode::kUnprobed;
    case Phase::kPending: return Mode::kPending;
    default: return Mode::kKernel;
  }
}

const char* ConnState::ReportedMode() const {
  // (An unprobed connection is reported only while it waits to register
  // again: on kernel TCP.)
  return resynced() || phase() == Phase::kUnprobed ? "kernel" : ToString(mode());
}

bool ConnState::SwitchTx() {
  if (!upgraded() || tx_ring_.load(std::memory_order_relaxed)) {
    g_refused.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  tx_ring_.store(true, std::memory_order_release);
  return true;
}

bool ConnState::SwitchRx() {
  if (!upgraded() || rx_ring_.load(std::memory_order_relaxed)) {
    g_refused.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  rx_ring_.store(true, std::memory_order_release);
  return true;
}

bool ConnState::AdvanceRxResync(RxResync to) {
  RxResync from = rx_resync_.load(std::memory_order_relaxed);
  bool ok = (resynced() || draining()) && ((from == RxResync::kRing && (to == RxResync::kHeader || to == RxResync::kKernel)) ||
                           (from == RxResync::kHeader && (to == RxResync::kSkip || to == RxResync::kKernel)) ||
                           (from == RxResync::kSkip && to == RxResync::kKernel));
  if (!ok) {
    g_refused.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  rx_resync_.store(to, std::memory_order_release);
  return true;
}

namespace {

// The drain's steps, per direction: anything else is refused.
constexpr struct {
  DrainTx from;
  DrainEvent event;
  DrainTx to;
} kDrainTxTransitions[] = {
    {DrainTx::kOnRing, DrainEvent::kTxRingEnd, DrainTx::kRingEnded},
};
constexpr struct {
  DrainRx from;
  DrainEvent event;
  DrainRx to;
} kDrainRxTransitions[] = {
    {DrainRx::kOnRing, DrainEvent::kPeerRingEnd, DrainRx::kPeerEnded},
    {DrainRx::kOnRing, DrainEvent::kBreak, DrainRx::kBroken},
};

}  // namespace

const char* ToString(DrainTx s) {
  switch (s) {
    case DrainTx::kOnRing: return "tx-on-ring";
    case DrainTx::kRingEnded: return "tx-ring-ended";
  }
  return "?";
}

const char* ToString(DrainRx s) {
  switch (s) {
    case DrainRx::kOnRing: return "rx-on-ring";
    case DrainRx::kPeerEnded: return "peer-ring-ended";
    case DrainRx::kBroken: return "broken";
  }
  return "?";
}

const char* ToString(DrainEvent e) {
  switch (e) {
    case DrainEvent::kTxRingEnd: return "tx-ring-end";
    case DrainEvent::kPeerRingEnd: return "peer-ring-end";
    case DrainEvent::kBreak: return "break";
  }
  return "?";
}

std::optional<DrainTx> ConnState::NextTx(DrainTx from, DrainEvent e) {
  for (const auto& t : kDrainTxTransitions)
    if (t.from == from && t.event == e) return t.to;
  return std::nullopt;
}

std::optional<DrainRx> ConnState::NextRx(DrainRx from, DrainEvent e) {
  for (const auto& t : kDrainRxTransitions)
    if (t.from == from && t.event == e) return t.to;
  return std::nullopt;
}

bool ConnState::ApplyDrain(DrainEvent e) {
  bool allowed = e == DrainEvent::kPeerRingEnd ? upgraded() : draining();
  bool done = false;
  if (allowed && e == DrainEvent::kTxRingEnd) {
    DrainTx from = drain_tx_.load(std::memory_order_relaxed);
    std::optional<DrainTx> to = NextTx(from, e);
    done = to && drain_tx_.compare_exchange_strong(from, *to, std::memory_order_acq_rel);
  } else if (allowed) {
    DrainRx from = drain_rx_.load(std::memory_order_relaxed);
    std::optional<DrainRx> to = NextRx(from, e);
    done = to && drain_rx_.compare_exchange_strong(from, *to, std::memory_order_acq_rel);
  }
  if (!done) {
    g_refused.fetch_add(1, std::memory_order_relaxed);
    VS_LOG(kDebug, "drain step %s refused", ToString(e));
  }
  return done;
}

uint64_t ConnState::refused_total() { return g_refused.load(std::memory_order_relaxed); }

}  // namespace vsocket::guest
