// Drains: an operator moves a VM's connections off the rings with clean
// fences (vsocketctl drain, SIGTERM) and back (undrain).
// docs/connection-lifecycle.md §9, decision 54.
#include "host-backend/conn/conn_manager.h"

#include "base/log.h"
#include "host-backend/conn/address.h"
#include "host-backend/remote/frame.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {

using proto::Reason;

uint64_t ConnManager::RequestVmOp(uint32_t vm_index, VmOp op, Reason why) {
  MutexLock lock(drain_mu_);
  drain_requests_.push_back({vm_index, op, why, ++drain_seq_});
  drain_requested_.store(true, std::memory_order_release);
  return drain_seq_;
}

uint64_t ConnManager::RequestLocalPorts(std::shared_ptr<const std::vector<vhost::PortConfig>> ports) {
  MutexLock lock(drain_mu_);
  drain_requests_.push_back({kAllVms, VmOp::kPorts, Reason::kNone, ++drain_seq_, std::move(ports)});
  drain_requested_.store(true, std::memory_order_release);
  return drain_seq_;
}

bool ConnManager::ApplyDrainRequests() {
  if (!drain_requested_.load(std::memory_order_acquire)) return false;
  std::vector<DrainRequest> todo;
  {
    MutexLock lock(drain_mu_);
    todo.swap(drain_requests_);
    drain_requested_.store(false, std::memory_order_relaxed);
  }
  for (const DrainRequest& r : todo) {
    std::vector<uint32_t> vms;
    if (r.vm_index != kAllVms) {
      vms.push_back(r.vm_index % kMaxVms);
    } else if (ports_ != nullptr) {
      for (const vhost::PortConfig& p : *ports_) vms.push_back(p.index % kMaxVms);
    }
    switch (r.op) {
      case VmOp::kDrain: {
        for (uint32_t vm : vms) {
          if (away_[vm].load(std::memory_order_relaxed)) continue;  // (drains for its move already)
          drain_[vm].store(static_cast<uint16_t>(r.why), std::memory_order_release);
          VS_LOG(kInfo, "vm index %u: draining (%s)", vm, proto::ToString(r.why));
        }
        size_t asked = 0;
        for (auto& [h, c] : conns_)
          if (Draining(c->vm_index) && AskDrain(*c, static_cast<Reason>(drain_[c->vm_index % kMaxVms].load())))
            ++asked;
        VS_LOG(kInfo, "drain: %zu connection(s) asked to leave the rings", asked);
        break;
      }
      case VmOp::kUndrain:
        for (uint32_t vm : vms) {
          if (away_[vm].load(std::memory_order_relaxed)) continue;  // undrained when it arrives (kArrive)
          drain_[vm].store(0, std::memory_order_release);
          VS_LOG(kInfo, "vm index %u: undrained", vm);
          PairPending(vm);
        }
        break;
      case VmOp::kLeave:
        for (uint32_t vm : vms) Leave(vm);
        break;
      case VmOp::kRemove:
        for (uint32_t vm : vms) Leave(vm, r.why);
        break;
      case VmOp::kPorts:
        // (The old list stays alive until here: nothing on this thread
        // points into it past this pass.)
        ports_held_ = r.ports;
        ports_ = ports_held_.get();
        break;
      case VmOp::kArrive:
        for (uint32_t vm : vms) {
          bool was_away = away_[vm].exchange(false, std::memory_order_acq_rel);
          drain_[vm].store(0, std::memory_order_release);
          if (was_away) counters_.vms_arrived.fetch_add(1, std::memory_order_relaxed);
          VS_LOG(kInfo, "vm index %u: runs here%s", vm, was_away ? " (arrived)" : " (its move was called off)");
          PairPending(vm);
        }
        break;
      case VmOp::kRelocate:
        // The locator changed: connections waiting for a peer look again
        // (a peer that moved to another host, or here).
        Relocate();
        break;
    }
    drain_applied_.store(r.seq, std::memory_order_release);
  }
  return true;
}

// VM vm_index no longer runs here (its guest moves to another host; it has
// drained for kMigration, and vsocketd closes its vhost-user sessions next).
// A connection still on the rings (its drain could not finish: a half-
// closed connection, a library without the feature) cannot follow its guest
// with its bytes accounted for: it is reset at both ends, never left to end
// short. Peer hosts' PAIR_REQUESTs kept for the VM are refused as moved:
// their requesters ask again where the locator then says.
// kRemove (why not kMigration): the VM is removed, not moved; the same,
// but not counted as a VM that left.
void ConnManager::Leave(uint32_t vm, Reason why) {
  if (away_[vm].exchange(true, std::memory_order_acq_rel)) return;
  drain_[vm].store(static_cast<uint16_t>(Reason::kMigration), std::memory_order_release);
  if (why == Reason::kMigration) counters_.vms_left.fetch_add(1, std::memory_order_relaxed);
  size_t reset = 0;
  for (auto& [h, c] : conns_) {
    BackendConn& x = *c;
    if (x.vm_index % kMaxVms != vm || x.gone || x.state != ConnState::kUpgraded ||
        x.moved.load(std::memory_order_relaxed))
      continue;
    x.reason = why;
    x.leaving.store(false, std::memory_order_relaxed);
    Raise(x, kEvDowngrade);  // an upgraded guest takes it as a reset
    AbortTx(x);              // and so does its peer
    ++reset;
  }
  counters_.migration_resets.fetch_add(reset, std::memory_order_relaxed);
  const vhost::PortConfig* port = nullptr;
  if (ports_ != nullptr)
    for (const vhost::PortConfig& p : *ports_)
      if (p.index % kMaxVms == vm) port = &p;
  if (port != nullptr && hosts_ != nullptr) {
    std::vector<std::pair<ConnKey, PendingRemote>> refused;
    DropPendingRemote([&](const auto& kv) {
      if (kv.first.tenant != port->tenant_id || !AddressAllowed(*port, kv.first.local)) return false;
      refused.push_back(kv);
      return true;
    });
    for (const auto& [key, r] : refused) {
      counters_.pair_moved.fetch_add(1, std::memory_order_relaxed);
      hosts_->SendPairing(r.host, Frame(proto::FrameType::kPairReject, key.tenant, r.handle, 0,
                                        static_cast<uint32_t>(Reason::kMigration)),
                          {});
    }
  }
  VS_LOG(kInfo, "vm index %u left this host: %zu connection(s) still on the rings reset", vm, reset);
}

// Asks c's guest to leave the rings: it ends its ring stream (SHUTDOWN ring
// end), its peer's library follows when it learns of it, and each side's
// kernel stream goes on once the peer consumed its ring. Only a connection
// whose both libraries can (same host: both sessions took the feature; the
// peer host's side answers a ring end it cannot follow with an abort, which
// never happens between libraries of one release), and which is not
// shutting down or closing (that ends it on the rings soon anyway).
bool ConnManager::AskDrain(BackendConn& c, Reason why) {
  if (c.state != ConnState::kUpgraded || c.gone || c.write_shut || c.drain_asked || !c.clean_downgrade) return false;
  if (c.peer != nullptr && (!c.peer->clean_downgrade || c.peer->gone)) return false;
  if (c.peer == nullptr && (!c.remote.paired() || c.remote.gone)) return false;
  c.drain_asked = true;
  c.leaving.store(true, std::memory_order_relaxed);
  c.ev_drain_reason = why;
  Raise(c, kEvDrain);
  counters_.drains_asked.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// c's guest learns that its peer's ring stream ended (every byte of it is
// in c's RX ring): it reads the rest of the peer's stream from the kernel
// socket, and leaves the rings itself if it has not yet.
void ConnManager::TellPeerRingEnd(BackendConn& c, Reason why) {
  c.peer_ring_end_told = true;
  // Its library would follow the ring end anyway; asked first, it knows why.
  if (!c.drain_asked && c.clean_downgrade && c.state == ConnState::kUpgraded && !c.gone) {
    c.drain_asked = true;
    c.leaving.store(true, std::memory_order_relaxed);
    c.ev_drain_reason = why;
    Raise(c, kEvDrain);
  }
  Raise(c, kEvPeerRingEnd | kEvRxTail);
  NoteMoved(c);
}

// Both directions of c have left the rings once its own ring end was
// announced to the peer and the peer's to its guest (a same-host pair's two
// connections reach that together).
void ConnManager::NoteMoved(BackendConn& c) {
  if (!c.ring_ended || !c.shut_announced || !c.peer_ring_end_told || c.moved.load(std::memory_order_relaxed)) return;
  c.moved.store(true, std::memory_order_relaxed);
  if (c.peer != nullptr) c.peer->moved.store(true, std::memory_order_relaxed);
  counters_.drains_done.fetch_add(1, std::memory_order_relaxed);
  MaybeLeft(c);
}

// A moved connection no longer holds a stop up once every byte of both
// ring streams was consumed: its libraries then have (or take from the
// events published before we exit) the CREDIT that lets each one's TX move
// with nothing to resend, and the peer's ring end. (Or once its library
// unregistered it: Orphan. An idle application's library leaves its old
// registration only at its next call.)
void ConnManager::MaybeLeft(BackendConn& c) {
  if (!c.moved.load(std::memory_order_relaxed) || c.rx_consumed != c.rx_tail) return;
  if (c.peer != nullptr) {
    if (c.peer->rx_consumed != c.peer->rx_tail) return;
    c.peer->leaving.store(false, std::memory_order_relaxed);
  } else if (c.remote.credit != c.tx_copied) {
    return;
  }
  c.leaving.store(false, std::memory_order_relaxed);
}

// The locator changed. A pairing request still unanswered by a host that
// no longer runs the peer's address (by the locator, or because the peer's
// VM runs here now) is withdrawn, as a closing guest's would be; then every
// connection waiting for a peer looks again: where the locator says now.
void ConnManager::Relocate() {
  size_t withdrawn = 0;
  if (hosts_ == nullptr) return PairPending(kAllVms);
  for (auto& [h, c] : conns_) {
    BackendConn& x = *c;
    if (x.gone || x.remote.stage != RemotePeer::Stage::kRequested || x.state != ConnState::kPending) continue;
    bool here = LocalPortFor(x.key.tenant, x.key.peer) != nullptr;
    if (!here && hosts_->Locate(x.key.tenant, x.key.peer) == x.remote.host) continue;
    WithdrawPairRequest(x);
    ++withdrawn;
  }
  if (withdrawn > 0) VS_LOG(kInfo, "locator changed: %zu pairing request(s) withdrawn to ask again", withdrawn);
  PairPending(kAllVms);
}

// At the undrain: VM vm_index's connections registered while it drained
// pair now, as they would have at registration. kAllVms: every VM's that
// does not drain (the locator changed).
void ConnManager::PairPending(uint32_t vm_index) {
  std::vector<BackendConn*> todo;
  for (auto& [h, c] : conns_)
    if ((vm_index == kAllVms ? !Draining(c->vm_index) : c->vm_index % kMaxVms == vm_index) && c->WaitsForPeer())
      todo.push_back(c.get());
  size_t paired = 0;
  for (BackendConn* c : todo) {
    if (c->state != ConnState::kPending || c->peer != nullptr) continue;  // paired with an earlier one
    if (PairWithMirror(*c)) paired += c->state == ConnState::kUpgraded;
    else paired += PairRemote(*c);
  }
  if (vm_index == kAllVms) VS_LOG(kInfo, "locator changed: %zu pending connection(s) paired or asked for", paired);
  else VS_LOG(kInfo, "vm index %u: %zu pending connection(s) paired or asked for", vm_index, paired);
}

}  // namespace vsocket::backend
