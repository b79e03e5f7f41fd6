// The same-host data path: TX ring to the peer's RX ring, within credits.
#include "host-backend/conn/conn_manager.h"

#include <algorithm>

#include "host-backend/conn/ring_copy.h"

namespace vsocket::backend {

void ConnManager::MarkMovable(BackendConn& c) {
  if (c.in_move_list) return;
  c.in_move_list = true;
  movable_.push_back(&c);
}

void ConnManager::MaybeAnnounceShutdown(BackendConn& c) {
  // EOF reaches the peer only after every byte did.
  if (!c.write_shut || c.shut_announced || (!c.peer && !c.remote.paired()) || c.left_with_vm_ms != 0) return;
  bool drained = c.gone ? c.orphan_off == c.orphan.size() : c.tx_copied == c.tx_tail;
  if (!drained && !(c.remote.paired() && c.remote.gone)) return;
  c.shut_announced = true;
  if (c.peer && c.ring_ended) TellPeerRingEnd(*c.peer, c.drain_asked ? c.ev_drain_reason : proto::Reason::kPeerDowngraded);
  else if (c.peer) Raise(*c.peer, kEvPeerShutWr | kEvRxTail);
  else Owe(c, kOweShutWr);  // (SHUT_WR says kShutRingEnd and the drain's reason for a ring end)
  if (c.ring_ended) NoteMoved(c);
}

uint64_t ConnManager::Move(BackendConn& c) {
  if (c.remote.paired()) return MoveRemote(c);
  BackendConn* p = c.peer;
  if (p == nullptr || p->gone || p->rx.host == nullptr || !c.fence_received || c.left_with_vm_ms != 0) return 0;
  const uint8_t* src;
  uint32_t src_size;
  uint64_t src_pos, avail;
  if (c.gone) {
    src = c.orphan.data();
    src_size = 0;  // linear
    src_pos = c.orphan_off;
    avail = c.orphan.size() - c.orphan_off;
  } else {
    if (c.tx.host == nullptr) return 0;  // paused
    src = c.tx.host;
    src_size = c.tx.size;
    src_pos = c.tx_copied;
    avail = c.tx_tail - c.tx_copied;
  }
  uint64_t space = p->rx.size - (p->rx_tail - p->rx_consumed);
  uint64_t n = std::min(avail, space);
  if (n == 0) return 0;
  RingCopy(p->rx.host, p->rx.size, p->rx_tail, src, src_size, src_pos, n);
  MarkRingWritten(p->device->memory(), p->rx.host, p->rx.size, p->rx_tail, n);
  if (c.gone) c.orphan_off += n;
  c.tx_copied += n;
  p->rx_tail += n;
  c.accel_bytes_out.fetch_add(n, std::memory_order_relaxed);
  p->accel_bytes_in.fetch_add(n, std::memory_order_relaxed);
  vm_totals_[c.vm_index % kMaxVms].accel_bytes_out.fetch_add(n, std::memory_order_relaxed);
  vm_totals_[p->vm_index % kMaxVms].accel_bytes_in.fetch_add(n, std::memory_order_relaxed);
  counters_.accel_bytes.fetch_add(n, std::memory_order_relaxed);
  Raise(*p, kEvRxTail);
  MaybeAnnounceShutdown(c);
  return n;
}

bool ConnManager::MoveData() {
  if (movable_.empty()) return false;
  bool moved = false;
  std::vector<BackendConn*> list;
  list.swap(movable_);
  // A pass moves about kMovePassBudget bytes, then the worker comes back
  // for the rest: requests, events and pairing messages are served between
  // passes, so a burst of bulk data cannot hold them up for long.
  uint64_t budget = kMovePassBudget;
  size_t i = 0;
  for (; i < list.size() && budget > 0; ++i) {
    BackendConn* c = list[i];
    c->in_move_list = false;
    uint64_t n = Move(*c);
    moved |= n > 0;
    budget -= std::min(budget, n);
    MaybeDestroy(c);
  }
  // The rest keep their place, ahead of connections marked since.
  if (i < list.size()) {
    list.erase(list.begin(), list.begin() + static_cast<ptrdiff_t>(i));
    list.insert(list.end(), movable_.begin(), movable_.end());
    movable_.swap(list);
  }
  return moved;
}

}  // namespace vsocket::backend
