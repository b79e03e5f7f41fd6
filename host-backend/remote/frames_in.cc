// Fabric frames arriving from peer hosts: routed to their connection, checked
// against its window, DATA placed into its RX ring.
#include "host-backend/conn/conn_manager.h"

#include "base/log.h"
#include "host-backend/conn/ring_copy.h"
#include "host-backend/remote/link_sink.h"

namespace vsocket::backend {

using proto::FrameHeader;
using proto::FrameType;
using proto::Reason;

ConnManager::ConnManager() = default;
ConnManager::~ConnManager() = default;

fabric::FrameSink& ConnManager::LinkSink(uint32_t host, uint32_t link) {
  auto& s = sinks_[(uint64_t{host} << 32) | link];
  if (!s) s = std::make_unique<Sink>(this, host);
  return *s;
}

bool ConnManager::OtherTenants(uint32_t host, const FrameHeader& h, const BackendConn* c) {
  if (c == nullptr || c->key.tenant == h.tenant) return false;
  // Never act on another tenant's connection, whatever the peer says.
  counters_.frames_cross_tenant.fetch_add(1, std::memory_order_relaxed);
  counters_.frames_dropped.fetch_add(1, std::memory_order_relaxed);
  VS_LOG(kWarn, "peer host %u: %s frame for tenant %u names a connection of tenant %u: dropped", host,
         proto::ToString(h.type), h.tenant, c->key.tenant);
  return true;
}

BackendConn* ConnManager::FrameTarget(uint32_t host, const FrameHeader& h) {
  auto it = conns_.find(h.handle);
  BackendConn* c = it == conns_.end() ? nullptr : it->second.get();
  if (OtherTenants(host, h, c)) return nullptr;
  if (c == nullptr || c->remote.host != host ||
      (c->remote.stage != RemotePeer::Stage::kPaired && c->remote.stage != RemotePeer::Stage::kAccepted)) {
    // Late frames for a connection already released are expected.
    counters_.frames_dropped.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  return c;
}

fabric::PayloadDest ConnManager::OnLinkData(uint32_t host, const FrameHeader& h) {
  fabric::PayloadDest d;
  BackendConn* c = FrameTarget(host, h);
  if (c == nullptr || c->gone) return d;  // discarded (our guest left: nobody reads it)
  uint64_t space = c->rx.size - (c->rx_tail - c->rx_consumed);
  if (!c->remote.paired() || h.value != c->rx_tail || h.len > space) {
    VS_LOG(kWarn, "peer host %u: DATA for conn %lu at %lu+%u, expected %lu with %lu free: connection reset", host,
           static_cast<unsigned long>(c->handle), static_cast<unsigned long>(h.value), h.len,
           static_cast<unsigned long>(c->rx_tail), static_cast<unsigned long>(space));
    PeerViolation(*c, "peer host sent data outside the credit window");
    return d;
  }
  return Landing(*c, c->rx_tail, h.len);
}

fabric::PayloadDest ConnManager::OnLinkDataResume(uint32_t host, const FrameHeader& h, uint32_t landed) {
  BackendConn* c = FrameTarget(host, h);
  // Gone meanwhile (our guest left, or the connection was released): the
  // rest is discarded. Otherwise its window was checked at the header.
  if (c == nullptr || c->gone || landed > h.len || h.value != c->rx_tail) return {};
  return Landing(*c, h.value + landed, h.len - landed);
}

fabric::PayloadDest ConnManager::Landing(BackendConn& c, uint64_t pos, uint64_t len) {
  fabric::PayloadDest d;
  if (c.rx.host == nullptr) {
    // Device paused for reconfiguration: hold the bytes until it is back
    // (OnAttach copies the stash to the ring at rx_stash_pos).
    if (c.rx_stash.empty()) c.rx_stash_pos = pos;
    if (pos < c.rx_stash_pos) return d;
    uint64_t end = pos + len - c.rx_stash_pos;
    if (c.rx_stash.size() < end) c.rx_stash.resize(end);
    d.iov[0] = {c.rx_stash.data() + (pos - c.rx_stash_pos), len};
    d.n = 1;
    return d;
  }
  uint64_t off = pos & (c.rx.size - 1);
  uint64_t first = std::min<uint64_t>(len, c.rx.size - off);
  d.iov[0] = {c.rx.host + off, first};
  d.n = 1;
  if (first < len) {
    d.iov[1] = {c.rx.host, len - first};
    d.n = 2;
  }
  return d;
}

void ConnManager::OnPlacedData(uint32_t host, const FrameHeader& h) {
  BackendConn* c = FrameTarget(host, h);
  if (c == nullptr || c->gone) return;  // landed in a ring nobody reads any more
  uint64_t space = c->rx.size - (c->rx_tail - c->rx_consumed);
  // One-sided writes are only possible into a registration we handed out;
  // the stream position and the window are checked as for a staged DATA.
  bool registered = c->rx_mr.addr != nullptr || !c->rx_mr_retired.empty();
  if (!c->remote.paired() || !registered || h.value != c->rx_tail || h.len > space) {
    VS_LOG(kWarn, "peer host %u: placed DATA for conn %lu at %lu+%u, expected %lu with %lu free%s: connection reset",
           host, static_cast<unsigned long>(c->handle), static_cast<unsigned long>(h.value), h.len,
           static_cast<unsigned long>(c->rx_tail), static_cast<unsigned long>(space),
           registered ? "" : " (no registration)");
    PeerViolation(*c, "peer host placed data outside the credit window");
    return;
  }
  counters_.fabric_bytes_placed.fetch_add(h.len, std::memory_order_relaxed);
  OnLinkFrame(host, h);
}

// A frame a peer host may not send now: that connection is reset (our
// guest sees ECONNRESET, the peer an ABORT; Violation logs it), the link
// and the others go on.
void ConnManager::PeerViolation(BackendConn& c, const char* what) {
  counters_.fabric_violations.fetch_add(1, std::memory_order_relaxed);
  Violation(c, what);
  Owe(c, kOweAbort);
}

void ConnManager::OnLinkFrame(uint32_t host, const FrameHeader& h) {
  BackendConn* c = FrameTarget(host, h);
  if (c == nullptr) return;
  if (c->remote.stage == RemotePeer::Stage::kAccepted) {
    // The requester's first frame: it has our handle, so both are paired.
    if (c->gone) return;
    UpgradeRemote(*c);
  }
  switch (h.type) {
    case FrameType::kData:
      c->rx_tail += h.len;
      c->accel_bytes_in.fetch_add(h.len, std::memory_order_relaxed);
      vm_totals_[c->vm_index % kMaxVms].accel_bytes_in.fetch_add(h.len, std::memory_order_relaxed);
      counters_.fabric_bytes_in.fetch_add(h.len, std::memory_order_relaxed);
      if (c->rx.host != nullptr) {
        // The payload is in the ring (readv, a staged copy, or placed
        // one-sidedly): marked for a live migration now that it landed.
        MarkRingWritten(c->device->memory(), c->rx.host, c->rx.size, c->rx_tail - h.len, h.len);
        Raise(*c, kEvRxTail);
      }
      break;
    case FrameType::kFence:
      if (c->remote.fence_seen) {
        PeerViolation(*c, "peer host sent a second FENCE");
        break;
      }
      c->remote.fence_seen = true;
      c->ev_peer_fence = h.value;
      Raise(*c, kEvFence);
      // Acknowledged once the FENCE event is in our guest's event queue
      // (EmitEvents): only then may the peer put a RESYNC header on the
      // kernel stream after a link loss, because only then does our guest
      // know where the peer's kernel bytes end before it reads past them.
      c->fence_ack_pending = true;
      break;
    case FrameType::kFenceAck:
      c->remote.fence_acked = true;
      if (c->fence_delivered) Raise(*c, kEvFenceDelivered);
      break;
    case FrameType::kCredit:
      if (h.value < c->remote.credit || h.value > c->tx_copied) {
        PeerViolation(*c, "peer host sent a credit for bytes never sent");
        break;
      }
      c->remote.credit = h.value;
      UpdateCredit(*c);
      MarkMovable(*c);
      if (c->moved.load(std::memory_order_relaxed)) MaybeLeft(*c);
      break;
    case FrameType::kShutWr:
      if ((h.aux & 0xff) != proto::kShutRingEnd) {
        Raise(*c, kEvPeerShutWr | kEvRxTail);
      } else if (!c->clean_downgrade) {
        // Our guest's library cannot leave the rings cleanly (an older one).
        PeerViolation(*c, "peer host moved a connection off the rings that our guest cannot follow");
      } else {
        TellPeerRingEnd(*c, proto::ShutRingEndReason(h.aux));
      }
      break;
    case FrameType::kGone:
      c->remote.gone = true;
      Raise(*c, kEvPeerGone);
      MaybeAnnounceShutdown(*c);
      MaybeDestroy(c);
      break;
    case FrameType::kAbort:
    case FrameType::kDowngrade: {
      c->reason = h.type == FrameType::kAbort ? Reason::kPeerDowngraded : PeerReason(h.aux);
      c->remote.gone = true;
      Raise(*c, kEvDowngrade);
      MaybeDestroy(c);
      break;
    }
    case FrameType::kPairConfirm: break;  // the upgrade above was all it asked for
    case FrameType::kPlacement:
      // Only where our DATA lands in the peer's memory; its rkey guards it.
      c->remote.rdma_addr = h.value;
      c->remote.rdma_rkey = h.aux;
      ++c->remote.placements_seen;
      Owe(*c, kOwePlacementAck);
      break;
    case FrameType::kPlacementAck: {
      // Every DATA placed under a withdrawn rkey has landed: drop those.
      auto& r = c->rx_mr_retired;
      for (auto it = r.begin(); it != r.end();) {
        if (it->first <= h.value) {
          UnregisterRx(it->second);
          counters_.rdma_rx_withdrawn.fetch_add(1, std::memory_order_relaxed);
          it = r.erase(it);
        } else {
          ++it;
        }
      }
      MaybeReleaseRings(*c);
      MaybeDestroy(c);
      break;
    }
    case FrameType::kRelease:
      // Only after one side left (our guest, or the peer by GONE, ABORT or
      // DOWNGRADE): a RELEASE under a live connection would strand our
      // guest, upgraded, with nobody to send it anything.
      if (!c->gone && !c->remote.gone) {
        PeerViolation(*c, "peer host released a connection neither side left");
        break;
      }
      c->remote.stage = RemotePeer::Stage::kDetached;
      c->link_owed &= ~kOweData;
      MaybeDestroy(c);
      break;
    default: counters_.frames_dropped.fetch_add(1, std::memory_order_relaxed); break;
  }
}

}  // namespace vsocket::backend
