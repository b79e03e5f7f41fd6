// rdma fabric: guest rings registered as memory regions (RX for one-sided
// writes by the peer host, TX for sends that read in place), and the
// credits held back while sends still read a TX ring.
#include "host-backend/conn/conn_manager.h"

#include <algorithm>

#include "base/clock.h"
#include "base/log.h"

namespace vsocket::backend {

void ConnManager::RegisterRx(BackendConn& c, uint32_t host, uint64_t* addr, uint32_t* rkey) {
  *addr = 0;
  *rkey = 0;
  // A library that would reuse the ring right after UNREGISTER's answer
  // (no kFeatureRingHold) could have a late one-sided write land in
  // whatever it puts there next: its bytes are staged instead.
  if (hosts_ == nullptr || c.rx.host == nullptr || c.gone || !c.ring_hold) return;
  // Still registered for another host (its writes may be under way): this
  // one's bytes are staged; no registration serves two hosts.
  if (c.rx_mr.addr != nullptr && c.rx_mr.host != host) return;
  if (c.rx_mr.addr == nullptr) {
    uint32_t k = 0;
    int64_t t0 = MonotonicNs();
    Status st = hosts_->RegisterRemoteWritable(host, c.rx.host, c.rx.size, &k);
    counters_.rdma_reg_us.fetch_add((MonotonicNs() - t0) / 1000, std::memory_order_relaxed);
    if (!st.ok()) {
      // Another fabric, or (rarely) a ring the guest placed where another
      // registration starts: the link's staging ring carries its bytes.
      if (st.code() != Code::kFailedPrecondition)
        VS_LOG(kWarn, "conn %lu: RX ring not registered (%s): staged instead", static_cast<unsigned long>(c.handle),
               st.message().c_str());
      return;
    }
    c.rx_mr = RxRegion{c.rx.host, host};
    c.rx_rkey = k;
    counters_.rdma_rx_regions.fetch_add(1, std::memory_order_relaxed);
  }
  *addr = reinterpret_cast<uint64_t>(c.rx_mr.addr);
  *rkey = c.rx_rkey;
}

void ConnManager::RetireRx(BackendConn& c) {
  if (c.rx_mr.addr == nullptr) return;
  // (remote.gone is no reason to drop it: a peer whose guest left still
  // sends what that guest had written.)
  if (!c.remote.paired() || hosts_ == nullptr || hosts_->LinkTo(c.remote.host, c.handle) == nullptr) {
    // Not paired yet (the peer may hold the rkey from PAIR_ACCEPT): kept to
    // the end; or no link, so nothing writes any more: dropped now.
    if (c.remote.stage != RemotePeer::Stage::kAccepted) {
      UnregisterRx(c.rx_mr);
      c.rx_mr = RxRegion{};
    }
    return;
  }
  // The PLACEMENT that withdraws it is the next one sent (owed frames are
  // coalesced: it carries whatever the registration is by then).
  c.rx_mr_retired.emplace_back(c.placements_sent + 1, c.rx_mr);
  c.rx_mr = RxRegion{};
  c.rx_rkey = 0;
  Owe(c, kOwePlacement);
}

void ConnManager::UnregisterRx(const RxRegion& r) {
  if (hosts_ == nullptr) return;
  hosts_->UnregisterRemoteWritable(r.host, r.addr);
  counters_.rdma_rx_regions_dropped.fetch_add(1, std::memory_order_relaxed);
}

void ConnManager::DropRx(BackendConn& c) {
  if (hosts_ == nullptr) return;
  if (c.rx_mr.addr != nullptr) UnregisterRx(c.rx_mr);
  for (const auto& [tag, r] : c.rx_mr_retired) UnregisterRx(r);
  c.rx_mr = RxRegion{};
  c.rx_rkey = 0;
  c.rx_mr_retired.clear();
  MaybeReleaseRings(c);
}

bool ConnManager::TxRegistrable(const BackendConn& c) const {
  return hosts_ != nullptr && c.ring_hold && c.tx_mr == nullptr && c.tx.host != nullptr && !c.gone;
}

void ConnManager::QueueTx(BackendConn& c) {
  if (TxRegistrable(c)) tx_queue_.push_back(c.handle);
}

bool ConnManager::RegisterQueuedTx() {
  if (tx_queue_.empty()) return false;
  // At least one per pass, then as many as fit in about a millisecond:
  // pairing requests and guest messages are served in between.
  int64_t until = MonotonicNs() + 1'000'000;
  do {
    uint64_t handle = tx_queue_.front();
    tx_queue_.pop_front();
    auto it = conns_.find(handle);
    // (Still paired and mapped: not detached, paused or closed meanwhile.)
    if (it != conns_.end() && it->second->remote.paired() && !it->second->remote.gone) RegisterTx(*it->second);
  } while (!tx_queue_.empty() && MonotonicNs() < until);
  return true;
}

void ConnManager::RegisterTx(BackendConn& c) {
  if (!TxRegistrable(c)) return;
  int64_t t0 = MonotonicNs();
  Status st = hosts_->RegisterSendable(c.remote.host, c.tx.host, c.tx.size);
  counters_.rdma_reg_us.fetch_add((MonotonicNs() - t0) / 1000, std::memory_order_relaxed);
  if (!st.ok()) {
    if (st.code() != Code::kFailedPrecondition)
      VS_LOG(kWarn, "conn %lu: TX ring not registered (%s): its sends are copied", static_cast<unsigned long>(c.handle),
             st.message().c_str());
    return;
  }
  c.tx_mr = c.tx.host;
  c.tx_mr_host = c.remote.host;
  if (!c.txh) c.txh = std::make_unique<TxHold>();
  counters_.rdma_tx_regions.fetch_add(1, std::memory_order_relaxed);
}

void ConnManager::WithdrawTx(BackendConn& c) {
  if (c.tx_mr == nullptr) return;
  uint64_t token = hosts_ ? hosts_->WithdrawSendable(c.tx_mr_host, c.tx_mr) : 0;
  c.tx_mr = nullptr;
  counters_.rdma_tx_regions_dropped.fetch_add(1, std::memory_order_relaxed);
  if (token == 0) return;
  if (c.txh->Withdrawn(token)) AddReap(c);
  else ReleaseTxToken(token);
}

void ConnManager::ReleaseTxToken(uint64_t token) {
  if (hosts_) hosts_->ReleaseSendable(token);
}

bool ConnManager::HoldsRings(const BackendConn& c) const {
  return c.rx_mr.addr != nullptr || !c.rx_mr_retired.empty() || (c.txh && c.txh->Busy());
}

void ConnManager::MaybeReleaseRings(BackendConn& c) {
  if (!c.rings_held || HoldsRings(c)) return;
  c.rings_held = false;
  counters_.rings_released.fetch_add(1, std::memory_order_relaxed);
  if (c.device == nullptr) return;
  if (DeviceConns* dc = Find(*c.device)) dc->released.push_back(c.conn_id);
}

void ConnManager::UpdateCredit(BackendConn& c) {
  uint64_t credit = c.remote.credit;
  if (c.txh) {
    std::vector<uint64_t> tokens;
    c.txh->Reap(&tokens);
    for (uint64_t t : tokens) ReleaseTxToken(t);
    credit = std::min(credit, c.txh->Released(c.tx_copied));
  }
  if (credit > c.ev_credit) {
    c.ev_credit = credit;
    Raise(c, kEvCredit);
  }
  if (credit < c.remote.credit && !c.gone) {
    // The peer consumed bytes a send may still read (its completion is not
    // in yet): the guest must not overwrite them before it is.
    counters_.credit_held.fetch_add(1, std::memory_order_relaxed);
    AddReap(c);
  }
}

void ConnManager::AddReap(BackendConn& c) {
  if (c.in_reap_list) return;
  c.in_reap_list = true;
  reap_.push_back(&c);
}

bool ConnManager::ReapTx() {
  std::vector<BackendConn*> list;
  list.swap(reap_);
  bool progress = false;
  for (BackendConn* c : list) {
    c->in_reap_list = false;
    uint64_t before = c->ev_credit;
    if (c->txh) {
      std::vector<uint64_t> tokens;
      c->txh->Reap(&tokens);
      for (uint64_t t : tokens) ReleaseTxToken(t);
    }
    if (!c->gone && c->ev_credit < c->remote.credit) UpdateCredit(*c);  // back on the list while held
    progress |= c->ev_credit != before;
    MaybeReleaseRings(*c);
    if (c->txh && c->txh->HasWithdrawn()) AddReap(*c);
    else if (c->gone) MaybeDestroy(c);  // (back on the list while sends read its ring)
  }
  return progress;
}

}  // namespace vsocket::backend
