// Drains: an operator moves a VM's connections off the rings with clean
// fences (vsocketctl drain, SIGTERM) and back (undrain).
// docs/connection-lifecycle.md §9, decision 54.
#include "host-backend/conn/conn_manager.h"

#include "base/log.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {

using proto::Reason;

uint64_t ConnManager::RequestDrain(uint32_t vm_index, bool drain, Reason why) {
  std::lock_guard<std::mutex> lock(drain_mu_);
  drain_requests_.push_back({vm_index, drain, why, ++drain_seq_});
  drain_requested_.store(true, std::memory_order_release);
  return drain_seq_;
}

bool ConnManager::ApplyDrainRequests() {
  if (!drain_requested_.load(std::memory_order_acquire)) return false;
  std::vector<DrainRequest> todo;
  {
    std::lock_guard<std::mutex> lock(drain_mu_);
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
    for (uint32_t vm : vms) {
      drain_[vm].store(r.drain ? static_cast<uint16_t>(r.why) : 0, std::memory_order_release);
      VS_LOG(kInfo, "vm index %u: %s (%s)", vm, r.drain ? "draining" : "undrained", proto::ToString(r.why));
    }
    if (r.drain) {
      size_t asked = 0;
      for (auto& [h, c] : conns_)
        if (Draining(c->vm_index) && AskDrain(*c, static_cast<Reason>(drain_[c->vm_index % kMaxVms].load())))
          ++asked;
      VS_LOG(kInfo, "drain: %zu connection(s) asked to leave the rings", asked);
    } else {
      for (uint32_t vm : vms) PairPending(vm);
    }
    drain_applied_.store(r.seq, std::memory_order_release);
  }
  return true;
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

// At the undrain: VM vm_index's connections registered while it drained
// pair now, as they would have at registration.
void ConnManager::PairPending(uint32_t vm_index) {
  std::vector<BackendConn*> todo;
  for (auto& [h, c] : conns_)
    if (c->vm_index % kMaxVms == vm_index && !c->gone && c->state == ConnState::kPending && c->peer == nullptr &&
        c->reason == Reason::kPending && c->remote.stage == RemotePeer::Stage::kNone)
      todo.push_back(c.get());
  size_t paired = 0;
  for (BackendConn* c : todo) {
    if (c->state != ConnState::kPending || c->peer != nullptr) continue;  // paired with an earlier one
    if (PairWithMirror(*c)) paired += c->state == ConnState::kUpgraded;
    else paired += PairRemote(*c);
  }
  VS_LOG(kInfo, "vm index %u undrained: %zu pending connection(s) paired or asked for", vm_index, paired);
}

}  // namespace vsocket::backend
