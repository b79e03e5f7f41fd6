// Fabric frames to peer hosts: owed control frames, and DATA within the
// peer's credit window.
#include "host-backend/conn/conn_manager.h"

#include <algorithm>

#include "host-backend/remote/frame.h"

namespace vsocket::backend {

using proto::FrameHeader;
using proto::FrameType;

void ConnManager::Owe(BackendConn& c, uint32_t bits) {
  c.link_owed |= bits;
  if (!c.in_owed_list) {
    c.in_owed_list = true;
    owed_.push_back(&c);
  }
}

// Sends what c owes, in order; false if the link could not take it all.
bool ConnManager::SendOwed(BackendConn& c) {
  fabric::Link* link = hosts_ ? hosts_->LinkTo(c.remote.host, c.handle) : nullptr;
  bool live = c.remote.paired();
  if (!live || link == nullptr) {
    c.link_owed = 0;  // nothing to say to a peer that is gone
    return true;
  }
  static const std::pair<uint32_t, FrameType> kOrder[] = {{kOweConfirm, FrameType::kPairConfirm},
                                                          {kOwePlacement, FrameType::kPlacement},
                                                          {kOwePlacementAck, FrameType::kPlacementAck},
                                                          {kOweFence, FrameType::kFence},
                                                          {kOweFenceAck, FrameType::kFenceAck},
                                                          {kOweCredit, FrameType::kCredit},
                                                          {kOweShutWr, FrameType::kShutWr},
                                                          {kOweGone, FrameType::kGone},
                                                          {kOweAbort, FrameType::kAbort},
                                                          {kOweRelease, FrameType::kRelease}};
  for (const auto& [bit, type] : kOrder) {
    if (!(c.link_owed & bit)) continue;
    uint64_t value = type == FrameType::kFence          ? c.fence_bytes
                     : type == FrameType::kCredit       ? c.rx_consumed
                     : type == FrameType::kShutWr       ? c.tx_copied
                     : type == FrameType::kPlacement    ? reinterpret_cast<uint64_t>(c.rx_mr.addr)
                     : type == FrameType::kPlacementAck ? c.remote.placements_seen
                                                        : 0;
    uint32_t aux = type == FrameType::kPlacement                  ? c.rx_rkey
                   : type == FrameType::kShutWr && c.ring_ended
                       ? proto::ShutRingEndAux(c.drain_asked ? c.ev_drain_reason : proto::Reason::kPeerDowngraded)
                                                                : 0;
    if (!link->Send(Frame(type, c.key.tenant, c.remote.handle, value, aux), {})) return false;
    c.link_owed &= ~bit;
    if (type == FrameType::kPlacement) ++c.placements_sent;
    if (type == FrameType::kRelease) {
      c.remote.stage = RemotePeer::Stage::kDetached;
      c.link_owed = 0;
      return true;
    }
    if (type == FrameType::kAbort) c.remote.gone = true;  // nothing more goes to it
  }
  if (c.link_owed & kOweData) {
    if (!link->Writable()) return false;
    c.link_owed &= ~kOweData;
    MarkMovable(c);
  }
  return true;
}

uint64_t ConnManager::MoveRemote(BackendConn& c) {
  if (!c.fence_received || c.remote.gone) return 0;
  if ((c.link_owed & (kOweConfirm | kOweFence)) && !SendOwed(c)) {
    // They precede data. The link is full: PumpLinks sends them when it
    // drains, and the data must then follow without waiting for the guest
    // (which may have filled its whole window already and says no more).
    Owe(c, kOweData);
    return 0;
  }
  fabric::Link* link = hosts_ ? hosts_->LinkTo(c.remote.host, c.handle) : nullptr;
  if (link == nullptr) return 0;
  uint64_t moved = 0;
  for (;;) {
    const uint8_t* src;
    uint32_t src_size;
    uint64_t src_pos, avail;
    if (c.gone) {
      src = c.orphan.data();
      src_size = 0;
      src_pos = c.orphan_off;
      avail = c.orphan.size() - c.orphan_off;
    } else {
      if (c.tx.host == nullptr) break;  // paused
      src = c.tx.host;
      src_size = c.tx.size;
      src_pos = c.tx_copied;
      avail = c.tx_tail - c.tx_copied;
    }
    uint64_t in_flight = c.tx_copied - c.remote.credit;
    uint64_t space = c.remote.window > in_flight ? c.remote.window - in_flight : 0;
    uint64_t n = std::min<uint64_t>({avail, space, proto::kMaxDataFrame});
    // rdma: the payload is written straight to its final place in the
    // peer's RX ring, which must take it contiguously: a piece that would
    // wrap goes as two frames.
    fabric::RemoteBuffer rb;
    if (c.remote.rdma_addr != 0 && c.remote.window != 0) {
      uint64_t roff = c.tx_copied & (c.remote.window - 1);
      n = std::min<uint64_t>(n, c.remote.window - roff);
      rb = {c.remote.rdma_addr + roff, c.remote.rdma_rkey};
    }
    if (n == 0) break;
    iovec v[2];
    int nv = 1;
    if (src_size == 0) {
      v[0] = {const_cast<uint8_t*>(src) + src_pos, n};
    } else {
      uint64_t off = src_pos & (src_size - 1);
      uint64_t first = std::min<uint64_t>(n, src_size - off);
      v[0] = {const_cast<uint8_t*>(src) + off, first};
      if (first < n) v[nv++] = {const_cast<uint8_t*>(src), n - first};
    }
    FrameHeader h = Frame(FrameType::kData, c.key.tenant, c.remote.handle, c.tx_copied);
    h.len = static_cast<uint32_t>(n);
    uint64_t frame = link->NextFrameNumber();
    if (!link->Send(h, {v, static_cast<size_t>(nv)}, rb.addr != 0 ? &rb : nullptr)) {
      Owe(c, kOweData);  // retried when the link has room
      break;
    }
    // Read in place from the registered ring: the bytes stay until released.
    if (!c.gone && c.tx_mr != nullptr) c.txh->Sent(link, c.remote.host, frame, c.tx_copied, c.tx_copied + n);
    if (c.gone) c.orphan_off += n;
    c.tx_copied += n;
    moved += n;
    c.accel_bytes_out.fetch_add(n, std::memory_order_relaxed);
    vm_totals_[c.vm_index % kMaxVms].accel_bytes_out.fetch_add(n, std::memory_order_relaxed);
    counters_.accel_bytes.fetch_add(n, std::memory_order_relaxed);
    counters_.fabric_bytes_out.fetch_add(n, std::memory_order_relaxed);
  }
  MaybeAnnounceShutdown(c);
  return moved;
}

bool ConnManager::PumpLinks() {
  bool reaped = !reap_.empty() && ReapTx();
  reaped |= ApplyRegistrations();
  if (owed_.empty()) return reaped;
  std::vector<BackendConn*> list;
  list.swap(owed_);
  bool sent = false;
  for (size_t i = 0; i < list.size(); ++i) {
    BackendConn* c = list[i];
    uint32_t before = c->link_owed;
    bool done = SendOwed(*c);
    sent |= c->link_owed != before;
    if (!done) {
      owed_.push_back(c);  // keeps its place; the link is full
      continue;
    }
    c->in_owed_list = false;
    MaybeDestroy(c);
  }
  return sent;
}

}  // namespace vsocket::backend
