#include "host-backend/conn_manager.h"

#include <algorithm>
#include <cstring>

#include "base/log.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {

using proto::Message;
using proto::MsgType;
using proto::Reason;
using proto::WireError;

size_t ConnKeyHash::operator()(const ConnKey& k) const {
  // FNV-1a over the identifying bytes.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* p, size_t n) {
    auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  mix(&k.tenant, 4);
  mix(&k.scope, 4);
  for (const proto::Endpoint* e : {&k.local, &k.peer}) {
    mix(&e->family, 1);
    mix(e->addr.data(), e->addr.size());
    mix(&e->port, 2);
  }
  return static_cast<size_t>(h);
}

const char* ToString(ConnState s) {
  switch (s) {
    case ConnState::kPending: return "kernel";
    case ConnState::kUpgraded: return "accelerated";
    case ConnState::kClosed: return "closed";
  }
  return "?";
}

namespace {

bool IsLoopback(const proto::Endpoint& e) {
  if (e.family == proto::Family::kIpv4) return e.addr[0] == 127;
  static const uint8_t kV6Loop[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  return std::memcmp(e.addr.data(), kV6Loop, 16) == 0;
}

bool AddressAllowed(const vhost::PortConfig& port, const proto::Endpoint& e) {
  if (IsLoopback(e)) return true;  // a VM's own loopback is always its own
  for (const vhost::VmAddress& a : port.addresses)
    if (a.family == static_cast<uint8_t>(e.family) && a.addr == e.addr) return true;
  return false;
}

Message Ack(uint64_t request_id, uint64_t conn_id, WireError st, Reason reason, uint32_t window = 0) {
  return Message{MsgType::kRegisterAck, request_id, proto::RegisterAck{conn_id, st, reason, window}};
}

// Copies n bytes between two buffers with independent wrap points. A size
// of 0 means a linear buffer (no wrap; pos is a plain offset).
void RingCopy(uint8_t* dst, uint32_t dst_size, uint64_t dst_pos, const uint8_t* src,
              uint32_t src_size, uint64_t src_pos, uint64_t n) {
  auto offset = [](uint64_t pos, uint32_t size) { return size ? pos & (size - 1) : pos; };
  auto room = [](uint64_t off, uint32_t size) { return size ? size - off : UINT64_MAX; };
  while (n > 0) {
    uint64_t d = offset(dst_pos, dst_size), s = offset(src_pos, src_size);
    uint64_t chunk = std::min<uint64_t>({n, room(d, dst_size), room(s, src_size)});
    std::memcpy(dst + d, src + s, chunk);
    dst_pos += chunk;
    src_pos += chunk;
    n -= chunk;
  }
}

}  // namespace

ConnManager::DeviceConns* ConnManager::Find(vhost::BackendDevice& device) {
  auto it = devices_.find(&device);
  return it == devices_.end() ? nullptr : &it->second;
}

std::optional<Message> ConnManager::Handle(vhost::BackendDevice& device, const Message& msg) {
  DeviceConns* dc = Find(device);
  if (dc == nullptr) return std::nullopt;
  switch (msg.type) {
    case MsgType::kRegisterConn:
      return Register(*dc, msg.request_id, std::get<proto::RegisterConn>(msg.body));
    case MsgType::kUnregister:
      return Unregister(*dc, msg.request_id, std::get<proto::Unregister>(msg.body).conn_id);
    default:
      break;
  }
  // The rest name an existing connection and have no response.
  uint64_t conn_id = 0;
  if (auto* c = std::get_if<proto::ConnCounter>(&msg.body)) conn_id = c->conn_id;
  else if (auto* s = std::get_if<proto::Shutdown>(&msg.body)) conn_id = s->conn_id;
  else return Message{MsgType::kError, msg.request_id,
                      proto::Error{0, WireError::kBadMessage, Reason::kProtocolError}};
  auto it = dc->by_id.find(conn_id);
  if (it == dc->by_id.end()) {
    counters_.protocol_violations.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;  // a race with our own teardown, or a confused guest
  }
  BackendConn& c = *it->second;
  switch (msg.type) {
    case MsgType::kFence: {
      if (c.state != ConnState::kUpgraded || c.fence_received) return Violation(c, "unexpected FENCE"), std::nullopt;
      c.fence_received = true;
      c.fence_bytes = std::get<proto::ConnCounter>(msg.body).bytes;
      c.kernel_bytes_out.store(c.fence_bytes, std::memory_order_relaxed);
      if (c.peer) {
        c.peer->ev_peer_fence = c.fence_bytes;
        Raise(*c.peer, kEvFence);
      }
      MarkMovable(c);
      break;
    }
    case MsgType::kTxTail: {
      uint64_t tail = std::get<proto::ConnCounter>(msg.body).bytes;
      uint64_t credit = c.peer ? c.peer->rx_consumed : c.tx_copied;
      // The guest may fill its TX ring only up to what the peer has freed.
      if (c.state != ConnState::kUpgraded || !c.fence_received || c.write_shut ||
          tail < c.tx_tail || tail - credit > c.tx.size)
        return Violation(c, "TX tail outside the credit window"), std::nullopt;
      c.tx_tail = tail;
      MarkMovable(c);
      break;
    }
    case MsgType::kConsumed: {
      uint64_t consumed = std::get<proto::ConnCounter>(msg.body).bytes;
      if (c.state != ConnState::kUpgraded || consumed < c.rx_consumed || consumed > c.rx_tail)
        return Violation(c, "CONSUMED beyond what was delivered"), std::nullopt;
      c.rx_consumed = consumed;
      if (c.peer) {
        c.peer->ev_credit = consumed;
        Raise(*c.peer, kEvCredit);
        MarkMovable(*c.peer);  // room in our RX ring again
      }
      break;
    }
    case MsgType::kShutdown: {
      auto how = std::get<proto::Shutdown>(msg.body).how;
      if (how == proto::ShutdownHow::kBoth) {
        // Abortive close (the kernel would send RST): unsent bytes are
        // dropped and the peer's next call fails with ECONNRESET.
        c.write_shut = c.shut_announced = true;
        c.tx_tail = c.tx_copied;
        if (c.peer) {
          {
            std::lock_guard<std::mutex> lock(snapshot_mu_);
            c.peer->reason = Reason::kPeerDowngraded;
          }
          Raise(*c.peer, kEvDowngrade);
        }
      } else if (how == proto::ShutdownHow::kWrite) {
        c.write_shut = true;
        MaybeAnnounceShutdown(c);
      }
      break;
    }
    default:
      return Message{MsgType::kError, msg.request_id,
                     proto::Error{conn_id, WireError::kBadMessage, Reason::kProtocolError}};
  }
  return std::nullopt;
}

std::optional<Message> ConnManager::Register(DeviceConns& dc, uint64_t request_id,
                                             const proto::RegisterConn& r) {
  const vhost::PortConfig& port = *dc.device->port();
  if (!AddressAllowed(port, r.local)) {
    counters_.rejected_spoofed.fetch_add(1, std::memory_order_relaxed);
    VS_LOG(kWarn, "vm %s: registration for a foreign local address refused (anti-spoofing)",
           port.vm_name.c_str());
    return Ack(request_id, r.conn_id, WireError::kSpoofedAddress, Reason::kSpoofedAddress);
  }
  if (dc.by_id.count(r.conn_id) || dc.by_id.size() >= kMaxConnsPerDevice) {
    counters_.rejected_other.fetch_add(1, std::memory_order_relaxed);
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
  if (!ResolveRings(c)) {
    counters_.rejected_other.fetch_add(1, std::memory_order_relaxed);
    return Ack(request_id, r.conn_id, WireError::kBadRing, Reason::kProtocolError);
  }
  {
    std::lock_guard<std::mutex> lock(snapshot_mu_);
    c.handle = next_handle_++;
    if (!registry_.insert(c.key, c.handle)) {
      counters_.rejected_other.fetch_add(1, std::memory_order_relaxed);
      return Ack(request_id, r.conn_id, WireError::kInternal, Reason::kResourceLimit);
    }
    conns_.emplace(c.handle, std::move(owned));
  }
  dc.by_id[c.conn_id] = &c;
  counters_.registered.fetch_add(1, std::memory_order_relaxed);
  vm_totals_[c.vm_index % kMaxVms].registrations.fetch_add(1, std::memory_order_relaxed);
  counters_.active.fetch_add(1, std::memory_order_relaxed);

  Message ack = Ack(request_id, r.conn_id, WireError::kOk, Reason::kPending,
                    std::min(r.tx_ring_bytes, r.rx_ring_bytes));
  // Pair with the mirrored registration of the same tenant, if it is there.
  uint64_t peer_handle = 0;
  if (registry_.find(c.key.Mirror(), peer_handle)) {
    BackendConn* p = conns_.at(peer_handle).get();
    if (p->state == ConnState::kPending && p->peer == nullptr && !p->gone && p->role != c.role)
      Pair(c, *p);
  } else {
    // The same 4-tuple registered by another tenant: never paired, but say why.
    ConnKey tuple = c.key.Mirror();
    tuple.tenant = 0;
    uint32_t other_tenant = 0;
    if (by_tuple_.find(tuple, other_tenant) && other_tenant != c.key.tenant) {
      counters_.cross_tenant.fetch_add(1, std::memory_order_relaxed);
      ConnKey other = c.key.Mirror();
      other.tenant = other_tenant;
      uint64_t other_handle = 0;
      BackendConn* o = registry_.find(other, other_handle) ? conns_.at(other_handle).get() : nullptr;
      // Only a still-pending registration of the other tenant learns why;
      // one that is paired is none of this tenant's business.
      if (o && (o->state != ConnState::kPending || o->peer != nullptr)) o = nullptr;
      {
        std::lock_guard<std::mutex> lock(snapshot_mu_);
        c.reason = Reason::kCrossTenant;
        if (o) o->reason = Reason::kCrossTenant;
      }
      Raise(c, kEvDowngrade);
      if (o) Raise(*o, kEvDowngrade);
    }
    ConnKey mine = c.key;
    mine.tenant = 0;
    by_tuple_.insert_or_assign(mine, c.key.tenant);
  }
  return ack;
}

void ConnManager::Pair(BackendConn& a, BackendConn& b) {
  VS_LOG(kDebug, "pair conn %lu (dev %lu id %lu) <-> conn %lu (dev %lu id %lu)",
         static_cast<unsigned long>(a.handle), static_cast<unsigned long>(a.device->id()),
         static_cast<unsigned long>(a.conn_id), static_cast<unsigned long>(b.handle),
         static_cast<unsigned long>(b.device->id()), static_cast<unsigned long>(b.conn_id));
  {
    std::lock_guard<std::mutex> lock(snapshot_mu_);
    a.peer = &b;
    b.peer = &a;
    a.state = b.state = ConnState::kUpgraded;
    a.reason = b.reason = Reason::kNone;
  }
  counters_.upgrades.fetch_add(1, std::memory_order_relaxed);
  vm_totals_[a.vm_index % kMaxVms].upgrades.fetch_add(1, std::memory_order_relaxed);
  vm_totals_[b.vm_index % kMaxVms].upgrades.fetch_add(1, std::memory_order_relaxed);
  a.ev_peer_rx_window = b.rx.size;
  b.ev_peer_rx_window = a.rx.size;
  Raise(a, kEvUpgrade);
  Raise(b, kEvUpgrade);
  // A side that shut down its write direction before the pairing: its peer
  // must still learn that no accelerated byte will ever come.
  MaybeAnnounceShutdown(a);
  MaybeAnnounceShutdown(b);
}

bool ConnManager::ResolveRings(BackendConn& c) {
  const vhost::GuestMemory& mem = c.device->memory();
  c.tx.host = mem.Translate(c.tx.gpa, c.tx.size);
  c.rx.host = mem.Translate(c.rx.gpa, c.rx.size);
  return c.tx.host != nullptr && c.rx.host != nullptr;
}

std::optional<Message> ConnManager::Unregister(DeviceConns& dc, uint64_t request_id,
                                               uint64_t conn_id) {
  auto it = dc.by_id.find(conn_id);
  if (it == dc.by_id.end())
    return Ack(request_id, conn_id, WireError::kUnknownConnection, Reason::kNone);
  BackendConn* c = it->second;
  dc.by_id.erase(it);
  Orphan(*c);
  MaybeDestroy(c);
  // After this reply the guest may reuse the rings' memory.
  return Ack(request_id, conn_id, WireError::kOk, Reason::kNone);
}

void ConnManager::Orphan(BackendConn& c) {
  if (c.gone) return;
  // Bytes the application already wrote are delivered, as the kernel would
  // after close() or exit: keep the ones not yet moved.
  if (c.tx.host != nullptr && c.tx_tail > c.tx_copied) {
    uint64_t n = c.tx_tail - c.tx_copied;
    c.orphan.resize(n);
    RingCopy(c.orphan.data(), 0, 0, c.tx.host, c.tx.size, c.tx_copied, n);
    c.orphan_off = 0;
  } else {
    c.tx_tail = c.tx_copied;  // nothing recoverable (device paused or empty)
  }
  c.gone = true;
  c.write_shut = true;
  c.tx.host = c.rx.host = nullptr;
  c.pending_events = 0;
  registry_.erase(c.key);
  ConnKey tuple = c.key;
  tuple.tenant = 0;
  by_tuple_.erase_fn(tuple, [&](uint32_t t) { return t == c.key.tenant; });
  VS_LOG(kDebug, "conn %lu (guest id %lu) closed, %zu bytes orphaned, peer %lu",
         static_cast<unsigned long>(c.handle), static_cast<unsigned long>(c.conn_id), c.orphan.size(),
         static_cast<unsigned long>(c.peer ? c.peer->handle : 0));
  if (c.peer) {
    Raise(*c.peer, kEvPeerGone);
    MarkMovable(c);
    MaybeAnnounceShutdown(c);
  }
  counters_.active.fetch_sub(1, std::memory_order_relaxed);
}

void ConnManager::MaybeDestroy(BackendConn* c) {
  // A gone connection lives until its orphaned bytes reached the peer (or
  // the peer is gone too).
  if (!c->gone) return;
  if (c->peer && !c->peer->gone && c->orphan_off < c->orphan.size()) return;
  if (c->in_move_list) return;  // removed by MoveData's sweep
  if (c->peer) {
    // A peer that is gone too may have been waiting only on us.
    if (c->peer->gone) MarkMovable(*c->peer);
    c->peer->peer = nullptr;
  }
  if (c->in_event_list && c->device != nullptr) {
    if (DeviceConns* dc = Find(*c->device))
      dc->events.erase(std::remove(dc->events.begin(), dc->events.end(), c), dc->events.end());
  }
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  conns_.erase(c->handle);
}

void ConnManager::Violation(BackendConn& c, const char* what) {
  counters_.protocol_violations.fetch_add(1, std::memory_order_relaxed);
  VS_LOG(kWarn, "vm %s conn %lu: %s; connection is reset",
         c.device ? c.device->port()->vm_name.c_str() : "?", static_cast<unsigned long>(c.conn_id), what);
  {
    std::lock_guard<std::mutex> lock(snapshot_mu_);
    c.reason = Reason::kProtocolError;
  }
  Raise(c, kEvDowngrade);
}

void ConnManager::Raise(BackendConn& c, uint32_t bits) {
  if (c.gone || c.device == nullptr) return;
  c.pending_events |= bits;
  if (!c.in_event_list) {
    DeviceConns* dc = Find(*c.device);
    if (dc == nullptr) return;
    c.in_event_list = true;
    dc->events.push_back(&c);
  }
}

void ConnManager::MarkMovable(BackendConn& c) {
  if (c.in_move_list) return;
  c.in_move_list = true;
  movable_.push_back(&c);
}

void ConnManager::MaybeAnnounceShutdown(BackendConn& c) {
  // EOF reaches the peer only after every byte did.
  if (!c.write_shut || c.shut_announced || !c.peer) return;
  bool drained = c.gone ? c.orphan_off == c.orphan.size() : c.tx_copied == c.tx_tail;
  if (!drained) return;
  c.shut_announced = true;
  Raise(*c.peer, kEvPeerShutWr | kEvRxTail);
}

uint64_t ConnManager::Move(BackendConn& c) {
  BackendConn* p = c.peer;
  if (p == nullptr || p->gone || p->rx.host == nullptr || !c.fence_received) return 0;
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
  for (BackendConn* c : list) {
    c->in_move_list = false;
    moved |= Move(*c) > 0;
    MaybeDestroy(c);
  }
  return moved;
}

bool ConnManager::EmitEvents(vhost::BackendDevice& device) {
  DeviceConns* dc = Find(device);
  if (dc == nullptr || dc->events.empty() || device.broken()) return false;
  vhost::VirtqueueDevice& q = device.queue(1);
  bool wrote = false;
  while (!dc->events.empty()) {
    vhost::DescChain chain;
    vhost::PopResult r = q.Pop(&chain);
    if (r == vhost::PopResult::kBroken) {
      device.MarkBroken(std::string("event queue: ") + q.broken_reason());
      return wrote;
    }
    if (r == vhost::PopResult::kEmpty) {
      counters_.event_stalls.fetch_add(1, std::memory_order_relaxed);
      return wrote;  // the guest will kick when it posts buffers
    }
    // Pack as many events as fit into this buffer.
    std::array<uint8_t, 4096> buf;
    size_t cap = std::min<uint64_t>(chain.writable_bytes, buf.size());
    size_t used = 0;
    while (!dc->events.empty()) {
      BackendConn& c = *dc->events.front();
      std::array<Message, 7> out;
      size_t n = 0;
      uint32_t bits = c.pending_events;
      if (bits & kEvUpgrade)
        out[n++] = {MsgType::kUpgrade, 0, proto::Upgrade{c.conn_id, c.ev_peer_rx_window, 64}};
      if (bits & kEvFence)
        out[n++] = {MsgType::kFence, 0, proto::ConnCounter{c.conn_id, c.ev_peer_fence}};
      if (bits & kEvRxTail) out[n++] = {MsgType::kRxTail, 0, proto::ConnCounter{c.conn_id, c.rx_tail}};
      if (bits & kEvCredit)
        out[n++] = {MsgType::kCredit, 0, proto::ConnCounter{c.conn_id, c.ev_credit}};
      if (bits & kEvPeerShutWr)
        out[n++] = {MsgType::kShutdown, 0, proto::Shutdown{c.conn_id, proto::ShutdownHow::kWrite}};
      if (bits & kEvPeerGone)
        out[n++] = {MsgType::kShutdown, 0, proto::Shutdown{c.conn_id, proto::ShutdownHow::kRead}};
      if (bits & kEvDowngrade)
        out[n++] = {MsgType::kDowngrade, 0, proto::Downgrade{c.conn_id, c.reason, c.rx_consumed}};
      // All of one connection's events go in one buffer, in order.
      size_t need = 0;
      std::array<uint8_t, 7 * 40> tmp;
      bool fits = true;
      for (size_t i = 0; i < n; ++i) {
        auto len = proto::Encode(out[i], {tmp.data() + need, tmp.size() - need});
        if (!len.ok()) {
          fits = false;
          break;
        }
        need += *len;
      }
      if (!fits || used + need > cap) break;
      std::memcpy(buf.data() + used, tmp.data(), need);
      used += need;
      c.pending_events = 0;
      c.in_event_list = false;
      dc->events.pop_front();
      counters_.events.fetch_add(n, std::memory_order_relaxed);
    }
    if (used == 0 && !dc->events.empty() && cap < 7 * 40) {
      // A buffer too small for any event set is a guest bug: skip it.
      q.Push(chain.head, 0);
      continue;
    }
    chain.CopyIn({buf.data(), used});
    q.Push(chain.head, static_cast<uint32_t>(used));
    wrote = true;
  }
  return wrote;
}

bool ConnManager::HasEventsWaiting(vhost::BackendDevice& device) {
  DeviceConns* dc = Find(device);
  return dc != nullptr && !dc->events.empty();
}

void ConnManager::OnAttach(vhost::BackendDevice& device) {
  DeviceConns& dc = devices_[&device];
  dc.device = &device;
  // Memory may have moved while the device was paused: translate again.
  for (auto& [id, c] : dc.by_id) {
    if (!ResolveRings(*c)) {
      c->tx.host = c->rx.host = nullptr;
      Violation(*c, "rings no longer inside guest memory");
      continue;
    }
    MarkMovable(*c);
    if (c->peer) MarkMovable(*c->peer);
  }
}

void ConnManager::OnDetach(vhost::BackendDevice& device) {
  DeviceConns* dc = Find(device);
  if (dc == nullptr) return;
  if (!device.stopping()) {
    // Paused for reconfiguration: stop touching its memory, keep the state.
    for (auto& [id, c] : dc->by_id) c->tx.host = c->rx.host = nullptr;
    return;
  }
  // The guest process is gone: its connections close as if it exited.
  std::vector<BackendConn*> conns;
  for (auto& [id, c] : dc->by_id) conns.push_back(c);
  for (BackendConn* c : dc->events) c->in_event_list = false;
  devices_.erase(&device);
  for (BackendConn* c : conns) {
    c->device = nullptr;
    Orphan(*c);
    MaybeDestroy(c);
  }
}

std::vector<ConnSnapshot> ConnManager::Snapshot() const {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  std::vector<ConnSnapshot> out;
  for (const auto& [h, c] : conns_) {
    if (c->gone) continue;
    // Counters below are the worker's; read racily here, for display only.
    uint64_t peer_consumed = c->peer ? c->peer->rx_consumed : c->tx_tail;
    out.push_back({c->handle, c->device ? c->device->id() : 0,
                   c->device ? c->device->port()->vm_name : "", c->key.tenant, c->key.local,
                   c->key.peer, c->state, c->reason, c->accel_bytes_out.load(),
                   c->accel_bytes_in.load(), c->kernel_bytes_out.load(), c->rx_tail - c->rx_consumed,
                   c->tx_tail - std::min(c->tx_tail, peer_consumed), c->peer ? c->peer->rx.size : 0});
  }
  return out;
}

}  // namespace vsocket::backend
