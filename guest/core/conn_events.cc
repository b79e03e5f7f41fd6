#include "guest/core/conn_events.h"

#include "base/clock.h"
#include "base/log.h"
#include "guest/core/writer.h"

namespace vsocket::guest {

using proto::Message;
using proto::MsgType;

namespace {

struct EventCtx {
  const std::shared_ptr<Conn>& conn;
  const Message& m;
  LinkLostHandler on_resync;
};

uint64_t Count(const Message& m) { return std::get<proto::ConnCounter>(m.body).bytes; }

// The backend asked the connection to leave the rings, or its peer did
// (docs/connection-lifecycle.md §9). The socket layer's handler gives the
// background writer the TX side, for an application that does not call us.
void StartDrain(const EventCtx& e, proto::Reason why) {
  Conn& c = *e.conn;
  if (c.state.phase() != Phase::kUpgraded || c.state.draining()) return;
  c.drain_reason.store(why, std::memory_order_relaxed);
  if (c.state.Apply(ConnEvent::kDrain) && e.on_resync != nullptr) e.on_resync(e.conn);
}

void OnUpgrade(const EventCtx& e) { e.conn->state.Apply(ConnEvent::kUpgrade); }  // (refused unless pending)

void OnFence(const EventCtx& e) { TakePeerFence(*e.conn, Count(e.m)); }

void OnRxTail(const EventCtx& e) { (void)TakeRxTail(*e.conn, Count(e.m)); }

void OnFenceDelivered(const EventCtx& e) {
  e.conn->fence_delivered.store(true, std::memory_order_release);  // (may come before our SwitchTx)
}

void OnCredit(const EventCtx& e) { (void)TakeCredit(*e.conn, Count(e.m)); }

void OnShutdown(const EventCtx& e) {
  Conn& c = *e.conn;
  proto::ShutdownHow how = std::get<proto::Shutdown>(e.m.body).how;
  if (how == proto::ShutdownHow::kRingEnd) {
    // The peer left the rings (a drain): every byte of its ring stream is
    // in our RX ring (the backend says so only after the last one), the
    // rest follows on the kernel socket. Stored before the flag (its
    // release publishes it). If we were not asked, we follow.
    if (!c.state.upgraded() || c.state.peer_ring_ended()) return;
    c.resync_landed.store(c.rx_tail.load(std::memory_order_relaxed), std::memory_order_relaxed);
    c.rx_event_ns.store(MonotonicNs(), std::memory_order_relaxed);
    if (!c.state.ApplyDrain(DrainEvent::kPeerRingEnd)) return;
    VS_LOG(kDebug, "conn %lu: the peer left the rings at %lu", static_cast<unsigned long>(c.id),
           static_cast<unsigned long>(c.rx_tail.load()));
    StartDrain(e, proto::Reason::kPeerDowngraded);
    WakeWriter();
    return;
  }
  // (The peer's close after it left the rings: its kernel socket says it.)
  if (how == proto::ShutdownHow::kRead && c.state.peer_ring_ended()) return;
  VS_LOG(kDebug, "conn %lu: peer shut down %s", static_cast<unsigned long>(c.id),
         how == proto::ShutdownHow::kWrite ? "writing" : "reading");
  if (how == proto::ShutdownHow::kWrite) {
    TakePeerShutWr(c);
  } else {
    c.peer_gone.store(true, std::memory_order_release);
  }
}

void OnDowngrade(const EventCtx& e) {
  const auto& d = std::get<proto::Downgrade>(e.m.body);
  if (d.flags & proto::kDowngradeDrain) {
    // Not a loss: leave the rings with clean fences (resync.cc
    // DrainTxLocked; the background writer finishes it if the application
    // does not call us).
    StartDrain(e, d.reason);
    return;
  }
  if (d.flags & proto::kDowngradeResendFrom) {
    // The peer's process forked and took the connection back to kernel
    // TCP (decision 85): it dropped what it had not read of our ring
    // stream, and we resend from what it consumed, with no header (or it
    // could not map our direct pair, decision 135: from 0); its
    // own ring stream, up to its RESYNC header, is ours to read as after a
    // link loss. Every RX_TAIL came before this event: our landed count is
    // final.
    Conn& c = *e.conn;
    c.resend_from.store(d.bytes_received, std::memory_order_relaxed);
    c.resend_headerless.store(d.reason, std::memory_order_relaxed);
    ApplyLoss(e.conn, LossKind::kLinkDown, c.rx_tail.load(std::memory_order_acquire), false, d.reason, e.on_resync);
    return;
  }
  // fabric-down: the link is gone, the kernel connection is not.
  // peer-not-registered: the peer withdrew before it ever upgraded (it
  // closed while our CONFIRM was still on the way), so its whole stream is
  // on the kernel socket. Either way: finish on the kernel connection
  // without losing a byte (resync.cc, RESYNC). Anything else: the peer is
  // not coming, or aborted.
  bool link = d.reason == proto::Reason::kFabricDown || d.reason == proto::Reason::kPeerNotRegistered;
  ApplyLoss(e.conn, link ? LossKind::kLinkDown : LossKind::kPeerAborted, d.bytes_received,
            (d.flags & proto::kDowngradeFenceAcked) != 0, d.reason, e.on_resync);
}

void OnError(const EventCtx& e) {
  // (vsocketd sends ERROR only as a response today.)
  ApplyLoss(e.conn, LossKind::kProtocolError, 0, false, proto::Reason::kProtocolError, nullptr);
}

struct EventSpec {
  MsgType type;
  void (*handle)(const EventCtx&);
};

constexpr EventSpec kEventHandlers[] = {
    {MsgType::kUpgrade, OnUpgrade},
    {MsgType::kFence, OnFence},
    {MsgType::kRxTail, OnRxTail},
    {MsgType::kFenceDelivered, OnFenceDelivered},
    {MsgType::kCredit, OnCredit},
    {MsgType::kShutdown, OnShutdown},
    {MsgType::kDowngrade, OnDowngrade},
    {MsgType::kError, OnError},
};

// v becomes max(v, x); true if it grew (direct pairs' counts are taken by
// any thread, not only under the session lock).
bool RaiseTo(std::atomic<uint64_t>& v, uint64_t x) {
  uint64_t cur = v.load(std::memory_order_relaxed);
  while (x > cur)
    if (v.compare_exchange_weak(cur, x, std::memory_order_release, std::memory_order_relaxed)) return true;
  return false;
}

}  // namespace

void TakePeerFence(Conn& c, uint64_t fence) {
  c.peer_fence.store(fence, std::memory_order_relaxed);
  c.peer_fence_known.store(true, std::memory_order_release);
}

bool TakeRxTail(Conn& c, uint64_t v) {
  if (v <= c.rx_tail.load(std::memory_order_relaxed)) return false;  // counts never go back
  c.rx_event_ns.store(MonotonicNs(), std::memory_order_relaxed);       // (before the count it dates)
  return RaiseTo(c.rx_tail, v);
}

bool TakeCredit(Conn& c, uint64_t v) {
  if (!RaiseTo(c.credit, v)) return false;
  // A closed connection lingers until its peer consumed everything
  // (close.cc Linger): its end is the writer's, now.
  if (c.state.lingered() && v >= c.tx_tail.load(std::memory_order_relaxed)) WakeWriter();
  // A drain's TX moves once the peer consumed its ring stream.
  if (c.state.tx_ring_ended() && v >= c.tx_ring_end.load(std::memory_order_relaxed))
    WakeWriter();
  return true;
}

void TakePeerShutWr(Conn& c) {
  c.rx_event_ns.store(MonotonicNs(), std::memory_order_relaxed);
  c.peer_shut_wr.store(true, std::memory_order_release);
}

uint64_t EventConnId(const Message& m) {
  if (auto* c = std::get_if<proto::ConnCounter>(&m.body)) return c->conn_id;
  if (auto* u = std::get_if<proto::Upgrade>(&m.body)) return u->conn_id;
  if (auto* s = std::get_if<proto::Shutdown>(&m.body)) return s->conn_id;
  if (auto* d = std::get_if<proto::Downgrade>(&m.body)) return d->conn_id;
  if (auto* e = std::get_if<proto::Error>(&m.body)) return e->conn_id;
  return 0;
}

void DispatchConnEvent(const std::shared_ptr<Conn>& c, const Message& m, LinkLostHandler on_resync) {
  for (const EventSpec& spec : kEventHandlers) {
    if (spec.type != m.type) continue;
    spec.handle(EventCtx{c, m, on_resync});
    break;
  }
  c->gen.fetch_add(1, std::memory_order_acq_rel);
}

}  // namespace vsocket::guest
