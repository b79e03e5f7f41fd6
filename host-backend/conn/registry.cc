// The connection registry: pairing on this host, devices coming and going,
// closing and forgetting connections, snapshots.
#include "host-backend/conn/conn_manager.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "base/clock.h"
#include "base/log.h"
#include "host-backend/conn/ring_copy.h"
#include "host-backend/remote/frame.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {

using proto::Reason;

ConnManager::DeviceConns* ConnManager::Find(vhost::BackendDevice& device) {
  auto it = devices_.find(&device);
  return it == devices_.end() ? nullptr : &it->second;
}

uint64_t ConnManager::OnHello(vhost::BackendDevice& device, uint64_t features) {
  DeviceConns* dc = Find(device);
  if (dc == nullptr) return 0;
  // A second HELLO while connections live changes nothing: the session
  // keeps what it was given (its library allocates rings by it).
  if (!dc->by_id.empty())
    return (dc->doorbell ? proto::kFeatureDoorbell : 0) | (dc->ring_hold ? proto::kFeatureRingHold : 0) |
           (dc->fence_delivered ? proto::kFeatureFenceDelivered : 0) |
           (dc->clean_downgrade ? proto::kFeatureCleanDowngrade : 0) | (dc->bulk_hint ? proto::kFeatureBulkHint : 0) |
           (dc->naps ? proto::kFeatureNaps : 0) | (dc->tentative ? proto::kFeatureTentative : 0) |
           (dc->fork_resync ? proto::kFeatureForkResync : 0) | (dc->move_back ? proto::kFeatureMoveBack : 0) |
           (dc->knows_directory ? proto::kFeatureDirectoryUnavailable : 0) | (dc->direct ? proto::kFeatureDirect : 0) |
           (dc->direct_resend ? proto::kFeatureDirectResend : 0);
  uint64_t taken = features & proto::kKnownFeatures & (naps_ ? ~uint64_t{0} : ~proto::kFeatureNaps);
  // Direct pairs only where the VM's setting allows some (decision 98: the
  // library's direct-peer rule runs only in such sessions).
  const vhost::PortConfig* port = device.port();
  if (port == nullptr || port->direct == vhost::PortConfig::Direct::kOff || !vhost::DirectCapable(*port))
    taken &= ~proto::kFeatureDirect;
  if (!(taken & proto::kFeatureDirect)) taken &= ~proto::kFeatureDirectResend;
  dc->doorbell = (taken & proto::kFeatureDoorbell) != 0;
  dc->ring_hold = (taken & proto::kFeatureRingHold) != 0;
  dc->fence_delivered = (taken & proto::kFeatureFenceDelivered) != 0;
  dc->clean_downgrade = (taken & proto::kFeatureCleanDowngrade) != 0;
  dc->bulk_hint = (taken & proto::kFeatureBulkHint) != 0;
  dc->naps = (taken & proto::kFeatureNaps) != 0;
  dc->tentative = (taken & proto::kFeatureTentative) != 0;
  dc->fork_resync = (taken & proto::kFeatureForkResync) != 0;
  dc->move_back = (taken & proto::kFeatureMoveBack) != 0;
  dc->knows_directory = (taken & proto::kFeatureDirectoryUnavailable) != 0;
  dc->direct = (taken & proto::kFeatureDirect) != 0;
  dc->direct_resend = (taken & proto::kFeatureDirectResend) != 0;
  if (dc->doorbell) counters_.doorbell_sessions.fetch_add(1, std::memory_order_relaxed);
  return taken;
}

bool ConnManager::ResolveRings(BackendConn& c) {
  const vhost::GuestMemory& mem = c.device->memory();
  ++c.map_epoch;  // (a registration asked for before maps nothing now)
  // With a doorbell, its block follows the TX ring.
  c.tx.host = mem.Translate(c.tx.gpa, TxSpan(c));
  c.rx.host = mem.Translate(c.rx.gpa, c.rx.size);
  return c.tx.host != nullptr && c.rx.host != nullptr;
}

void ConnManager::Pair(BackendConn& a, BackendConn& b) {
  VS_LOG(kDebug, "pair conn %lu (dev %lu id %lu) <-> conn %lu (dev %lu id %lu)", static_cast<unsigned long>(a.handle),
         static_cast<unsigned long>(a.device->id()), static_cast<unsigned long>(a.conn_id),
         static_cast<unsigned long>(b.handle), static_cast<unsigned long>(b.device->id()),
         static_cast<unsigned long>(b.conn_id));
  a.peer = &b;
  b.peer = &a;
  a.state = b.state = ConnState::kUpgraded;
  a.reason = b.reason = Reason::kNone;
  counters_.upgrades.fetch_add(1, std::memory_order_relaxed);
  vm_totals_[a.vm_index % kMaxVms].upgrades.fetch_add(1, std::memory_order_relaxed);
  vm_totals_[b.vm_index % kMaxVms].upgrades.fetch_add(1, std::memory_order_relaxed);
  a.ev_peer_rx_window = b.rx.size;
  b.ev_peer_rx_window = a.rx.size;
  MaybeGoDirect(a, b);  // (its DIRECT events go out before the UPGRADEs)
  Raise(a, kEvUpgrade);
  Raise(b, kEvUpgrade);
  // A side that shut down its write direction before the pairing: its peer
  // must still learn that no accelerated byte will ever come.
  MaybeAnnounceShutdown(a);
  MaybeAnnounceShutdown(b);
}

void ConnManager::Orphan(BackendConn& c) {
  if (c.gone) return;
  // Counts published without a message (doorbell) are the guest's last word too.
  if (c.doorbell) (void)ReadDoorbell(c);
  // Bytes the application already wrote are delivered, as the kernel would
  // after close() or exit: keep the ones not yet moved.
  if (c.tx.host != nullptr && c.tx_tail > c.tx_copied) {
    uint64_t n = c.tx_tail - c.tx_copied;
    std::atomic<uint64_t>& vm = vm_totals_[c.vm_index % kMaxVms].orphan_bytes;
    if (vm.load() + n > orphan_budget_vm_ || counters_.orphan_bytes.load() + n > orphan_budget_total_) {
      // Over budget: reset, as an abortive close would (never an unbounded heap).
      counters_.orphan_resets.fetch_add(1, std::memory_order_relaxed);
      VS_LOG(kWarn, "vm %s conn %lu: closed with %lu bytes undelivered, beyond the orphan budget: connection reset",
             c.device ? c.device->port()->vm_name.c_str() : "?", static_cast<unsigned long>(c.conn_id),
             static_cast<unsigned long>(n));
      AbortTx(c);
    } else {
      c.orphan.resize(n);
      RingCopy(c.orphan.data(), 0, 0, c.tx.host, c.tx.size, c.tx_copied, n);
      c.orphan_off = 0;
      vm.fetch_add(n, std::memory_order_relaxed);
      counters_.orphan_bytes.fetch_add(n, std::memory_order_relaxed);
    }
  } else {
    c.tx_tail = c.tx_copied;  // nothing recoverable (device paused or empty)
  }
  WithdrawTx(c);  // the rest goes from the copy; frames in flight still read the ring
  c.gone = true;
  c.leaving.store(false, std::memory_order_relaxed);
  c.write_shut = true;
  c.tx.host = c.rx.host = nullptr;
  ++c.map_epoch;
  c.pending_events = 0;
  registry_.erase(c.key);
  ConnKey tuple = c.key;
  tuple.tenant = 0;
  by_tuple_.erase_fn(tuple, [&](uint32_t t) { return t == c.key.tenant; });
  VS_LOG(kDebug, "conn %lu (guest id %lu) closed, %zu bytes orphaned, peer %lu", static_cast<unsigned long>(c.handle),
         static_cast<unsigned long>(c.conn_id), c.orphan.size(),
         static_cast<unsigned long>(c.peer ? c.peer->handle : 0));
  if (c.peer && c.left_with_vm_ms == 0) {
    Raise(*c.peer, kEvPeerGone);
    MarkMovable(c);
    MaybeAnnounceShutdown(c);
  }
  switch (c.remote.stage) {
    case RemotePeer::Stage::kPaired:
      RetireRx(c);  // the guest may reuse the ring's memory after Unregister
      // (LeaveWithVm: told when its VM's devices all stopped, or later.)
      if (c.left_with_vm_ms != 0) break;
      Owe(c, kOweGone);
      MarkMovable(c);
      MaybeAnnounceShutdown(c);
      break;
    case RemotePeer::Stage::kRequested:
      // Withdraw: the peer backend forgets the request. A requester never
      // sent a frame: its peer cannot write yet.
      WithdrawPairRequest(c);
      break;
    case RemotePeer::Stage::kAccepted:
      // Withdraw: the peer backend forgets the acceptance. An acceptor's
      // peer may write: its registration lives until the conn is gone.
      if (hosts_)
        hosts_->SendPairing(c.remote.host,
                            Frame(proto::FrameType::kPairCancel, c.key.tenant, c.remote.handle, c.handle), {});
      c.remote.stage = RemotePeer::Stage::kNone;
      break;
    default: break;
  }
  counters_.active.fetch_sub(1, std::memory_order_relaxed);
  if (auto it = vm_open_.find(c.vm_index); it != vm_open_.end() && it->second > 0) --it->second;
}

void ConnManager::MaybeDestroy(BackendConn* c) {
  // A gone connection lives until its orphaned bytes reached the peer (or
  // the peer is gone too).
  if (!c->gone || c->left_with_vm_ms != 0) return;  // (LeaveWithVm: its peer's device may stop next)
  if (c->peer && !c->peer->gone && c->orphan_off < c->orphan.size()) return;
  if (c->in_move_list || c->in_owed_list || c->in_reap_list) return;  // removed by the sweeps
  if (c->txh && c->txh->Busy()) {
    AddReap(*c);  // sends in flight still read its TX ring: back when they completed
    return;
  }
  if (c->remote.paired()) {
    if (!c->remote.gone && c->orphan_off < c->orphan.size()) return;
    if (!c->shut_announced && !c->remote.gone) return;
    // The peer may still be writing into a withdrawn registration of our RX
    // ring: its PLACEMENT_ACK says it no longer does (a link loss detaches).
    if (!c->rx_mr_retired.empty()) return;
    Owe(*c, kOweRelease);  // the peer backend forgets it too; we follow once sent
    return;
  }
  if (c->direct_page) CountDirect(*c);  // (while its peer is still its peer)
  if (c->peer) {
    // A peer that is gone too may have been waiting only on us.
    if (c->peer->gone) MarkMovable(*c->peer);
    c->peer->peer = nullptr;
  }
  if (c->in_event_list && c->device != nullptr) {
    if (DeviceConns* dc = Find(*c->device))
      dc->events.erase(std::remove(dc->events.begin(), dc->events.end(), c), dc->events.end());
  }
  RemoveDoorbell(*c);
  if (c->direct) DropDirectOffers(c->handle);  // (a library that never fetched its memory)
  DropRx(*c);
  WithdrawTx(*c);  // nothing in flight reads it (Busy above): dropped at once
  if (!c->orphan.empty()) {
    vm_totals_[c->vm_index % kMaxVms].orphan_bytes.fetch_sub(c->orphan.size(), std::memory_order_relaxed);
    counters_.orphan_bytes.fetch_sub(c->orphan.size(), std::memory_order_relaxed);
  }
  conns_.erase(c->handle);
}

void ConnManager::Violation(BackendConn& c, const char* what) {
  counters_.protocol_violations.fetch_add(1, std::memory_order_relaxed);
  VS_LOG(kWarn, "vm %s conn %lu: %s; connection is reset", c.device ? c.device->port()->vm_name.c_str() : "?",
         static_cast<unsigned long>(c.conn_id), what);
  c.reason = Reason::kProtocolError;
  c.leaving.store(false, std::memory_order_relaxed);
  Raise(c, kEvDowngrade);
}

void ConnManager::OnAttach(vhost::BackendDevice& device) {
  DeviceConns& dc = devices_[&device];
  dc.device = &device;
  // Memory may have moved while the device was paused: translate again.
  for (auto& [id, c] : dc.by_id) {
    if (!ResolveRings(*c)) {
      c->tx.host = c->rx.host = nullptr;
      ++c->map_epoch;
      Violation(*c, "rings no longer inside guest memory");
      continue;
    }
    if (!c->rx_stash.empty()) {
      // Arrived from the fabric while the device was paused (the last
      // frame's payload may be still arriving: it continues in the ring).
      RingCopy(c->rx.host, c->rx.size, c->rx_stash_pos, c->rx_stash.data(), 0, 0, c->rx_stash.size());
      c->rx_stash.clear();
      c->rx_stash.shrink_to_fit();
      Raise(*c, kEvRxTail);
    } else if (c->remote.paired()) {
      Raise(*c, kEvRxTail);  // bytes placed one-sided while paused are in the ring already
    }
    // During a live migration, the whole RX ring of a fabric connection is
    // marked written: the stash just copied, a frame's first part landed
    // before the pause (its end is marked only where it lands), one-sided
    // placements meanwhile (decision 88).
    if (c->remote.paired()) MarkRingWritten(device.memory(), c->rx.host, c->rx.size, 0, c->rx.size);
    // Registered again off the worker; the peer learns the RX ring's by
    // PLACEMENT (until then its bytes are staged, ours copied).
    if (c->remote.paired()) {
      SubmitRx(*c);
      SubmitTx(*c);
    }
    MarkMovable(*c);
    if (c->peer) MarkMovable(*c->peer);
    // Counts published while paused: look (and arm) again.
    if (c->doorbell) AddDoorbell(dc, *c);
  }
}

namespace {

// VSOCKET_DEBUG_SWITCHOVER_AS_EXIT=1: a device that stops with its dirty
// log on is taken for a process that exited, as before decision 106 (its
// peers in the VM get its orphaned bytes and its close, written into their
// still running devices). Only for the dirty-log completeness test's
// negative control (tests/vm/migrate.sh migrate_without_dirty_log): those
// are the unmarked writes whose loss its page comparison shows.
bool SwitchoverAsExit() {
  static const bool on = [] {
    const char* v = std::getenv("VSOCKET_DEBUG_SWITCHOVER_AS_EXIT");
    if (v == nullptr || std::string(v) != "1") return false;
    VS_LOG(kWarn, "VSOCKET_DEBUG_SWITCHOVER_AS_EXIT=1: a migrating VM's devices stopping at the switchover close "
                  "their connections as exited processes (peers in the VM told; tests only)");
    return true;
  }();
  return on;
}

}  // namespace

void ConnManager::LeaveWithVm(BackendConn& c) {
  // Only a connection on the rings: a pending one has nothing to say to
  // anyone. A direct pair is process mode's.
  BackendConn* p = c.peer;
  if (c.gone || c.state != ConnState::kUpgraded || c.direct || (p == nullptr && !c.remote.paired())) return;
  if (p == nullptr || p->vm_index != c.vm_index) {
    // A peer outside the VM (another VM here, or on a peer host): told
    // nothing until the VM's last device stopped (the switchover: the peer
    // then finishes on kernel TCP through RESYNC, PeersOfMovedVm) or
    // kLeftWithVmMs passed (a process that exited: its close, as usual).
    // Whether its library has its peer's FENCE is read now: Orphan drops
    // the events it still owed (decision 110).
    c.peer_fence_given = p != nullptr && p->fence_received && (c.pending_events & kEvFence) == 0;
    c.left_with_vm_ms = MonotonicMs();
    left_with_vm_.push_back({c.handle, c.left_with_vm_ms + kLeftWithVmMs});
    return;
  }
  if (p->left_with_vm_ms == 0) {
    // The first end to stop: Orphan keeps its bytes as for any close, and
    // keeps its news from the peer for now (Move, MaybeAnnounceShutdown,
    // MaybeDestroy wait).
    c.left_with_vm_ms = MonotonicMs();
    left_with_vm_.push_back({c.handle, c.left_with_vm_ms + kLeftWithVmMs});
    return;
  }
  // Its peer's device stopped first, with its log on too: the VM moved.
  // Neither end keeps anything or says anything: the guest that wrote their
  // rings runs elsewhere now, with every byte either peer did not consume
  // still in its TX ring (credit is consumption-based), and resends them
  // itself when its session there turns out unknown (decision 094), as
  // when vsocketd dies.
  counters_.migration_leaves.fetch_add(2, std::memory_order_relaxed);
  VS_LOG(kDebug, "conn %lu (guest id %lu) left with its VM, as did its peer %lu", static_cast<unsigned long>(c.handle),
         static_cast<unsigned long>(c.conn_id), static_cast<unsigned long>(p->handle));
  p->left_with_vm_ms = 0;
  if (!p->orphan.empty()) {
    vm_totals_[p->vm_index % kMaxVms].orphan_bytes.fetch_sub(p->orphan.size(), std::memory_order_relaxed);
    counters_.orphan_bytes.fetch_sub(p->orphan.size(), std::memory_order_relaxed);
    p->orphan.clear();
    p->orphan_off = 0;
  }
  c.tx.host = c.rx.host = nullptr;  // (Orphan keeps nothing of it)
  ++c.map_epoch;
  c.pending_events = 0;
  c.peer = nullptr;
  p->peer = nullptr;
  MaybeDestroy(p);
}

bool ConnManager::ExpireLeftWithVm() {
  if (left_with_vm_.empty()) return false;
  int64_t now = MonotonicMs();
  bool any = false;
  while (!left_with_vm_.empty() && left_with_vm_.front().due_ms <= now) {
    auto it = conns_.find(left_with_vm_.front().handle);
    left_with_vm_.pop_front();
    if (it == conns_.end() || it->second->left_with_vm_ms == 0) continue;  // left with its peer meanwhile
    BackendConn& c = *it->second;
    c.left_with_vm_ms = 0;
    // Its peer's device still runs here: not a move, a process that went
    // during the pre-copy. Its peer hears of the close as Orphan says it.
    VS_LOG(kInfo, "conn %lu: its device stopped during a live migration, its peer's did not: the peer is told it closed",
           static_cast<unsigned long>(c.handle));
    if (c.peer) {
      Raise(*c.peer, kEvPeerGone);
      MarkMovable(c);
      MaybeAnnounceShutdown(c);
    } else if (c.remote.paired()) {
      Owe(c, kOweGone);  // (what Orphan left undone)
      MarkMovable(c);
      MaybeAnnounceShutdown(c);
    }
    MaybeDestroy(&c);
    any = true;
  }
  return any;
}

void ConnManager::PeersOfMovedVm(uint32_t vm_index) {
  std::vector<BackendConn*> moved;
  for (auto& [h, c] : conns_)
    if (c->vm_index == vm_index && c->left_with_vm_ms != 0 && (c->peer == nullptr || c->peer->vm_index != vm_index))
      moved.push_back(c.get());
  for (BackendConn* c : moved) {
    // The guest runs elsewhere with every byte its peer did not consume in
    // its TX ring, and resends it there through RESYNC when it hears its
    // session is unknown (decision 094): what this end kept goes. Its peer
    // is told the accelerated path is gone with the kernel connection still
    // there (fabric-down, the reason every library finishes by RESYNC),
    // with what landed in its RX ring and whether the moved end had its
    // FENCE; a peer host is told the same for its guest (PAIR_CANCEL,
    // reason fabric-down: DetachRemote there).
    c->left_with_vm_ms = 0;
    counters_.migration_leaves.fetch_add(1, std::memory_order_relaxed);
    counters_.migration_peers_resynced.fetch_add(1, std::memory_order_relaxed);
    if (!c->orphan.empty()) {
      vm_totals_[c->vm_index % kMaxVms].orphan_bytes.fetch_sub(c->orphan.size(), std::memory_order_relaxed);
      counters_.orphan_bytes.fetch_sub(c->orphan.size(), std::memory_order_relaxed);
      c->orphan.clear();
      c->orphan_off = 0;
    }
    if (BackendConn* p = c->peer) {
      VS_LOG(kInfo,
             "conn %lu left with its VM on the rings: its peer %lu (guest id %lu) finishes on kernel TCP through "
             "RESYNC (%lu bytes landed, %s)",
             static_cast<unsigned long>(c->handle), static_cast<unsigned long>(p->handle),
             static_cast<unsigned long>(p->conn_id), static_cast<unsigned long>(p->rx_tail),
             c->peer_fence_given ? "its FENCE given" : "its FENCE not given");
      p->ev_fence_acked = c->peer_fence_given;
      p->peer_moved = true;
      p->reason = Reason::kFabricDown;
      p->peer = nullptr;
      c->peer = nullptr;
      Raise(*p, kEvDowngrade);
      if (p->gone) MaybeDestroy(p);  // (closed meanwhile: it waited only on us)
    } else if (c->remote.paired()) {
      VS_LOG(kInfo, "conn %lu left with its VM on the rings: host %u's end finishes on kernel TCP through RESYNC",
             static_cast<unsigned long>(c->handle), c->remote.host);
      if (hosts_)
        hosts_->SendPairing(c->remote.host,
                            Frame(proto::FrameType::kPairCancel, c->key.tenant, c->remote.handle, c->handle,
                                  static_cast<uint32_t>(Reason::kFabricDown)),
                            {});
      c->remote.stage = RemotePeer::Stage::kDetached;
      c->remote.gone = true;
      c->link_owed = 0;
      DropRx(*c);
      WithdrawTx(*c);
    }
    MaybeDestroy(c);
  }
}

void ConnManager::OnDetach(vhost::BackendDevice& device) {
  DeviceConns* dc = Find(device);
  if (dc == nullptr) return;
  if (!device.stopping()) {
    // Paused for reconfiguration: stop touching its memory, keep the state.
    // Peer hosts stop writing into it: their rkeys are withdrawn.
    // Sends stop reading its TX rings (withdrawn from use at once, dropped
    // when the frames in flight completed).
    for (auto& [id, c] : dc->by_id) {
      c->tx.host = c->rx.host = nullptr;
      ++c->map_epoch;
      RetireRx(*c);
      WithdrawTx(*c);
    }
    return;
  }
  // The guest process is gone: its connections close as if it exited.
  // Unless the device stopped with its dirty log on (as of its last Load):
  // then the VM moved on, and its connections leave with it (decision 106).
  // Or a VM paused (its device kept, decision 123) whose QEMU then went:
  // migrated while paused (`virsh migrate` without --live) or killed.
  const bool moved = (device.logging() || device.left_with_vm()) && !SwitchoverAsExit();
  std::vector<BackendConn*> conns;
  for (auto& [id, c] : dc->by_id) conns.push_back(c);
  for (BackendConn* c : dc->events) c->in_event_list = false;
  for (BackendConn* c : dc->doorbells) c->in_doorbell_set = false;
  devices_.erase(&device);
  for (BackendConn* c : conns) {
    if (moved) LeaveWithVm(*c);
    c->device = nullptr;
    Orphan(*c);
    MaybeDestroy(c);
  }
  // Closed earlier, rings still held: nobody to tell any more.
  for (auto& [h, c] : conns_)
    if (c->device == &device) c->device = nullptr;
  // The VM's last device stopped with its log on: it moved (decision 110).
  if (moved) {
    const uint32_t vm = device.port()->index;
    for (const auto& [d, dc2] : devices_)
      if (d->port()->index == vm) return;
    PeersOfMovedVm(vm);
  }
}

// Reporting. The control socket's thread (and the metrics listener's) never
// reads a connection: it asks the worker, which copies them between two
// passes, when nothing changes (docs/architecture.md, "Threads in vsocketd").

void ConnManager::SetWorker(std::function<void()> wake) {
  {
    MutexLock lock(snapshot_mu_);
    wake_worker_ = std::move(wake);
  }
  snapshot_cv_.NotifyAll();  // (none any more: those waiting make their own)
}

std::vector<ConnSnapshot> ConnManager::Snapshot() const {
  UniqueLock lock(snapshot_mu_);
  // No worker: nothing else touches the connections (before it starts,
  // after it stopped, tests).
  if (!wake_worker_) return MakeSnapshot();
  uint64_t mine = ++snapshots_asked_;
  snapshot_wanted_.store(true, std::memory_order_release);
  wake_worker_();
  while (snapshots_made_ < mine && wake_worker_) {
    if (!snapshot_cv_.WaitFor(lock, kSnapshotWait)) {
      VS_LOG(kWarn, "worker made no report within %d s (wedged?): reporting what it made last",
             static_cast<int>(kSnapshotWait.count()));
      return snapshot_;
    }
  }
  if (snapshots_made_ < mine) return MakeSnapshot();  // the worker stopped meanwhile
  return snapshot_;
}

void ConnManager::ServeSnapshots() {
  if (!snapshot_wanted_.load(std::memory_order_acquire)) return;
  uint64_t asked;
  {
    MutexLock lock(snapshot_mu_);
    snapshot_wanted_.store(false, std::memory_order_relaxed);
    asked = snapshots_asked_;
  }
  // Made after every request up to `asked` came: it answers them all.
  CountAllDirect();  // (a direct pair's bytes never pass here: counted from its counts)
  std::vector<ConnSnapshot> copy = MakeSnapshot();
  {
    MutexLock lock(snapshot_mu_);
    snapshot_ = std::move(copy);
    snapshots_made_ = asked;
  }
  snapshot_cv_.NotifyAll();
}

std::vector<ConnSnapshot> ConnManager::MakeSnapshot() const {
  std::vector<ConnSnapshot> out;
  out.reserve(conns_.size());
  for (const auto& [h, c] : conns_) {
    if (c->gone) continue;
    uint64_t peer_consumed = c->peer ? c->peer->rx_consumed : c->remote.paired() ? c->remote.credit : c->tx_tail;
    out.push_back({c->handle, c->device ? c->device->id() : 0, c->device ? c->device->port()->vm_name : "",
                   c->key.tenant, c->key.local, c->key.peer, c->state, c->reason, c->accel_bytes_out.load(),
                   c->accel_bytes_in.load(), c->kernel_bytes_out.load(), c->rx_tail - c->rx_consumed,
                   c->tx_tail - std::min(c->tx_tail, peer_consumed),
                   c->peer              ? c->peer->rx.size
                   : c->remote.paired() ? c->remote.window
                                        : 0,
                   c->remote.paired() ? c->remote.host : 0, c->moved.load(std::memory_order_relaxed),
                   c->leaving.load(std::memory_order_relaxed)});
  }
  return out;
}

}  // namespace vsocket::backend
