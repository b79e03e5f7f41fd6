#include "guest/core/direct.h"

#include <unistd.h>

#include "base/log.h"
#include "guest/core/conn_events.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {

namespace {

void Wake(const Conn& c) {
  uint64_t one = 1;
  if (c.direct_wake.fd >= 0) (void)!Libc().write(c.direct_wake.fd, &one, sizeof(one));
}

}  // namespace

Status AttachDirect(Conn& c, Transport& t, uint64_t token) {
  if (c.direct) return Status(Code::kFailedPrecondition, "already direct");
  auto fds = t.FetchDirect(token);
  if (!fds.ok()) return fds.status();
  auto ring = DirectRing::Map(fds->memory.get(), static_cast<int>(fds->side));
  Libc().close(fds->memory.release());  // (the mapping stays)
  if (!ring.ok()) {
    Libc().close(fds->wake.release());
    return ring.status();
  }
  // Said before anything of ours is in it; refused if the peer already
  // left the pair and decided we never map it (decision 135).
  if (!(*ring)->Attach()) {
    Libc().close(fds->wake.release());
    return Status(Code::kFailedPrecondition, "the peer left the pair before we mapped it");
  }
  c.region_tx = c.tx;
  c.region_rx = c.rx;
  c.tx = (*ring)->tx();
  c.rx = (*ring)->rx();
  c.ring_size = (*ring)->ring_bytes();
  c.db = nullptr;
  c.direct_wake.fd = OwnFd(fds->wake.release());
  (*ring)->PromiseHeavyAsks();
  c.direct.Set(std::move(*ring));
  return Status::Ok();
}

void RetireDirect(Conn& c) {
  if (!c.direct) return;
  c.direct.Retire();
  if (c.direct_wake.fd >= 0) CloseOwnFd(c.direct_wake.fd);
  c.direct_wake.fd = -1;
  c.direct_broken.store(false, std::memory_order_relaxed);
  c.tx = c.rx = c.region_tx = c.region_rx = nullptr;
  c.ring_size = 0;
}

bool PullDirect(Conn& c) {
  DirectRing* d = c.direct.get();
  if (d == nullptr || c.direct_broken.load(std::memory_order_relaxed)) return false;
  // Back on kernel TCP (a fork's resync, a loss): the counts are final.
  // But a drain's RX reads the ring to the peer's ring end, also after our
  // own TX moved (ring_final: not before that end).
  if (c.state.reset() || (c.state.resynced() && c.state.ring_final())) return false;
  // (The order of these loads is what DirectRing::Check needs.)
  uint64_t rx_tail = c.rx_tail.load(std::memory_order_acquire);
  uint64_t credit = c.credit.load(std::memory_order_acquire);
  DirectRing::Peer p = d->Load();
  uint64_t rx_head = c.rx_head.load(std::memory_order_acquire);
  uint64_t tx_tail = c.tx_tail.load(std::memory_order_acquire);
  if (Status st = d->Check(p, rx_tail, credit, rx_head, tx_tail); !st.ok()) {
    if (!c.direct_broken.exchange(true))
      VS_LOG(kWarn, "conn %lu: %s: connection reset", static_cast<unsigned long>(c.id), st.message().c_str());
    return true;
  }
  // As the backend's FENCE, RX_TAIL, CREDIT and SHUTDOWN events would.
  bool changed = false;
  if (p.fence_set && !c.peer_fence_known.load(std::memory_order_acquire)) {  // (set once)
    TakePeerFence(c, p.fence);
    changed = true;
  }
  changed |= TakeRxTail(c, p.produced);
  changed |= TakeCredit(c, p.consumed);
  // The EOF after every count above (its flag was loaded first).
  if (p.shut_wr && !c.peer_shut_wr.load(std::memory_order_acquire)) {
    TakePeerShutWr(c);
    changed = true;
  }
  if (changed) c.gen.fetch_add(1, std::memory_order_acq_rel);
  return changed;
}

void AnnounceDirect(Conn& c, bool produced, uint64_t value) {
  DirectRing* d = c.direct.get();
  if (produced ? d->PublishProduced(value) : d->PublishConsumed(value)) Wake(c);
}

bool PublishDirectFence(Conn& c, uint64_t fence) {
  if (!c.direct) return true;
  bool wake = false;
  bool set = c.direct->PublishFence(fence, &wake);
  if (wake) Wake(c);
  return set;
}

void CloseDirectFence(Conn& c) {
  uint64_t fence = 0;
  if (c.direct && c.direct->CloseFence(&fence) && !c.peer_fence_known.load(std::memory_order_acquire))
    TakePeerFence(c, fence);
}

void PublishDirectRingEnd(Conn& c, uint64_t end) {
  if (c.direct) c.direct->PublishRingEnd(end);  // (the SHUTDOWN that follows wakes the peer)
}

void PublishDirectShutWr(Conn& c) {
  if (c.direct && c.direct->PublishShutWr()) Wake(c);
}

bool WaitsForConsumption(const Conn& c) {
  uint64_t used = c.tx_tail.load(std::memory_order_relaxed) - c.credit.load(std::memory_order_acquire);
  if (used == 0) return false;
  // Leaving the rings (a drain, a resync, a close): what waits there waits
  // for the peer to consume everything.
  if (c.state.phase() != Phase::kUpgraded || c.state.draining() || c.state.tx_ring_ended() || c.state.resynced())
    return true;
  // Open: a writer waits only for room (send, POLLOUT: a full ring).
  return used >= c.ring_size / 2;
}

void FenceDirectAsks(const std::vector<std::shared_ptr<Conn>>& conns) {
  DirectRing::FenceAsks(conns.begin(), conns.end(), [](const std::shared_ptr<Conn>& c) { return c->direct.get(); });
}

void ArmDirect(Conn& c) {
  if (!c.direct) return;
  c.direct->WantProduced();
  if (WaitsForConsumption(c)) c.direct->WantConsumed();
}

}  // namespace vsocket::guest
