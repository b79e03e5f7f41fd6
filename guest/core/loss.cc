#include "guest/core/loss.h"

#include "guest/core/direct.h"

namespace vsocket::guest {

const char* ToString(LossKind k) {
  switch (k) {
    case LossKind::kLinkDown: return "link-down";
    case LossKind::kPeerAborted: return "peer-aborted";
    case LossKind::kBackendGone: return "backend-gone";
    case LossKind::kBackendBroken: return "backend-broken";
    case LossKind::kProtocolError: return "protocol-error";
  }
  return "?";
}

LossFacts LossFacts::Of(const Conn& c, uint64_t landed) {
  LossFacts f;
  f.phase = c.state.phase();
  f.upgraded = c.state.upgraded();
  f.resynced = c.state.resynced();
  f.draining = c.state.draining();
  f.peer_ring_end = c.state.peer_ring_ended();
  f.drain_broken = c.state.drain_broken();
  f.landed_matches = landed == c.rx_tail.load(std::memory_order_acquire);
  f.fence_known = c.peer_fence_known.load(std::memory_order_acquire);
  f.any_landed = landed != 0;
  return f;
}

namespace {

// A drain whose ring stream has not ended on both sides yet.
bool DrainOpen(const LossFacts& f) { return f.draining && !f.peer_ring_end && !f.drain_broken; }

// The peer is not coming (pending: kernel TCP for good, the registration
// ours to end) or went away mid-stream (upgraded: reset).
LossOutcome Withdrawn(const LossFacts& f) {
  LossOutcome o;
  o.event = ConnEvent::kPeerWithdrew;
  o.owe_unregister = f.phase == Phase::kPending;
  return o;
}

}  // namespace

LossOutcome DecideLoss(LossKind kind, const LossFacts& f) {
  LossOutcome o;
  switch (kind) {
    case LossKind::kLinkDown:
      if (f.draining && f.resynced) {
        // A drain whose TX had moved already: the RX finishes by the RESYNC
        // rules (unless the peer's ring stream had ended: nothing missing).
        if (!DrainOpen(f)) return o;
        if (!f.landed_matches) o.event = ConnEvent::kFail;
        else o.break_drain = true;
        return o;
      }
      if (f.upgraded && !f.resynced) {
        // Every RX_TAIL came before the DOWNGRADE, so the backend's landed
        // count can only confirm ours; bytes landed before the peer's fence
        // reached us cannot be placed.
        if (!f.landed_matches || (!f.fence_known && f.any_landed)) {
          o.event = ConnEvent::kFail;
          return o;
        }
        o.event = ConnEvent::kLinkLost;
        o.record_landed = true;
        o.break_drain = DrainOpen(f);
        return o;
      }
      return Withdrawn(f);
    case LossKind::kPeerAborted: return Withdrawn(f);
    case LossKind::kBackendGone:
      // What the backend published before it went is in our memory: our
      // RX tail is the landed count, and it is final for a drain under way.
      o.break_drain = DrainOpen(f);
      o.record_landed = f.phase == Phase::kUpgraded || f.phase == Phase::kLingering;
      o.mark_lost_backend = true;
      o.event = ConnEvent::kBackendLost;
      return o;
    case LossKind::kBackendBroken:
      o.event = f.upgraded ? ConnEvent::kFail : ConnEvent::kKernelForGood;
      return o;
    case LossKind::kProtocolError:
      // Upgraded: reset; before that the kernel stream is still exact.
      o.event = f.upgraded ? ConnEvent::kFail : ConnEvent::kPeerWithdrew;
      return o;
  }
  return o;
}

LossOutcome ApplyLoss(const std::shared_ptr<Conn>& cp, LossKind kind, uint64_t landed, bool fence_acked,
                      proto::Reason why, LinkLostHandler on_resync) {
  Conn& c = *cp;
  // A direct pair: the peer's FENCE is final before anything is decided
  // from it (decision 134).
  CloseDirectFence(c);
  LossOutcome o = DecideLoss(kind, LossFacts::Of(c, landed));
  // Stored before the phase changes (its release publishes them).
  if (o.break_drain || o.record_landed) c.resync_landed.store(landed, std::memory_order_relaxed);
  if (o.record_landed) c.resync_fence_acked.store(fence_acked, std::memory_order_relaxed);
  if (o.break_drain) c.state.ApplyDrain(DrainEvent::kBreak);
  if (o.mark_lost_backend) c.lost_backend.store(true, std::memory_order_relaxed);
  if (!o.event) return o;
  Phase before = c.state.phase();
  if (!c.state.Apply(*o.event, why)) return o;
  Phase now = c.state.phase();
  if (now == Phase::kResyncing && before != Phase::kResyncing && on_resync != nullptr) on_resync(cp);
  return o;
}

}  // namespace vsocket::guest
