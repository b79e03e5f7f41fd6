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
  // Registered for this host already (paired with it again): the peer may
  // use it at once. Otherwise it is asked of the registrar once the
  // pairing names the host (SubmitRx); the bytes are staged until then.
  if (c.rx_mr.addr == nullptr || c.rx_mr.host != host) return;
  *addr = reinterpret_cast<uint64_t>(c.rx_mr.addr);
  *rkey = c.rx_rkey;
}

bool ConnManager::WantsRx(const BackendConn& c) const {
  using Stage = RemotePeer::Stage;
  // A library that would reuse the ring right after UNREGISTER's answer
  // (no kFeatureRingHold) could have a late one-sided write land in
  // whatever it puts there next: its bytes are staged instead. A ring
  // still registered for another host (its writes may be under way) is
  // not registered for this one: no registration serves two hosts.
  // Nor while the VM is copied (its dirty log on): a NIC's one-sided write
  // is marked only when its completion reaches us, and not at all if it
  // lands after the switchover stopped the device, so a live migration
  // must not rely on it (decision 88). The reconfiguration that turned the
  // log on retired the registration (OnDetach: RetireRx, withdrawn by the
  // next PLACEMENT); the bytes are staged, and our staged copy is marked.
  // Registered again when the log goes off (a cancelled migration).
  return hosts_ != nullptr && c.ring_hold && !(c.device != nullptr && c.device->logging()) && c.rx.host != nullptr && !c.gone && c.rx_mr.addr == nullptr &&
         !c.remote.gone &&
         (c.remote.stage == Stage::kRequested || c.remote.stage == Stage::kAccepted || c.remote.paired());
}

void ConnManager::SubmitRx(BackendConn& c) {
  if (c.rx_reg_pending || !WantsRx(c)) return;
  RegisterFn fn = hosts_->Registering(c.remote.host, c.rx.host, c.rx.size, true);
  if (!fn) return;  // another fabric: its links place the bytes
  registrar_.Submit({.handle = c.handle,
                     .epoch = c.map_epoch,
                     .rx = true,
                     .host = c.remote.host,
                     .addr = c.rx.host,
                     .len = c.rx.size,
                     .fn = std::move(fn)});
  c.rx_reg_pending = true;
}

void ConnManager::RetireRx(BackendConn& c) {
  if (c.rx_mr.addr == nullptr) return;
  // (remote.gone is no reason to drop it: a peer whose guest left still
  // sends what that guest had written.)
  if (!c.remote.paired() || hosts_ == nullptr || hosts_->LinkTo(c.remote.host, c.handle) == nullptr) {
    // Not paired yet (the peer may hold the rkey from PAIR_ACCEPT): kept to
    // the end; or no link, so nothing writes any more: dropped now.
    if (c.remote.stage != RemotePeer::Stage::kAccepted || c.rx_mr_untold) {
      UnregisterRx(c.rx_mr);
      c.rx_mr = RxRegion{};
      c.rx_mr_untold = false;
    }
    return;
  }
  // The PLACEMENT that withdraws it is the next one sent (owed frames are
  // coalesced: it carries whatever the registration is by then).
  c.rx_mr_retired.emplace_back(c.placements_sent + 1, c.rx_mr);
  c.rx_mr = RxRegion{};
  c.rx_rkey = 0;
  c.rx_mr_untold = false;
  Owe(c, kOwePlacement);
}

void ConnManager::UnregisterRx(const RxRegion& r) {
  if (hosts_ == nullptr) return;
  registrar_.Dispose(hosts_->TakeRemoteWritable(r.host, r.addr));
  counters_.rdma_rx_regions_dropped.fetch_add(1, std::memory_order_relaxed);
}

void ConnManager::DropRx(BackendConn& c) {
  if (hosts_ == nullptr) return;
  if (c.rx_mr.addr != nullptr) UnregisterRx(c.rx_mr);
  for (const auto& [tag, r] : c.rx_mr_retired) UnregisterRx(r);
  c.rx_mr = RxRegion{};
  c.rx_rkey = 0;
  c.rx_mr_untold = false;
  c.rx_mr_retired.clear();
  MaybeReleaseRings(c);
}

bool ConnManager::TxRegistrable(const BackendConn& c) const {
  return hosts_ != nullptr && c.ring_hold && c.tx_mr == nullptr && c.tx.host != nullptr && !c.gone &&
         c.remote.paired() && !c.remote.gone;
}

void ConnManager::SubmitTx(BackendConn& c) {
  if (c.tx_reg_pending || !TxRegistrable(c)) return;
  RegisterFn fn = hosts_->Registering(c.remote.host, c.tx.host, c.tx.size, false);
  if (!fn) return;  // another fabric: sends copy
  registrar_.Submit({.handle = c.handle,
                     .epoch = c.map_epoch,
                     .rx = false,
                     .host = c.remote.host,
                     .addr = c.tx.host,
                     .len = c.tx.size,
                     .fn = std::move(fn)});
  c.tx_reg_pending = true;
}

bool ConnManager::ApplyRegistrations() {
  if (!registrar_.HasDone()) return false;
  for (Registrar::Done& d : registrar_.Take()) {
    const Registrar::Job& j = d.job;
    counters_.rdma_reg_us.fetch_add(d.ns / 1000, std::memory_order_relaxed);
    auto it = conns_.find(j.handle);
    BackendConn* c = it == conns_.end() ? nullptr : it->second.get();
    if (c != nullptr) (j.rx ? c->rx_reg_pending : c->tx_reg_pending) = false;
    if (!d.result.ok()) {
      // Rarely: a ring the guest placed where another registration starts.
      // The link's staging ring carries its bytes / its sends copy.
      VS_LOG(kWarn, "conn %lu: %s ring not registered (%s): %s", static_cast<unsigned long>(j.handle),
             j.rx ? "RX" : "TX", d.result.status().message().c_str(), j.rx ? "staged instead" : "its sends are copied");
      continue;
    }
    Registration reg = std::move(d.result).value();
    // Still wanted as asked: the same mapping of the same ring, for the
    // host it is paired (or pairing) with now.
    bool current = c != nullptr && c->map_epoch == j.epoch && c->remote.host == j.host &&
                   (j.rx ? WantsRx(*c) && c->rx.host == j.addr && c->rx.size == j.len
                         : TxRegistrable(*c) && c->tx.host == j.addr && c->tx.size == j.len);
    uint32_t rkey = 0;
    Status st = current ? hosts_->Adopt(j.host, &reg, &rkey) : Status::Ok();
    if (!current || !st.ok()) {
      if (!st.ok())
        VS_LOG(kWarn, "conn %lu: %s ring not registered (%s)", static_cast<unsigned long>(j.handle),
               j.rx ? "RX" : "TX", st.message().c_str());
      counters_.rdma_reg_discarded.fetch_add(1, std::memory_order_relaxed);
      registrar_.Dispose(std::move(reg));
      // Stale (remapped, paired elsewhere): asked again for what it is now.
      if (c != nullptr && !current) {
        if (j.rx) SubmitRx(*c);
        else SubmitTx(*c);
      }
      continue;
    }
    if (j.rx) {
      c->rx_mr = RxRegion{j.addr, j.host};
      c->rx_rkey = rkey;
      counters_.rdma_rx_regions.fetch_add(1, std::memory_order_relaxed);
      // The peer writes one-sided from its PLACEMENT on (staged until then).
      if (c->remote.paired()) Owe(*c, kOwePlacement);
      else c->rx_mr_untold = true;
    } else {
      c->tx_mr = j.addr;
      c->tx_mr_host = j.host;
      if (!c->txh) c->txh = std::make_unique<TxHold>();
      counters_.rdma_tx_regions.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return true;
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
  if (hosts_) registrar_.Dispose(hosts_->ReleaseSendable(token));
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
