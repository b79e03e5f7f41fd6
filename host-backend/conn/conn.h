// A guest connection as the backend tracks it: identity (tenant + 4-tuple),
// its two byte rings in guest memory, the peer it is paired with, and the
// byte counters of the upgraded data path. The worker's alone: other
// threads see a connection only in the copies the worker makes for them
// (ConnManager::Snapshot). (The atomics below date from when the control
// socket read them directly; none needs to be one any more.)
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "host-backend/conn/tx_hold.h"
#include "proto/control.h"

namespace vsocket::vhost {
class BackendDevice;
}

namespace vsocket::backend {

// The pairing key. `scope` separates loopback addresses of different VMs
// (127.0.0.1 in vm1 is not 127.0.0.1 in vm2); 0 for routable addresses.
struct ConnKey {
  uint32_t tenant = 0;
  uint32_t scope = 0;
  proto::Endpoint local;
  proto::Endpoint peer;
  bool operator==(const ConnKey&) const = default;
  ConnKey Mirror() const { return ConnKey{tenant, scope, peer, local}; }
};

struct ConnKeyHash {
  size_t operator()(const ConnKey& k) const;
};

// A byte ring in guest memory: where the guest said it is, and where it is
// mapped here (null while the device is paused for reconfiguration).
struct GuestRing {
  uint64_t gpa = 0;
  uint32_t size = 0;  // power of two
  uint8_t* host = nullptr;
};

enum class ConnState : uint8_t { kPending, kUpgraded, kClosed };
const char* ToString(ConnState s);

// Events owed to the guest, emitted in this order (coalesced: only the
// latest value of a counter is sent).
enum EventBit : uint32_t {
  kEvUpgrade = 1u << 0,
  kEvFence = 1u << 1,  // peer's kernel-path byte count
  kEvRxTail = 1u << 2,
  kEvCredit = 1u << 3,
  kEvPeerShutWr = 1u << 4,      // peer sends no more: EOF after rx_tail
  kEvPeerGone = 1u << 5,        // peer reads no more: EPIPE on write
  kEvDowngrade = 1u << 6,       // stay on (or go back to) kernel TCP, with reason
  kEvFenceDelivered = 1u << 7,  // our FENCE is in the peer guest's event queue (kFeatureFenceDelivered)
  kEvPeerRingEnd = 1u << 8,     // the peer left the rings (a drain): its stream goes on on kernel TCP after rx_tail
  kEvDrain = 1u << 9,           // leave the rings with clean fences (kFeatureCleanDowngrade), ev_drain_reason
  kEvDirect = 1u << 10,         // the pair goes direct (kFeatureDirect, decision 97): ev_direct_token, before UPGRADE
};

// Frames owed to a remote peer's backend (coalesced like events; sent in
// this order when the link takes them).
enum LinkOwedBit : uint32_t {
  kOweConfirm = 1u << 7,  // first of all: PAIR_CONFIRM
  kOweFence = 1u << 0,
  kOweCredit = 1u << 1,
  kOweShutWr = 1u << 2,
  kOweGone = 1u << 3,
  kOweAbort = 1u << 4,
  kOweRelease = 1u << 5,        // last: the connection is forgotten after it
  kOweData = 1u << 6,           // not a frame: data waits for room on the link
  kOweFenceAck = 1u << 8,       // the peer's FENCE reached our guest's event queue
  kOwePlacement = 1u << 9,      // rdma: our RX ring's registration changed (value/aux = addr/rkey)
  kOwePlacementAck = 1u << 10,  // rdma: we applied the peer's PLACEMENTs
};

// The peer of a connection whose other end runs on another host.
struct RemotePeer {
  enum class Stage : uint8_t {
    kNone,
    kRequested,  // we sent PAIR_REQUEST, wait for PAIR_ACCEPT
    kAccepted,   // we sent PAIR_ACCEPT, wait for the peer's first link frame
    kPaired,
    kDetached,  // the peer released it, or the link died
  };
  Stage stage = Stage::kNone;
  uint32_t host = 0;         // peer host id (fabric)
  uint64_t handle = 0;       // the peer backend's handle for the connection
  uint32_t window = 0;       // the peer guest's RX ring size
  uint64_t credit = 0;       // bytes the peer guest consumed: we may send up to credit + window
  bool gone = false;         // the peer guest reads no more
  bool fence_acked = false;  // the peer backend has our FENCE (RESYNC is safe)
  bool fence_seen = false;   // the peer's FENCE arrived (one per pairing)
  uint64_t rdma_addr = 0;    // rdma fabric: the peer RX ring (0: its staging ring)
  uint32_t rdma_rkey = 0;
  uint64_t placements_seen = 0;  // PLACEMENT frames applied (acknowledged with their count)
  bool paired() const { return stage == Stage::kPaired; }
};

// A reason a peer host gives for leaving, as we apply it: never
// "accelerated", "pending" or "rings-held" (an unknown code never gets here:
// proto::DecodeFrameHeader refuses it).
inline proto::Reason PeerReason(uint32_t aux) {
  if (aux == 0 || aux == static_cast<uint32_t>(proto::Reason::kPending) ||
      aux == static_cast<uint32_t>(proto::Reason::kRingsHeld))
    return proto::Reason::kProtocolError;
  return static_cast<proto::Reason>(aux);
}

// The reason as a guest's library may be told it: directory-unavailable
// only to one that took kFeatureDirectoryUnavailable (decision 95); an
// older library hears peer-not-registered, which it reads the same way
// (kernel TCP for good), as it did before the reason existed.
inline proto::Reason ForGuest(proto::Reason why, bool knows_directory) {
  if (why == proto::Reason::kDirectoryUnavailable && !knows_directory) return proto::Reason::kPeerNotRegistered;
  return why;
}

// rdma fabric: a guest RX ring registered for peer `host` to write, in
// that host's protection domain.
struct RxRegion {
  void* addr = nullptr;
  uint32_t host = 0;
};

// A direct pair's first page, mapped read-only by vsocketd for the pair's
// byte counts (conn/direct.cc CountDirect); shared by the pair's two ends.
struct DirectPage;

struct BackendConn {
  uint64_t handle = 0;  // daemon-wide unique
  vhost::BackendDevice* device = nullptr;
  uint32_t vm_index = 0;  // PortConfig::index of its VM
  uint64_t conn_id = 0;   // the guest's name for it
  ConnKey key;
  proto::Role role = proto::Role::kClient;
  GuestRing tx, rx;
  BackendConn* peer = nullptr;
  ConnState state = ConnState::kPending;
  proto::Reason reason = proto::Reason::kPending;
  bool cross_tenant_mirror = false;  // another tenant registered the mirror 4-tuple

  // Upgraded data path, all totals since the upgrade.
  bool fence_received = false;
  uint64_t fence_bytes = 0;  // bytes this side sent on the kernel path
  uint64_t tx_tail = 0;      // guest produced into TX
  uint64_t tx_copied = 0;    // we moved to the peer's RX
  uint64_t rx_tail = 0;      // we landed in RX
  uint64_t rx_consumed = 0;  // guest consumed from RX (the peer's credit)
  bool write_shut = false;   // guest will produce no more (on the rings: EOF, or its ring end)
  // Drains (kFeatureCleanDowngrade; docs/connection-lifecycle.md §9).
  bool clean_downgrade = false;   // the session took the feature
  bool drain_asked = false;       // DOWNGRADE(drain) raised
  bool ring_ended = false;        // the guest's SHUTDOWN(ring end): its TX stream goes on on kernel TCP
  bool peer_ring_end_told = false;  // our guest was told the peer's ring end
  // Both directions have left the rings: everything before the two ring
  // ends was delivered (reported: `vsocketctl drain`).
  std::atomic<bool> moved{false};
  // Asked to drain (or following its peer's ring end), and not yet both
  // moved and consumed both ways (ConnManager::MaybeLeft), unregistered or
  // reset: what a drain waits for (`vsocketctl drained`, SIGTERM). A
  // library that learned of a stop halfway through its drain would finish
  // it by the RESYNC rules, which may resend.
  std::atomic<bool> leaving{false};
  proto::Reason ev_drain_reason = proto::Reason::kOperator;
  // Fork resync (kFeatureForkResync, decision 85).
  bool fork_resync = false;  // the session took the feature
  bool move_back = false;    // the session took kFeatureMoveBack (decision 92)
  bool knows_directory = false;  // the session took kFeatureDirectoryUnavailable (decision 95)
  bool takes_direct = false;     // the session took kFeatureDirect (decision 97)
  bool direct_resend = false;    // the session took kFeatureDirectResend (decision 135)
  // Registered only for a direct pair (kRegisterDirect, decision 98):
  // withdrawn (kernel-faster) rather than paired through vsocketd.
  bool direct_only = false;
  // A direct pair (decision 97): the two libraries share a ring pair of
  // their own; no byte of it passes here (no TX_TAIL, CONSUMED or doorbell).
  bool direct = false;
  uint64_t ev_direct_token = 0;
  // Its bytes are counted from its side's `produced` count there (untrusted:
  // it only ever adds to this connection's, its VM's and the daemon's
  // statistics, never to anything that moves data).
  std::shared_ptr<const DirectPage> direct_page;
  int direct_side = 0;
  uint64_t direct_counted = 0;
  // The DOWNGRADE owed to our guest asks it to resend its ring stream from
  // ev_resend_from with no RESYNC header (its peer's process forked, or
  // could not map the pair's memory: decision 135).
  bool ev_resend = false;
  uint64_t ev_resend_from = 0;
  bool shut_announced = false;
  bool gone = false;            // guest closed or died; data may still drain
  std::vector<uint8_t> orphan;  // TX bytes not yet moved when the guest left
  size_t orphan_off = 0;
  // When its device stopped with its dirty log on while its peer, in the
  // same VM, still ran (MonotonicMs; 0: not so). Its peer is told nothing
  // until its own device stops (the VM moved: neither is told anything)
  // or kLeftWithVmMs passed (a process that exited during the pre-copy:
  // told as any close). Decision 106.
  int64_t left_with_vm_ms = 0;
  // The DOWNGRADE owed to our guest says its peer has our FENCE although
  // the peer is not on a peer host (a same-host peer whose VM moved on:
  // decision 110; remote.fence_acked says it for a peer host's).
  bool ev_fence_acked = false;
  // LeaveWithVm (a same-host peer outside its VM): its library had its
  // peer's FENCE when its device stopped.
  bool peer_fence_given = false;
  // Its peer left with a VM that moved (PeersOfMovedVm): it finishes on
  // kernel TCP through RESYNC and registers again; a peer host's request
  // for it meanwhile waits for that (decision 110).
  bool peer_moved = false;

  // Values owed with pending events, captured when raised (the peer may be
  // gone by the time they are emitted).
  uint64_t ev_peer_fence = 0;
  uint64_t ev_credit = 0;
  uint32_t ev_peer_rx_window = 0;
  uint32_t pending_events = 0;
  bool in_event_list = false;
  bool in_move_list = false;

  // Cross-host: the remote peer (peer == nullptr then).
  // kFeatureDoorbell: the DoorbellBlock after the TX ring (see
  // proto/control.h); while in its device's doorbell set, the worker reads
  // the counts there every pass instead of waiting for messages.
  bool doorbell = false;
  bool in_doorbell_set = false;
  bool fence_ack_pending = false;  // the peer's FENCE: acked once its event is emitted
  uint32_t doorbell_idle = 0;      // passes in the set without progress

  RemotePeer remote;
  uint32_t link_owed = 0;
  bool in_owed_list = false;
  std::vector<uint8_t> rx_stash;  // arrived while the device was paused: lands on re-attach
  uint64_t rx_stash_pos = 0;      // the stream position of rx_stash[0]

  // rdma fabric: our RX ring registered on its own (a memory region in the
  // protection domain of this connection's peer host, rx_mr.host, which
  // alone knows the rkey). rx_mr.addr == nullptr: not registered, the peer
  // writes into the link's staging ring.
  RxRegion rx_mr;
  uint32_t rx_rkey = 0;
  // Registrations the peer may still write into: kept until it acknowledges
  // the PLACEMENT that withdrew them (tag = that frame's number).
  std::vector<std::pair<uint64_t, RxRegion>> rx_mr_retired;
  uint64_t placements_sent = 0;
  // Registrations are made on the registrar's thread (regions.cc): one of
  // each ring at a time is under way (pending), and applies only if the
  // ring's mapping is still the one it was asked for (map_epoch changes
  // whenever the rings are mapped again or given up). rx_mr_untold: made
  // before the pairing completed; the peer learns it by PLACEMENT then.
  bool rx_reg_pending = false;
  bool tx_reg_pending = false;
  bool rx_mr_untold = false;
  uint64_t map_epoch = 0;

  // Sessions with kFeatureRingHold (ring_hold): one-sided access to the
  // rings. rdma fabric: the TX ring registered for sends to read in place
  // (tx_mr; null: sends copy), and what of it the link may still read
  // (txh, made with the first registration). The guest's credit stays below
  // the first byte a send may still read; a closed connection whose rings
  // are still read or written was answered rings-held (rings_held) and is
  // told RINGS_RELEASED when neither happens any more.
  bool ring_hold = false;
  bool fence_delivered = false;  // session took kFeatureFenceDelivered
  void* tx_mr = nullptr;
  uint32_t tx_mr_host = 0;  // whose protection domain tx_mr is registered in
  std::unique_ptr<TxHold> txh;
  bool rings_held = false;
  bool in_reap_list = false;

  // Reported (vsocketctl connections).
  std::atomic<uint64_t> accel_bytes_out{0};
  std::atomic<uint64_t> accel_bytes_in{0};
  std::atomic<uint64_t> kernel_bytes_out{0};  // from the fence

  // Registered and still waiting for its peer: not gone, told nothing, and
  // neither paired on this host nor asked, accepted or paired by a peer
  // host. What pairing (and a peer host's PAIR_DECLINE) may take up.
  bool WaitsForPeer() const {
    return !gone && state == ConnState::kPending && reason == proto::Reason::kPending && peer == nullptr &&
           remote.stage == RemotePeer::Stage::kNone;
  }
};

// The guest memory of c's TX ring, with the doorbell block that follows it.
inline uint64_t TxSpan(const BackendConn& c) { return c.tx.size + (c.doorbell ? proto::kDoorbellBytes : 0); }

}  // namespace vsocket::backend
