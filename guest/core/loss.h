// What losing the accelerated path means for one connection — decided in
// one place for every way it can be lost.
//
// The ways (LossKind): the fabric link to the peer's host went, or the peer
// withdrew before it ever upgraded (DOWNGRADE fabric-down /
// peer-not-registered: the kernel connection is still there, RESYNC); the
// peer aborted or the backend refused (any other DOWNGRADE); vsocketd went
// away (its transport's liveness); vsocketd broke the queue protocol; an
// ERROR event. DecideLoss is a pure function of the connection's state and
// the counts at hand (table-tested in loss_test.cc); ApplyLoss carries the
// outcome out on a connection. Both the session's event dispatch and its
// backend-loss path call them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "guest/core/conn.h"
#include "guest/core/conn_state.h"
#include "proto/control.h"

namespace vsocket::guest {

enum class LossKind : uint8_t {
  kLinkDown,        // DOWNGRADE fabric-down or peer-not-registered: RESYNC on the kernel connection
  kPeerAborted,     // any other (non-drain) DOWNGRADE: pending: kernel for good; upgraded: reset
  kBackendGone,     // vsocketd went away (crash, kill -9, restart): RESYNC, register again later
  kBackendBroken,   // vsocketd broke the queue protocol: nothing proves where bytes are
  kProtocolError,   // an ERROR event for the connection
};
const char* ToString(LossKind k);

// The connection as the decision sees it.
struct LossFacts {
  Phase phase = Phase::kUnprobed;
  bool upgraded = false;   // state.upgraded()
  bool resynced = false;   // state.resynced(): a loss already applied
  bool draining = false;   // state.draining(): a drain under way
  bool peer_ring_end = false;
  bool drain_broken = false;
  // kLinkDown: the backend's count of bytes landed in our RX ring agrees
  // with ours, and (if any landed) the peer's FENCE reached us.
  bool landed_matches = true;
  bool fence_known = false;
  bool any_landed = false;

  static LossFacts Of(const Conn& c, uint64_t landed);
};

struct LossOutcome {
  std::optional<ConnEvent> event;  // applied to the state (refused by its table: nothing)
  // A drain under way: the landed count is final, the RESYNC rules apply in
  // full (ConnState::ring_final).
  bool break_drain = false;
  // Record the landed count and whether the peer has our FENCE, for the
  // RESYNC (resync.cc).
  bool record_landed = false;
  bool mark_lost_backend = false;  // registers again once a backend is back
  // A pending connection withdrawn to kernel TCP (the phase table makes it
  // kWithdrawn): its registration and rings are ours to end (EndWithdrawn).
  bool owe_unregister = false;

  bool operator==(const LossOutcome&) const = default;
};

LossOutcome DecideLoss(LossKind kind, const LossFacts& f);

// Called (under the session lock) for an upgraded connection that just went
// resyncing: the socket layer hands its resend to the background writer.
using LinkLostHandler = void (*)(const std::shared_ptr<Conn>& c);

// Decides and carries out. `landed`: bytes in our RX ring (kLinkDown: the
// backend's count; otherwise ours); `fence_acked`: the peer has our FENCE.
// Returns the outcome (for the log and the tests).
LossOutcome ApplyLoss(const std::shared_ptr<Conn>& c, LossKind kind, uint64_t landed, bool fence_acked,
                      proto::Reason why, LinkLostHandler on_resync);

}  // namespace vsocket::guest
