// What each guest connection request does (ConnManager::Handle).
#include "host-backend/conn/conn_manager.h"

#include <algorithm>

#include "base/clock.h"
#include "base/log.h"
#include "host-backend/conn/address.h"

namespace vsocket::backend {

using proto::Message;
using proto::MsgType;
using proto::Reason;
using proto::WireError;

namespace {

Message Ack(uint64_t request_id, uint64_t conn_id, WireError st, Reason reason, uint32_t window = 0) {
  return Message{MsgType::kRegisterAck, request_id, proto::RegisterAck{conn_id, st, reason, window}};
}

Message BadMessage(uint64_t request_id) {
  return Message{MsgType::kError, request_id, proto::Error{0, WireError::kBadMessage, Reason::kProtocolError}};
}

}  // namespace

// Every guest request the connection manager serves, with its handler (made
// at compile time, like DPDK vhost-user's VHOST_MESSAGE_HANDLER table).
// `names_conn`: the message names a registered connection (ConnCounter or
// Shutdown body); Handle looks it up first and takes the counts its
// doorbell block holds, so the handler gets it in `c`. `answers`: the guest
// waits for the reply. `takes_first`: the guest sees it taken before it
// acts (a FENCE: decision 124).
constinit const ConnManager::RequestHandler ConnManager::kRequestHandlers[] = {
    {MsgType::kRegisterConn, &ConnManager::OnRegister, false, true, false},
    {MsgType::kUnregister, &ConnManager::OnUnregister, false, true, false},
    {MsgType::kPairingQuery, &ConnManager::OnPairingQuery, true, true, false},
    {MsgType::kFence, &ConnManager::OnFence, true, false, true},
    {MsgType::kTxTail, &ConnManager::OnTxTail, true, false, false},
    {MsgType::kConsumed, &ConnManager::OnConsumed, true, false, false},
    {MsgType::kShutdown, &ConnManager::OnShutdown, true, false, false},
    {MsgType::kDowngrade, &ConnManager::OnDowngrade, true, true, false},
};

bool ConnManager::Serves(MsgType type) {
  for (const RequestHandler& h : kRequestHandlers)
    if (h.type == type) return true;
  return false;
}

RequestResult ConnManager::Handle(vhost::BackendDevice& device, const Message& msg, Message* reply,
                                  RequestTaker* taker) {
  DeviceConns* dc = Find(device);
  if (dc == nullptr) return RequestResult::kNoReply;
  const RequestHandler* handler = nullptr;
  for (const RequestHandler& h : kRequestHandlers)
    if (h.type == msg.type) handler = &h;
  if (handler == nullptr) {
    *reply = BadMessage(msg.request_id);
    return RequestResult::kReply;
  }
  // Nothing of it happens until the guest can see it taken (it writes no
  // reply).
  if (handler->takes_first && taker != nullptr) taker->Take();
  if (!handler->names_conn) return (this->*handler->handle)(*dc, nullptr, msg, reply);
  uint64_t conn_id = 0;
  if (auto* c = std::get_if<proto::ConnCounter>(&msg.body)) conn_id = c->conn_id;
  else if (auto* s = std::get_if<proto::Shutdown>(&msg.body)) conn_id = s->conn_id;
  else if (auto* d = std::get_if<proto::Downgrade>(&msg.body)) conn_id = d->conn_id;
  else {
    *reply = BadMessage(msg.request_id);
    return RequestResult::kReply;
  }
  auto it = dc->by_id.find(conn_id);
  if (it == dc->by_id.end()) {
    counters_.protocol_violations.fetch_add(1, std::memory_order_relaxed);
    VS_LOG(kDebug, "device %lu: %s for unknown conn %lu: dropped", static_cast<unsigned long>(device.id()),
           proto::ToString(msg.type), static_cast<unsigned long>(conn_id));
    // A race with our own teardown, or a confused guest; a caller that
    // waits hears so at once.
    if (!handler->answers) return RequestResult::kNoReply;
    *reply = Ack(msg.request_id, conn_id, WireError::kUnknownConnection, Reason::kNone);
    return RequestResult::kReply;
  }
  BackendConn& c = *it->second;
  // The block may hold counts the guest published before posting this
  // message (a send() right before shutdown()): take them first.
  if (c.doorbell && ReadDoorbell(c) < 0) return RequestResult::kNoReply;
  return (this->*handler->handle)(*dc, &c, msg, reply);
}

RequestResult ConnManager::OnRegister(DeviceConns& dc, BackendConn*, const Message& msg, Message* reply) {
  *reply = Register(dc, msg.request_id, std::get<proto::RegisterConn>(msg.body));
  return RequestResult::kReply;
}

RequestResult ConnManager::OnUnregister(DeviceConns& dc, BackendConn*, const Message& msg, Message* reply) {
  *reply = Unregister(dc, msg.request_id, std::get<proto::Unregister>(msg.body).conn_id);
  return RequestResult::kReply;
}

RequestResult ConnManager::OnPairingQuery(DeviceConns&, BackendConn* conn, const Message& msg, Message* reply) {
  BackendConn& c = *conn;
  bool pairing = c.state == ConnState::kUpgraded || c.remote.stage == RemotePeer::Stage::kAccepted;
  *reply = Ack(msg.request_id, c.conn_id, WireError::kOk, pairing ? Reason::kNone : c.reason);
  return RequestResult::kReply;
}

RequestResult ConnManager::OnFence(DeviceConns&, BackendConn* conn, const Message& msg, Message*) {
  BackendConn& c = *conn;
  if (c.state != ConnState::kUpgraded || c.fence_received) {
    Violation(c, "unexpected FENCE");
    return RequestResult::kNoReply;
  }
  c.fence_received = true;
  c.fence_bytes = std::get<proto::ConnCounter>(msg.body).bytes;
  c.kernel_bytes_out.store(c.fence_bytes, std::memory_order_relaxed);
  if (c.peer) {
    c.peer->ev_peer_fence = c.fence_bytes;
    Raise(*c.peer, kEvFence);
  }
  if (c.remote.paired()) Owe(c, kOweFence);
  MarkMovable(c);
  return RequestResult::kNoReply;
}

// TX_TAIL or CONSUMED of a doorbell connection: the count was read from
// the block (Handle); the message says the guest saw the want flag, so the
// block is polled again. `allowed`: the message may come in this state.
RequestResult ConnManager::RepollDoorbell(DeviceConns& dc, BackendConn& c, bool allowed, const char* violation) {
  if (!allowed) {
    Violation(c, violation);
    return RequestResult::kNoReply;
  }
  counters_.doorbell_messages.fetch_add(1, std::memory_order_relaxed);
  AddDoorbell(dc, c);
  return RequestResult::kNoReply;
}

RequestResult ConnManager::OnTxTail(DeviceConns& dc, BackendConn* conn, const Message& msg, Message*) {
  BackendConn& c = *conn;
  if (c.doorbell)
    return RepollDoorbell(dc, c, c.state == ConnState::kUpgraded && c.fence_received, "TX_TAIL before FENCE");
  (void)ApplyTxTail(c, std::get<proto::ConnCounter>(msg.body).bytes);
  return RequestResult::kNoReply;
}

RequestResult ConnManager::OnConsumed(DeviceConns& dc, BackendConn* conn, const Message& msg, Message*) {
  BackendConn& c = *conn;
  if (c.doorbell) return RepollDoorbell(dc, c, c.state == ConnState::kUpgraded, "CONSUMED before the upgrade");
  (void)ApplyConsumed(c, std::get<proto::ConnCounter>(msg.body).bytes);
  return RequestResult::kNoReply;
}

namespace {

// Whether [start, start + len) meets a range of `taken` (start -> end).
bool Taken(const std::map<uint64_t, uint64_t>& taken, uint64_t start, uint64_t len) {
  auto it = taken.lower_bound(start);
  if (it != taken.end() && it->first < start + len) return true;
  return it != taken.begin() && std::prev(it)->second > start;
}

}  // namespace

// Whether c's rings (with the doorbell block after TX) overlap each other or
// those of any connection registered on the device.
bool ConnManager::RingsOverlap(const DeviceConns& dc, const BackendConn& c) {
  if (c.tx.gpa < c.rx.gpa + c.rx.size && c.rx.gpa < c.tx.gpa + TxSpan(c)) return true;
  return Taken(dc.rings, c.tx.gpa, TxSpan(c)) || Taken(dc.rings, c.rx.gpa, c.rx.size);
}

// Abortive close (the kernel would send RST): unsent bytes are dropped and
// the peer's next call fails with ECONNRESET.
void ConnManager::AbortTx(BackendConn& c) {
  c.write_shut = c.shut_announced = true;
  c.tx_tail = c.tx_copied;
  if (c.peer) {
    c.peer->reason = Reason::kPeerDowngraded;
    Raise(*c.peer, kEvDowngrade);
  }
  if (c.remote.paired()) Owe(c, kOweAbort);
}

// DOWNGRADE from a guest: with flag DRAIN, its busy loop went quiet
// (MoveBack, below); with RESEND_FROM (kFeatureForkResync, decision 85),
// its process is about to fork, and a connection it shares with the child leaves the
// rings for good first. From here nothing more moves between c's rings
// and its peer's: the peer's guest is told to resend its ring stream from
// the byte c's application consumed (no RESYNC header, the rest of c's RX
// ring is dropped), and c's library resends its own TX ring from the
// peer's credit after a RESYNC header, as after a link loss. Refused (the
// library then leaves the connection as it is, and the child is told
// ECONNRESET) where that cannot be exact: a peer that shut down writing
// (its FIN may be out), a drain or shutdown under way, a peer on another
// host (not yet), or a peer's library without the feature. A pending
// connection needs nothing here: its library unregisters it.
RequestResult ConnManager::OnDowngrade(DeviceConns&, BackendConn* conn, const Message& msg, Message* reply) {
  BackendConn& c = *conn;
  const auto& d = std::get<proto::Downgrade>(msg.body);
  if (d.flags == proto::kDowngradeDrain) return MoveBack(c, d, msg.request_id, reply);
  if (d.reason == Reason::kDirectUnavailable) return DirectUnmapped(c, d, msg.request_id, reply);
  if (!c.fork_resync || d.reason != Reason::kForked || d.flags != proto::kDowngradeResendFrom) {
    *reply = BadMessage(msg.request_id);
    return RequestResult::kReply;
  }
  auto refuse = [&](const char* why) {
    counters_.fork_refused.fetch_add(1, std::memory_order_relaxed);
    VS_LOG(kInfo, "conn %lu: fork resync refused: %s", static_cast<unsigned long>(c.conn_id), why);
    *reply = Ack(msg.request_id, c.conn_id, WireError::kNotPaired, Reason::kForked);
    return RequestResult::kReply;
  };
  if (c.state != ConnState::kUpgraded) {
    *reply = Ack(msg.request_id, c.conn_id, WireError::kOk, c.reason);  // never upgraded: nothing to move
    return RequestResult::kReply;
  }
  BackendConn* p = c.peer;
  if (p == nullptr) return refuse(c.remote.paired() ? "the peer is on another host" : "the peer is gone");
  if (c.gone || c.write_shut || c.drain_asked || c.ring_ended || c.shut_announced)
    return refuse("shutting down or draining");
  if (p->gone || p->write_shut || p->drain_asked || p->ring_ended || !p->fork_resync || p->state != ConnState::kUpgraded)
    return refuse("the peer is shutting down, draining, or its library cannot resend");
  // What the guest consumed lies between what it reported and what landed
  // (a direct pair's counts never pass here: the peer's library checks it
  // against its own, PrepareHeaderlessResendLocked).
  if (!c.direct && (d.bytes_received > c.rx_tail || d.bytes_received < c.rx_consumed)) {
    Violation(c, "fork DOWNGRADE outside the RX ring's bytes");
    *reply = Ack(msg.request_id, c.conn_id, WireError::kBadMessage, Reason::kProtocolError);
    return RequestResult::kReply;
  }
  // Every RX_TAIL the peer's guest was owed goes out before its DOWNGRADE
  // (one buffer, in order): its landed count is final with it.
  p->reason = Reason::kForked;
  p->ev_resend = true;
  p->ev_resend_from = d.bytes_received;
  Raise(*p, kEvDowngrade);
  c.reason = Reason::kForked;
  p->peer = nullptr;
  c.peer = nullptr;
  counters_.fork_resyncs.fetch_add(1, std::memory_order_relaxed);
  VS_LOG(kDebug, "conn %lu: leaves the rings for a fork; its peer resends from %lu", static_cast<unsigned long>(c.conn_id),
         static_cast<unsigned long>(d.bytes_received));
  *reply = Ack(msg.request_id, c.conn_id, WireError::kOk, Reason::kForked);
  return RequestResult::kReply;
}

// DOWNGRADE(direct-unavailable, kDowngradeResendFrom, 0) from a library
// that could not fetch or map its side of c's direct pair (out of file
// descriptors or address space, or its peer gave up on it first: decision
// 135). It stays on kernel TCP, its ring stream never began; its peer,
// which may have switched onto the pair and written there already, is
// told to resend its ring stream from byte 0 with no RESYNC header (as to a
// forking process's peer, decision 85) and stays on kernel TCP too. A peer
// already gone closed while this side's `attached` word was 0, so its
// library lingered and resent its bytes on the kernel socket itself.
RequestResult ConnManager::DirectUnmapped(BackendConn& c, const proto::Downgrade& d, uint64_t request_id,
                                          Message* reply) {
  if (!c.direct_resend || !c.direct || d.flags != proto::kDowngradeResendFrom || d.bytes_received != 0) {
    Violation(c, "DOWNGRADE(direct-unavailable) of a connection that is no direct pair's, or not from 0");
    *reply = Ack(request_id, c.conn_id, WireError::kBadMessage, Reason::kProtocolError);
    return RequestResult::kReply;
  }
  c.reason = Reason::kDirectUnavailable;
  BackendConn* p = c.peer;
  if (p == nullptr || p->gone || !p->direct_resend) {
    VS_LOG(kInfo, "conn %lu: its library could not map its direct pair; %s", static_cast<unsigned long>(c.conn_id),
           p == nullptr || p->gone ? "the peer is gone" : "the peer's library cannot resend");
    *reply = Ack(request_id, c.conn_id, WireError::kNotPaired, Reason::kDirectUnavailable);
    return RequestResult::kReply;
  }
  counters_.direct_unmapped.fetch_add(1, std::memory_order_relaxed);
  p->reason = Reason::kDirectUnavailable;
  p->ev_resend = true;
  p->ev_resend_from = 0;
  Raise(*p, kEvDowngrade);
  p->peer = nullptr;
  c.peer = nullptr;
  VS_LOG(kInfo, "conn %lu: its library could not map its direct pair: the peer (conn %lu) resends on kernel TCP",
         static_cast<unsigned long>(c.conn_id), static_cast<unsigned long>(p->conn_id));
  *reply = Ack(request_id, c.conn_id, WireError::kOk, Reason::kDirectUnavailable);
  return RequestResult::kReply;
}

// DOWNGRADE(drain, kernel-faster) from a guest (kFeatureMoveBack, decision
// 92): the busy event loop that registered c is not busy any more, and a
// lone request/response connection is faster on kernel TCP where vsocketd
// shares the CPUs. Drained as an operator's drain is (AskDrain: c's guest
// ends its ring stream, the peer's follows with the same reason, nothing
// resent), then both libraries hold the connection on kernel TCP again.
RequestResult ConnManager::MoveBack(BackendConn& c, const proto::Downgrade& d, uint64_t request_id, Message* reply) {
  if (!c.move_back || d.reason != Reason::kKernelFaster) {
    *reply = BadMessage(request_id);
    return RequestResult::kReply;
  }
  bool asked = AskDrain(c, Reason::kKernelFaster);
  if (asked) counters_.moved_back.fetch_add(1, std::memory_order_relaxed);
  *reply = Ack(request_id, c.conn_id, asked ? WireError::kOk : WireError::kNotPaired, Reason::kKernelFaster);
  return RequestResult::kReply;
}

RequestResult ConnManager::OnShutdown(DeviceConns&, BackendConn* conn, const Message& msg, Message*) {
  BackendConn& c = *conn;
  auto how = std::get<proto::Shutdown>(msg.body).how;
  if (how == proto::ShutdownHow::kBoth) {
    AbortTx(c);
  } else if (how == proto::ShutdownHow::kWrite) {
    c.write_shut = true;
    MaybeAnnounceShutdown(c);
  } else if (how == proto::ShutdownHow::kRingEnd) {
    // The guest leaves the rings (a drain, or its peer's): nothing more
    // comes into its TX ring, and its peer learns where the ring stream
    // ends once every byte before it was delivered.
    if (!c.clean_downgrade || c.state != ConnState::kUpgraded || c.write_shut) {
      Violation(c, "unexpected SHUTDOWN(ring end)");
      return RequestResult::kNoReply;
    }
    c.ring_ended = c.write_shut = true;
    counters_.ring_ends.fetch_add(1, std::memory_order_relaxed);
    MaybeAnnounceShutdown(c);
  }
  return RequestResult::kNoReply;
}

namespace {

// The 4-tuple a registration names, as the kernel would show it.
vhost::SocketTuple TupleOf(const proto::RegisterConn& r) {
  vhost::SocketTuple t;
  t.family = r.local.family == proto::Family::kIpv4 ? 4 : 6;
  t.local_addr = r.local.addr;
  t.peer_addr = r.peer.addr;
  if (t.family == 4) {
    std::fill(t.local_addr.begin() + 4, t.local_addr.end(), 0);
    std::fill(t.peer_addr.begin() + 4, t.peer_addr.end(), 0);
  }
  t.local_port = r.local.port;
  t.peer_port = r.peer.port;
  return t;
}

}  // namespace

Message ConnManager::Register(DeviceConns& dc, uint64_t request_id, const proto::RegisterConn& r) {
  const vhost::PortConfig& port = *dc.device->port();
  if (!AddressAllowed(port, r.local)) {
    counters_.rejected_spoofed.fetch_add(1, std::memory_order_relaxed);
    VS_LOG(kWarn, "vm %s: registration for a foreign local address refused (anti-spoofing)", port.vm_name.c_str());
    CountFallback(port.index, Reason::kSpoofedAddress);
    return Ack(request_id, r.conn_id, WireError::kSpoofedAddress, Reason::kSpoofedAddress);
  }
  // Process mode: the registering process must have proved it holds the
  // socket (vhost/backend/socket_proof.h): another process of the same VM
  // cannot register its connections.
  if (port.prove_sockets && !dc.device->proofs().Take(TupleOf(r))) {
    counters_.rejected_unproven.fetch_add(1, std::memory_order_relaxed);
    VS_LOG(kWarn, "vm %s: registration of a socket its process did not prove it holds refused", port.vm_name.c_str());
    CountFallback(port.index, Reason::kSpoofedAddress);
    return Ack(request_id, r.conn_id, WireError::kSpoofedAddress, Reason::kSpoofedAddress);
  }
  bool bulk = (r.flags & proto::kRegisterBulk) && dc.bulk_hint;
  bool tentative = (r.flags & proto::kRegisterTentative) && dc.tentative;
  if ((bulk || tentative) && BulkBetterOnKernel(port.tenant_id, r)) {
    // A copy-bound stream to another host across the tcp fabric: kernel
    // TCP is faster (decision 62). So is a busy loop's request/response
    // there (decision 83: Node.js keep-alive 0.84x, redis pipelined 0.88x
    // across it; the fabric's copies and the daemons' passes cost more than
    // the batching saves). Its peer's side is told, so that it does not
    // wait for a pairing that never comes (decision 63).
    counters_.kept_kernel_faster.fetch_add(1, std::memory_order_relaxed);
    CountFallback(port.index, Reason::kKernelFaster);
    DeclineRemote(port.tenant_id, r, Reason::kKernelFaster);
    return Ack(request_id, r.conn_id, WireError::kNotPaired, Reason::kKernelFaster);
  }
  if (!IsLoopback(r.local) && !IsLoopback(r.peer)) {
    // Its peer's host kept the other side on kernel TCP already.
    if (auto why = TakeDecline(ConnKey{port.tenant_id, 0, r.local, r.peer}, true)) {
      CountFallback(port.index, *why);
      return Ack(request_id, r.conn_id, WireError::kNotPaired, ForGuest(*why, dc.knows_directory));
    }
  }
  if (r.role == proto::Role::kClient && !Draining(port.index) && DirectoryCannotPlace(port.tenant_id, r)) {
    // Its peer runs on no host the directory's cache names, and the
    // directory cannot be asked (etcd unreachable): kernel TCP, and both
    // ends say why (decision 95).
    CountFallback(port.index, Reason::kDirectoryUnavailable);
    DeclineEverywhere(port.tenant_id, r, Reason::kDirectoryUnavailable);
    return Ack(request_id, r.conn_id, WireError::kNotPaired,
               ForGuest(Reason::kDirectoryUnavailable, dc.knows_directory));
  }
  if (dc.by_id.count(r.conn_id) || dc.by_id.size() >= kMaxConnsPerDevice || vm_open_[port.index] >= conns_per_vm_) {
    counters_.rejected_other.fetch_add(1, std::memory_order_relaxed);
    CountFallback(port.index, Reason::kResourceLimit);
    return Ack(request_id, r.conn_id, WireError::kTooManyConnections, Reason::kResourceLimit);
  }
  auto owned = std::make_unique<BackendConn>();
  BackendConn& c = *owned;
  c.device = dc.device;
  c.vm_index = port.index;
  c.conn_id = r.conn_id;
  c.role = r.role;
  bool loop = IsLoopback(r.local) || IsLoopback(r.peer);
  c.key = ConnKey{port.tenant_id, loop ? port.index + 1 : 0, r.local, r.peer};
  c.tx = GuestRing{r.tx_ring_gpa, r.tx_ring_bytes, nullptr};
  c.rx = GuestRing{r.rx_ring_gpa, r.rx_ring_bytes, nullptr};
  c.doorbell = dc.doorbell;
  c.ring_hold = dc.ring_hold;
  c.fence_delivered = dc.fence_delivered;
  c.clean_downgrade = dc.clean_downgrade;
  c.fork_resync = dc.fork_resync;
  c.move_back = dc.move_back;
  c.knows_directory = dc.knows_directory;
  c.takes_direct = dc.direct;
  c.direct_resend = dc.direct_resend;
  c.direct_only = tentative && (r.flags & proto::kRegisterDirect) && dc.direct;
  // A doorbell block must be 64-byte aligned (its counts are atomics).
  if ((c.doorbell && r.tx_ring_gpa % proto::kDoorbellBytes != 0) || !ResolveRings(c) ||
      (c.doorbell && reinterpret_cast<uintptr_t>(c.tx.host) % proto::kDoorbellBytes != 0)) {
    counters_.rejected_other.fetch_add(1, std::memory_order_relaxed);
    CountFallback(port.index, Reason::kProtocolError);
    return Ack(request_id, r.conn_id, WireError::kBadRing, Reason::kProtocolError);
  }
  if (RingsOverlap(dc, c)) {
    // Aliased rings would let one guest page stand for many connections'
    // rings (and for many copies of undelivered bytes when they close).
    counters_.rejected_overlap.fetch_add(1, std::memory_order_relaxed);
    VS_LOG(kWarn, "vm %s: registration refused: its rings overlap each other or another connection's",
           port.vm_name.c_str());
    CountFallback(port.index, Reason::kProtocolError);
    return Ack(request_id, r.conn_id, WireError::kBadRing, Reason::kProtocolError);
  }
  c.handle = next_handle_++;
  if (!registry_.insert(c.key, c.handle)) {
    counters_.rejected_other.fetch_add(1, std::memory_order_relaxed);
    CountFallback(port.index, Reason::kResourceLimit);
    return Ack(request_id, r.conn_id, WireError::kInternal, Reason::kResourceLimit);
  }
  conns_.emplace(c.handle, std::move(owned));
  dc.by_id[c.conn_id] = &c;
  dc.rings[c.tx.gpa] = c.tx.gpa + TxSpan(c);
  dc.rings[c.rx.gpa] = c.rx.gpa + c.rx.size;
  counters_.registered.fetch_add(1, std::memory_order_relaxed);
  if (tentative) {
    tentative_.push_back({c.handle, MonotonicMs() + proto::kTentativeWaitMs});
    counters_.tentative_registered.fetch_add(1, std::memory_order_relaxed);
  }
  VS_LOG(kDebug, "conn %lu registered: %s, port %u -> %u", static_cast<unsigned long>(c.handle),
         c.role == proto::Role::kClient ? "client" : "server", c.key.local.port, c.key.peer.port);
  vm_totals_[c.vm_index % kMaxVms].registrations.fetch_add(1, std::memory_order_relaxed);
  counters_.active.fetch_add(1, std::memory_order_relaxed);
  ++vm_open_[c.vm_index];

  Message ack =
      Ack(request_id, r.conn_id, WireError::kOk, Reason::kPending, std::min(r.tx_ring_bytes, r.rx_ring_bytes));
  if (c.direct_only && !DirectPossible(c)) {
    // Its peer is no process it may share a pair with (another tenant's,
    // another host's, or a VM whose `direct` says no): through vsocketd
    // this request/response connection would be slower than kernel TCP.
    DeclineDirect(c);
    return ack;
  }
  if (!PairWithMirror(c)) {
    // The mirror 4-tuple registered by another tenant is counted for the
    // operator, never told to either tenant: it is none of their business,
    // and with overlapping addresses it may be a coincidence or a probe.
    ConnKey tuple = c.key.Mirror();
    tuple.tenant = 0;
    uint32_t other_tenant = 0;
    if (by_tuple_.find(tuple, other_tenant) && other_tenant != c.key.tenant) {
      counters_.cross_tenant.fetch_add(1, std::memory_order_relaxed);
      c.cross_tenant_mirror = true;
    }
    ConnKey mine = c.key;
    mine.tenant = 0;
    by_tuple_.insert_or_assign(mine, c.key.tenant);
    (void)PairRemote(c);
  }
  return ack;
}

bool ConnManager::ExpireTentative() {
  if (tentative_.empty()) return false;
  int64_t now = MonotonicMs();
  bool any = false;
  while (!tentative_.empty() && tentative_.front().due_ms <= now) {
    auto it = conns_.find(tentative_.front().handle);
    tentative_.pop_front();
    if (it == conns_.end()) continue;  // closed meanwhile
    BackendConn* c = it->second.get();
    // A client's request to the peer's host still unanswered (that host's
    // guest has not registered its side: not a busy loop, or not
    // preloaded) is withdrawn, as a locator change withdraws it; an accept
    // crossing the cancel is cancelled back (OnPairingFrame), and the
    // acceptor's guest upgrades only at our first link frame.
    if (!c->gone && c->state == ConnState::kPending && c->reason == Reason::kPending && c->peer == nullptr &&
        c->remote.stage == RemotePeer::Stage::kRequested && hosts_ != nullptr)
      WithdrawPairRequest(*c);
    if (!c->WaitsForPeer()) continue;  // closed, paired, or accepted by a peer host meanwhile
    // Its peer's process is not busy (or not preloaded): the connection goes
    // on on kernel TCP, as a PAIR_DECLINE would leave it (the library ends
    // the registration, the rings are its own again; a busy loop's library
    // holds it again and may try once more later).
    c->reason = Reason::kPeerNotRegistered;
    Raise(*c, kEvDowngrade);  // (its fallback counted as it goes out, events.cc)
    counters_.tentative_expired.fetch_add(1, std::memory_order_relaxed);
    any = true;
  }
  return any;
}

int ConnManager::SleepTimeoutMs() const {
  if (tentative_.empty() && left_with_vm_.empty()) return -1;
  int64_t due = INT64_MAX;
  if (!tentative_.empty()) due = tentative_.front().due_ms;
  if (!left_with_vm_.empty()) due = std::min(due, left_with_vm_.front().due_ms);  // (LeaveWithVm)
  int64_t left = due - MonotonicMs();
  return left <= 0 ? 0 : static_cast<int>(left) + 1;
}

Message ConnManager::Unregister(DeviceConns& dc, uint64_t request_id, uint64_t conn_id) {
  auto it = dc.by_id.find(conn_id);
  if (it == dc.by_id.end()) return Ack(request_id, conn_id, WireError::kUnknownConnection, Reason::kNone);
  BackendConn* c = it->second;
  dc.by_id.erase(it);
  // Never paired and never told why: its peer did not come (in this tenant).
  if (c->state == ConnState::kPending && c->reason == Reason::kPending)
    CountFallback(c->vm_index, c->cross_tenant_mirror ? Reason::kCrossTenant : Reason::kPeerNotRegistered);
  dc.rings.erase(c->tx.gpa);
  dc.rings.erase(c->rx.gpa);
  Orphan(*c);
  uint64_t handle = c->handle;
  MaybeDestroy(c);
  // After a plain reply the guest may reuse the rings' memory. One that
  // the fabric still reads (sends in flight) or a peer host may still write
  // (a withdrawn registration) is held until RINGS_RELEASED. Decided after
  // MaybeDestroy: a destroyed connection dropped every registration.
  auto left = conns_.find(handle);
  if (left != conns_.end() && left->second->ring_hold && HoldsRings(*left->second)) {
    left->second->rings_held = true;
    counters_.rings_held.fetch_add(1, std::memory_order_relaxed);
    return Ack(request_id, conn_id, WireError::kOk, Reason::kRingsHeld);
  }
  return Ack(request_id, conn_id, WireError::kOk, Reason::kNone);
}

// Pairs c with the mirrored registration of the same tenant if that one
// waits for its peer: pairing looks only within the tenant (tenants may use
// the same addresses), only at registrations still waiting for their peer
// (not one a peer host is pairing), and not while either VM drains (they
// pair when it is undrained). True if the mirror is registered at all.
bool ConnManager::PairWithMirror(BackendConn& c) {
  uint64_t peer_handle = 0;
  if (!registry_.find(c.key.Mirror(), peer_handle)) return false;
  auto it = conns_.find(peer_handle);
  if (it == conns_.end()) return true;
  BackendConn* p = it->second.get();
  if (p->WaitsForPeer() && p->role != c.role && !Draining(c.vm_index) && !Draining(p->vm_index)) {
    if ((c.direct_only || p->direct_only) && !DirectAllowed(c, *p)) {
      // A side registered only for a direct pair, and this one would not
      // be (decision 98): that side goes back to kernel TCP; the other
      // waits as for any peer that has not registered.
      if (c.direct_only) DeclineDirect(c);
      if (p->direct_only) DeclineDirect(*p);
      return true;
    }
    Pair(c, *p);
  }
  return true;
}

// Whether a bulk registration of `tenant` is better left on kernel TCP: its
// peer runs on another host (the locator says which, and no VM of ours has
// the address) across a fabric that copies more than kernel TCP.
bool ConnManager::BulkBetterOnKernel(uint32_t tenant, const proto::RegisterConn& r) {
  if (hosts_ == nullptr || !hosts_->BulkSlowerThanKernel() || IsLoopback(r.local) || IsLoopback(r.peer) ||
      LocalPortFor(tenant, r.peer) != nullptr)
    return false;
  return hosts_->Locate(tenant, r.peer) != 0;
}

// c's peer may run on another host: accepts the PAIR_REQUEST kept for it,
// or, for a client, asks the host the locator names (not while c's VM
// drains). True if it did either.
bool ConnManager::PairRemote(BackendConn& c) {
  if (c.reason != Reason::kPending || c.key.scope != 0 || Draining(c.vm_index)) return false;
  auto pr = pending_remote_.find(c.key);
  if (pr != pending_remote_.end()) {
    // (Decision 104: until the directory places the requester there.)
    if (pr->second.unconfirmed && !hosts_->Runs(pr->second.host, c.key.tenant, c.key.peer)) return false;
    PendingRemote r = pr->second;
    ErasePendingRemote(pr);
    if (r.expires_ms < MonotonicMs()) return false;
    AcceptRemote(c, r);
    return true;
  }
  if (c.role != proto::Role::kClient || hosts_ == nullptr || LocalPortFor(c.key.tenant, c.key.peer) != nullptr)
    return false;
  uint32_t host = hosts_->Locate(c.key.tenant, c.key.peer);
  if (host == 0) return false;
  RequestRemotePair(c, host);
  return true;
}

bool ConnManager::ApplyTxTail(BackendConn& c, uint64_t tail) {
  if (c.direct) {
    Violation(c, "TX_TAIL for a direct connection (its bytes never pass here)");
    return false;
  }
  uint64_t credit = c.peer ? c.peer->rx_consumed : c.remote.paired() ? c.remote.credit : c.tx_copied;
  // The guest may fill its TX ring only up to what the peer has freed.
  if (c.state != ConnState::kUpgraded || !c.fence_received || c.write_shut || tail < c.tx_tail ||
      tail - credit > c.tx.size) {
    Violation(c, "TX tail outside the credit window");
    return false;
  }
  c.tx_tail = tail;
  MarkMovable(c);
  return true;
}

bool ConnManager::ApplyConsumed(BackendConn& c, uint64_t consumed) {
  if (c.direct) {
    Violation(c, "CONSUMED for a direct connection (its bytes never pass here)");
    return false;
  }
  if (c.state != ConnState::kUpgraded || consumed < c.rx_consumed || consumed > c.rx_tail) {
    Violation(c, "CONSUMED beyond what was delivered");
    return false;
  }
  c.rx_consumed = consumed;
  if (c.peer) {
    c.peer->ev_credit = consumed;
    Raise(*c.peer, kEvCredit);
    MarkMovable(*c.peer);  // room in our RX ring again
  }
  if (c.remote.paired()) Owe(c, kOweCredit);
  if (c.moved.load(std::memory_order_relaxed)) MaybeLeft(c);
  return true;
}

}  // namespace vsocket::backend
