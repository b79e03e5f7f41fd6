#include "host-backend/conn_manager.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "base/clock.h"
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
  // The block may hold counts the guest published before posting this
  // message (a send() right before shutdown()): take them first.
  if (c.doorbell && ReadDoorbell(c) < 0) return std::nullopt;
  switch (msg.type) {
    case MsgType::kPairingQuery: {
      bool pairing = c.state == ConnState::kUpgraded || c.remote.stage == RemotePeer::Stage::kAccepted;
      return Ack(msg.request_id, conn_id, WireError::kOk, pairing ? Reason::kNone : c.reason);
    }
    case MsgType::kFence: {
      if (c.state != ConnState::kUpgraded || c.fence_received) return Violation(c, "unexpected FENCE"), std::nullopt;
      c.fence_received = true;
      c.fence_bytes = std::get<proto::ConnCounter>(msg.body).bytes;
      c.kernel_bytes_out.store(c.fence_bytes, std::memory_order_relaxed);
      if (c.peer) {
        c.peer->ev_peer_fence = c.fence_bytes;
        Raise(*c.peer, kEvFence);
      }
      if (c.remote.paired()) Owe(c, kOweFence);
      MarkMovable(c);
      break;
    }
    case MsgType::kTxTail: {
      if (c.doorbell) {
        // The count was read from the block above; the message says the
        // guest saw want_tx: poll the block again.
        if (c.state != ConnState::kUpgraded || !c.fence_received)
          return Violation(c, "TX_TAIL before FENCE"), std::nullopt;
        counters_.doorbell_messages.fetch_add(1, std::memory_order_relaxed);
        AddDoorbell(*dc, c);
        break;
      }
      if (!ApplyTxTail(c, std::get<proto::ConnCounter>(msg.body).bytes)) return std::nullopt;
      break;
    }
    case MsgType::kConsumed: {
      if (c.doorbell) {
        if (c.state != ConnState::kUpgraded) return Violation(c, "CONSUMED before the upgrade"), std::nullopt;
        counters_.doorbell_messages.fetch_add(1, std::memory_order_relaxed);
        AddDoorbell(*dc, c);
        break;
      }
      if (!ApplyConsumed(c, std::get<proto::ConnCounter>(msg.body).bytes)) return std::nullopt;
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
        if (c.remote.paired()) Owe(c, kOweAbort);
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
  c.doorbell = dc.doorbell;
  c.ring_hold = dc.ring_hold;
  // A doorbell block must be 64-byte aligned (its counts are atomics).
  if ((c.doorbell && r.tx_ring_gpa % proto::kDoorbellBytes != 0) || !ResolveRings(c) ||
      (c.doorbell && reinterpret_cast<uintptr_t>(c.tx.host) % proto::kDoorbellBytes != 0)) {
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
  VS_LOG(kDebug, "conn %lu registered: %s, port %u -> %u", static_cast<unsigned long>(c.handle),
         c.role == proto::Role::kClient ? "client" : "server", c.key.local.port, c.key.peer.port);
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
    // Not on this host: a peer host may run the other end.
    if (c.reason == Reason::kPending && c.key.scope == 0) {
      auto pr = pending_remote_.find(c.key);
      if (pr != pending_remote_.end()) {
        PendingRemote r = pr->second;
        pending_remote_.erase(pr);
        if (r.expires_ms >= MonotonicMs()) AcceptRemote(c, r);
      } else if (c.role == proto::Role::kClient && hosts_ != nullptr &&
                 LocalPortFor(c.key.tenant, c.key.peer) == nullptr) {
        if (uint32_t host = hosts_->Locate(c.key.tenant, c.key.peer)) RequestRemotePair(c, host);
      }
    }
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

bool ConnManager::ApplyTxTail(BackendConn& c, uint64_t tail) {
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
  return true;
}

proto::DoorbellBlock* ConnManager::DoorbellOf(BackendConn& c) {
  if (!c.doorbell || c.tx.host == nullptr) return nullptr;
  return reinterpret_cast<proto::DoorbellBlock*>(c.tx.host + c.tx.size);
}

void ConnManager::AddDoorbell(DeviceConns& dc, BackendConn& c) {
  c.doorbell_idle = 0;
  if (c.in_doorbell_set) return;
  c.in_doorbell_set = true;
  dc.doorbells.push_back(&c);
}

void ConnManager::RemoveDoorbell(BackendConn& c) {
  if (!c.in_doorbell_set) return;
  c.in_doorbell_set = false;
  if (DeviceConns* dc = c.device ? Find(*c.device) : nullptr) std::erase(dc->doorbells, &c);
}

// The block is guest memory: every count is checked like a message's, and
// one that goes backwards is ignored (counts only grow; a message may
// carry an older one than the block already showed).
int ConnManager::ReadDoorbell(BackendConn& c) {
  proto::DoorbellBlock* db = DoorbellOf(c);
  if (db == nullptr || c.state != ConnState::kUpgraded) return 0;
  int progress = 0;
  // Before the FENCE is in, tails wait (the guest's TX_TAIL follows it);
  // after a shutdown of the write side nothing more is taken.
  if (c.fence_received && !c.write_shut) {
    uint64_t tail = std::atomic_ref<uint64_t>(db->tx_tail).load(std::memory_order_acquire);
    if (tail > c.tx_tail) {
      if (!ApplyTxTail(c, tail)) return -1;
      progress = 1;
      counters_.doorbell_counts.fetch_add(1, std::memory_order_relaxed);
    }
  }
  uint64_t consumed = std::atomic_ref<uint64_t>(db->consumed).load(std::memory_order_acquire);
  if (consumed > c.rx_consumed) {
    if (!ApplyConsumed(c, consumed)) return -1;
    progress = 1;
    counters_.doorbell_counts.fetch_add(1, std::memory_order_relaxed);
  }
  return progress;
}

namespace {
// Passes a polled block may go without news before it is armed (the
// worker passes every few microseconds while busy).
constexpr uint32_t kDoorbellIdlePasses = 64;

// Asks the guest for messages again, then takes one last look: a count the
// guest published before it could see the flags is found here (both sides
// fence between their store and their load).
void ArmBlock(proto::DoorbellBlock* db) {
  std::atomic_ref<uint32_t>(db->want_tx).store(1, std::memory_order_relaxed);
  std::atomic_ref<uint32_t>(db->want_consumed).store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}
}  // namespace

// Arms c's block and takes one last look: > 0 if a count moved meanwhile
// (the block stays polled), else 0 (or -1: reset) and it may leave the set.
int ConnManager::ArmDoorbell(BackendConn& c) {
  proto::DoorbellBlock* db = DoorbellOf(c);
  if (db == nullptr) return 0;
  ArmBlock(db);
  counters_.doorbell_arms.fetch_add(1, std::memory_order_relaxed);
  c.doorbell_idle = 0;
  return ReadDoorbell(c);
}

// Takes dc.doorbells[i] out of the polled set (the last one takes its place).
void ConnManager::DropDoorbellAt(DeviceConns& dc, size_t i) {
  dc.doorbells[i]->in_doorbell_set = false;
  dc.doorbells[i] = dc.doorbells.back();
  dc.doorbells.pop_back();
}

bool ConnManager::PollDoorbells(vhost::BackendDevice& device) {
  DeviceConns* dc = Find(device);
  if (dc == nullptr || dc->doorbells.empty()) return false;
  bool worked = false;
  for (size_t i = 0; i < dc->doorbells.size();) {
    BackendConn& c = *dc->doorbells[i];
    int r = ReadDoorbell(c);
    if (r > 0) {
      c.doorbell_idle = 0;
    } else if (r == 0 && DoorbellOf(c) != nullptr) {
      if (++c.doorbell_idle < kDoorbellIdlePasses) {
        ++i;
        continue;
      }
      r = ArmDoorbell(c);
    }
    worked |= r > 0;
    if (r > 0) ++i;
    else DropDoorbellAt(*dc, i);
  }
  return worked;
}

bool ConnManager::ArmDoorbells() {
  bool moved = false;
  for (auto& [dev, dc] : devices_) {
    for (size_t i = 0; i < dc.doorbells.size();) {
      if (ArmDoorbell(*dc.doorbells[i]) > 0) {
        moved = true;
        ++i;
      } else {
        DropDoorbellAt(dc, i);
      }
    }
  }
  return moved;
}

uint64_t ConnManager::OnHello(vhost::BackendDevice& device, uint64_t features) {
  DeviceConns* dc = Find(device);
  if (dc == nullptr) return 0;
  // A second HELLO while connections live changes nothing: the session
  // keeps what it was given (its library allocates rings by it).
  if (!dc->by_id.empty())
    return (dc->doorbell ? proto::kFeatureDoorbell : 0) | (dc->ring_hold ? proto::kFeatureRingHold : 0);
  uint64_t taken = features & proto::kKnownFeatures;
  dc->doorbell = (taken & proto::kFeatureDoorbell) != 0;
  dc->ring_hold = (taken & proto::kFeatureRingHold) != 0;
  if (dc->doorbell) counters_.doorbell_sessions.fetch_add(1, std::memory_order_relaxed);
  return taken;
}

bool ConnManager::ResolveRings(BackendConn& c) {
  const vhost::GuestMemory& mem = c.device->memory();
  // With a doorbell, its block follows the TX ring.
  c.tx.host = mem.Translate(c.tx.gpa, c.tx.size + (c.doorbell ? proto::kDoorbellBytes : 0));
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

void ConnManager::Orphan(BackendConn& c) {
  if (c.gone) return;
  // Counts published without a message (doorbell) are the guest's last word too.
  if (c.doorbell) (void)ReadDoorbell(c);
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
  WithdrawTx(c);  // the rest goes from the copy; frames in flight still read the ring
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
  switch (c.remote.stage) {
    case RemotePeer::Stage::kPaired:
      RetireRx(c);  // the guest may reuse the ring's memory after Unregister
      Owe(c, kOweGone);
      MarkMovable(c);
      MaybeAnnounceShutdown(c);
      break;
    case RemotePeer::Stage::kRequested:
    case RemotePeer::Stage::kAccepted: {
      // Withdraw: the peer backend forgets the request (or the acceptance).
      proto::FrameHeader h;
      h.type = proto::FrameType::kPairCancel;
      h.tenant = c.key.tenant;
      if (c.remote.stage == RemotePeer::Stage::kAccepted) h.handle = c.remote.handle;
      h.value = c.handle;
      if (hosts_) hosts_->SendPairing(c.remote.host, h, {});
      // A requester never sent a frame: its peer cannot write yet. An
      // acceptor's peer may: its registration lives until the conn is gone.
      if (c.remote.stage == RemotePeer::Stage::kRequested) DropRx(c);
      c.remote.stage = RemotePeer::Stage::kNone;
      break;
    }
    default:
      break;
  }
  counters_.active.fetch_sub(1, std::memory_order_relaxed);
}

void ConnManager::MaybeDestroy(BackendConn* c) {
  // A gone connection lives until its orphaned bytes reached the peer (or
  // the peer is gone too).
  if (!c->gone) return;
  if (c->peer && !c->peer->gone && c->orphan_off < c->orphan.size()) return;
  if (c->in_move_list || c->in_owed_list || c->in_reap_list) return;  // removed by the sweeps
  if (c->txh && c->txh->Busy()) {
    AddReap(*c);  // sends in flight still read its TX ring: back when they completed
    return;
  }
  if (c->remote.paired()) {
    if (!c->remote.gone && c->orphan_off < c->orphan.size()) return;
    if (!c->shut_announced && !c->remote.gone) return;
    // The peer may still be writing into a withdrawn registration of our RX
    // ring: its PLACEMENT_ACK says it no longer does (a link loss detaches).
    if (!c->rx_mr_retired.empty()) return;
    Owe(*c, kOweRelease);  // the peer backend forgets it too; we follow once sent
    return;
  }
  if (c->peer) {
    // A peer that is gone too may have been waiting only on us.
    if (c->peer->gone) MarkMovable(*c->peer);
    c->peer->peer = nullptr;
  }
  if (c->in_event_list && c->device != nullptr) {
    if (DeviceConns* dc = Find(*c->device))
      dc->events.erase(std::remove(dc->events.begin(), dc->events.end(), c), dc->events.end());
  }
  RemoveDoorbell(*c);
  DropRx(*c);
  WithdrawTx(*c);  // nothing in flight reads it (Busy above): dropped at once
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
  if (!c.write_shut || c.shut_announced || (!c.peer && !c.remote.paired())) return;
  bool drained = c.gone ? c.orphan_off == c.orphan.size() : c.tx_copied == c.tx_tail;
  if (!drained && !(c.remote.paired() && c.remote.gone)) return;
  c.shut_announced = true;
  if (c.peer) Raise(*c.peer, kEvPeerShutWr | kEvRxTail);
  else Owe(c, kOweShutWr);
}

uint64_t ConnManager::Move(BackendConn& c) {
  if (c.remote.paired()) return MoveRemote(c);
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

bool ConnManager::EmitEvents(vhost::BackendDevice& device) {
  DeviceConns* dc = Find(device);
  if (dc == nullptr || (dc->events.empty() && dc->released.empty()) || device.broken()) return false;
  vhost::VirtqueueDevice& q = device.queue(1);
  bool wrote = false;
  while (!dc->events.empty() || !dc->released.empty()) {
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
    // Rings of closed connections first (no ordering with any other event).
    while (!dc->released.empty()) {
      Message m{MsgType::kRingsReleased, 0, proto::ConnCounter{dc->released.front(), 0}};
      auto len = proto::Encode(m, {buf.data() + used, cap - used});
      if (!len.ok()) break;
      used += *len;
      dc->released.pop_front();
      counters_.events.fetch_add(1, std::memory_order_relaxed);
    }
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
        out[n++] = {MsgType::kDowngrade, 0,
                    proto::Downgrade{c.conn_id, c.reason, c.rx_tail,
                                     c.remote.fence_acked ? proto::kDowngradeFenceAcked : uint8_t{0}}};
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
      if ((bits & kEvFence) && c.fence_ack_pending) {
        // Goes out on the link after this buffer is published (next pass).
        c.fence_ack_pending = false;
        if (c.remote.paired()) Owe(c, kOweFenceAck);
      }
      c.pending_events = 0;
      c.in_event_list = false;
      dc->events.pop_front();
      counters_.events.fetch_add(n, std::memory_order_relaxed);
    }
    if (used == 0 && (!dc->events.empty() || !dc->released.empty()) && cap < 7 * 40) {
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
  return dc != nullptr && (!dc->events.empty() || !dc->released.empty());
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
    if (!c->rx_stash.empty()) {
      // Arrived from the fabric while the device was paused.
      uint64_t at = c->rx_tail - c->rx_stash.size();
      RingCopy(c->rx.host, c->rx.size, at, c->rx_stash.data(), 0, 0, c->rx_stash.size());
      c->rx_stash.clear();
      c->rx_stash.shrink_to_fit();
      Raise(*c, kEvRxTail);
    } else if (c->remote.paired()) {
      Raise(*c, kEvRxTail);  // bytes placed one-sided while paused are in the ring already
    }
    if (c->remote.paired() && !c->remote.gone && c->rx_mr == nullptr) {
      uint64_t addr;
      uint32_t rkey;
      RegisterRx(*c, &addr, &rkey);
      if (addr != 0) Owe(*c, kOwePlacement);
    }
    if (c->remote.paired() && !c->remote.gone) QueueTx(*c);
    MarkMovable(*c);
    if (c->peer) MarkMovable(*c->peer);
    // Counts published while paused: look (and arm) again.
    if (c->doorbell) AddDoorbell(dc, *c);
  }
}

void ConnManager::OnDetach(vhost::BackendDevice& device) {
  DeviceConns* dc = Find(device);
  if (dc == nullptr) return;
  if (!device.stopping()) {
    // Paused for reconfiguration: stop touching its memory, keep the state.
    // Peer hosts stop writing into it: their rkeys are withdrawn.
    // Sends stop reading its TX rings (withdrawn from use at once, dropped
    // when the frames in flight completed).
    for (auto& [id, c] : dc->by_id) {
      c->tx.host = c->rx.host = nullptr;
      RetireRx(*c);
      WithdrawTx(*c);
    }
    return;
  }
  // The guest process is gone: its connections close as if it exited.
  std::vector<BackendConn*> conns;
  for (auto& [id, c] : dc->by_id) conns.push_back(c);
  for (BackendConn* c : dc->events) c->in_event_list = false;
  for (BackendConn* c : dc->doorbells) c->in_doorbell_set = false;
  devices_.erase(&device);
  for (BackendConn* c : conns) {
    c->device = nullptr;
    Orphan(*c);
    MaybeDestroy(c);
  }
  // Closed earlier, rings still held: nobody to tell any more.
  for (auto& [h, c] : conns_)
    if (c->device == &device) c->device = nullptr;
}

std::vector<ConnSnapshot> ConnManager::Snapshot() const {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  std::vector<ConnSnapshot> out;
  for (const auto& [h, c] : conns_) {
    if (c->gone) continue;
    // Counters below are the worker's; read racily here, for display only.
    uint64_t peer_consumed = c->peer ? c->peer->rx_consumed : c->remote.paired() ? c->remote.credit : c->tx_tail;
    out.push_back({c->handle, c->device ? c->device->id() : 0,
                   c->device ? c->device->port()->vm_name : "", c->key.tenant, c->key.local,
                   c->key.peer, c->state, c->reason, c->accel_bytes_out.load(),
                   c->accel_bytes_in.load(), c->kernel_bytes_out.load(), c->rx_tail - c->rx_consumed,
                   c->tx_tail - std::min(c->tx_tail, peer_consumed),
                   c->peer ? c->peer->rx.size : c->remote.paired() ? c->remote.window : 0,
                   c->remote.paired() ? c->remote.host : 0});
  }
  return out;
}

}  // namespace vsocket::backend

// ---- cross-host ---------------------------------------------------------------

namespace vsocket::backend {

using proto::FrameHeader;
using proto::FrameType;

namespace {

constexpr size_t kMaxPendingRemote = 65536;
constexpr int64_t kPendingRemoteMs = 30000;

FrameHeader Frame(FrameType t, uint32_t tenant, uint64_t handle, uint64_t value, uint32_t aux = 0) {
  FrameHeader h;
  h.type = t;
  h.tenant = tenant;
  h.handle = handle;
  h.value = value;
  h.aux = aux;
  return h;
}

// The connection as this side sees it, for PAIR_REQUEST and PAIR_ACCEPT.
std::array<uint8_t, proto::kPairInfoSize> PairPayload(const BackendConn& c, uint64_t rx_addr, uint32_t rx_rkey) {
  proto::PairInfo info;
  info.local = c.key.local;
  info.peer = c.key.peer;
  info.role = c.role;
  info.rx_addr = rx_addr;
  info.rx_rkey = rx_rkey;
  std::array<uint8_t, proto::kPairInfoSize> payload;
  proto::EncodePairInfo(info, payload.data());
  return payload;
}

}  // namespace

// Routes one link's frames into the manager, remembering between a DATA
// header and its arrival whether the payload was accepted (so each link of
// a host pair has its own: their frames interleave).
class ConnManager::Sink : public fabric::FrameSink {
 public:
  Sink(ConnManager* m, uint32_t host) : m_(m), host_(host) {}
  fabric::PayloadDest OnHeader(const FrameHeader& h) override {
    fabric::PayloadDest d = m_->OnLinkData(host_, h);
    data_ok_ = d.n > 0;
    header_seen_ = true;
    return d;
  }
  // A new link starts with no frame half-received.
  void Reset() { data_ok_ = header_seen_ = false; }
  uint32_t host() const { return host_; }
  void OnFrame(const FrameHeader& h, std::span<const uint8_t>) override {
    bool via_header = header_seen_;
    header_seen_ = false;
    if (h.type == FrameType::kData) {
      // No OnHeader: the rdma link wrote the payload one-sided into our RX
      // ring (its rkey was ours to give); still checked like any DATA.
      if (!via_header) return m_->OnPlacedData(host_, h);
      if (!data_ok_) return;
    }
    m_->OnLinkFrame(host_, h);
  }

 private:
  ConnManager* m_;
  uint32_t host_;
  bool data_ok_ = false;
  bool header_seen_ = false;  // OnHeader was called for the frame now arriving
};

ConnManager::ConnManager() = default;
ConnManager::~ConnManager() = default;

fabric::FrameSink& ConnManager::LinkSink(uint32_t host, uint32_t link) {
  auto& s = sinks_[(uint64_t{host} << 32) | link];
  if (!s) s = std::make_unique<Sink>(this, host);
  return *s;
}

const vhost::PortConfig* ConnManager::LocalPortFor(uint32_t tenant, const proto::Endpoint& addr) const {
  if (ports_ == nullptr) return nullptr;
  for (const vhost::PortConfig& p : *ports_)
    if (p.tenant_id == tenant && !IsLoopback(addr) && AddressAllowed(p, addr)) return &p;
  return nullptr;
}

void ConnManager::RequestRemotePair(BackendConn& c, uint32_t host) {
  uint64_t rx_addr;
  uint32_t rx_rkey;
  RegisterRx(c, &rx_addr, &rx_rkey);
  std::array<uint8_t, proto::kPairInfoSize> payload = PairPayload(c, rx_addr, rx_rkey);
  FrameHeader h = Frame(FrameType::kPairRequest, c.key.tenant, 0, c.handle, c.rx.size);
  h.len = proto::kPairInfoSize;
  if (!hosts_->SendPairing(host, h, payload)) {
    DropRx(c);
    return;  // stays on kernel TCP
  }
  c.remote.stage = RemotePeer::Stage::kRequested;
  c.remote.host = host;
  counters_.pair_requests_sent.fetch_add(1, std::memory_order_relaxed);
  VS_LOG(kDebug, "conn %lu (port %u -> %u): PAIR_REQUEST to host %u", static_cast<unsigned long>(c.handle),
         c.key.local.port, c.key.peer.port, host);
}

void ConnManager::AcceptRemote(BackendConn& c, const PendingRemote& r) {
  if (!hosts_) return;
  uint64_t rx_addr;
  uint32_t rx_rkey;
  RegisterRx(c, &rx_addr, &rx_rkey);
  std::array<uint8_t, proto::kPairInfoSize> payload = PairPayload(c, rx_addr, rx_rkey);
  FrameHeader h = Frame(FrameType::kPairAccept, c.key.tenant, r.handle, c.handle, c.rx.size);
  h.len = proto::kPairInfoSize;
  if (!hosts_->SendPairing(r.host, h, payload)) {
    DropRx(c);
    return;
  }
  // Our guest upgrades when the peer's first frame (its FENCE) arrives on
  // the link: then the peer surely knows our handle.
  c.remote = RemotePeer{};
  c.remote.stage = RemotePeer::Stage::kAccepted;
  c.remote.host = r.host;
  c.remote.handle = r.handle;
  c.remote.window = r.window;
  c.remote.rdma_addr = r.rdma_addr;
  c.remote.rdma_rkey = r.rdma_rkey;
  VS_LOG(kDebug, "conn %lu (port %u -> %u): PAIR_ACCEPT to host %u for its conn %lu",
         static_cast<unsigned long>(c.handle), c.key.local.port, c.key.peer.port, r.host,
         static_cast<unsigned long>(r.handle));
}

void ConnManager::UpgradeRemote(BackendConn& c) {
  {
    std::lock_guard<std::mutex> lock(snapshot_mu_);
    c.remote.stage = RemotePeer::Stage::kPaired;
    c.state = ConnState::kUpgraded;
    c.reason = Reason::kNone;
  }
  VS_LOG(kDebug, "conn %lu paired with host %u conn %lu", static_cast<unsigned long>(c.handle), c.remote.host,
         static_cast<unsigned long>(c.remote.handle));
  counters_.upgrades.fetch_add(1, std::memory_order_relaxed);
  counters_.remote_upgrades.fetch_add(1, std::memory_order_relaxed);
  vm_totals_[c.vm_index % kMaxVms].upgrades.fetch_add(1, std::memory_order_relaxed);
  c.ev_peer_rx_window = c.remote.window;
  Raise(c, kEvUpgrade);
  QueueTx(c);
  MaybeAnnounceShutdown(c);
}

void ConnManager::OnPairingFrame(uint32_t host, const FrameHeader& h, std::span<const uint8_t> payload) {
  auto conn = [&](uint64_t handle) -> BackendConn* {
    auto it = conns_.find(handle);
    return it == conns_.end() ? nullptr : it->second.get();
  };
  switch (h.type) {
    case FrameType::kPairRequest: {
      counters_.pair_requests_received.fetch_add(1, std::memory_order_relaxed);
      auto info = proto::DecodePairInfo(payload);
      auto refuse = [&](Reason why, const char* what) {
        counters_.pair_refused.fetch_add(1, std::memory_order_relaxed);
        VS_LOG(kWarn, "peer host %u: pairing request refused: %s", host, what);
        hosts_->SendPairing(host, Frame(FrameType::kPairReject, h.tenant, h.value, 0, static_cast<uint32_t>(why)), {});
      };
      if (!info.ok()) return refuse(Reason::kProtocolError, info.status().message().c_str());
      // The requester may only speak for addresses it runs, and only about
      // our VMs of the same tenant.
      if (!hosts_->Runs(host, h.tenant, info->local))
        return refuse(Reason::kCrossTenant, "requester does not run that tenant address");
      if (LocalPortFor(h.tenant, info->peer) == nullptr)
        return refuse(Reason::kCrossTenant, "no VM of that tenant has that address here");
      ConnKey key{h.tenant, 0, info->peer, info->local};
      PendingRemote r{host, h.value, h.aux, info->rx_addr, info->rx_rkey, MonotonicMs() + kPendingRemoteMs};
      uint64_t mine = 0;
      if (registry_.find(key, mine)) {
        BackendConn* c = conn(mine);
        if (c && c->state == ConnState::kPending && c->peer == nullptr && !c->gone &&
            c->remote.stage == RemotePeer::Stage::kNone && c->role != info->role && c->reason == Reason::kPending) {
          AcceptRemote(*c, r);
          return;
        }
        // A connection that went back to kernel TCP after a link loss
        // (RESYNC) stays registered until its library registers it again
        // to re-upgrade: the request waits for that, like one that comes
        // before the registration.
        bool resynced = c && c->state == ConnState::kUpgraded && c->remote.stage == RemotePeer::Stage::kDetached;
        if (!resynced) return refuse(Reason::kPeerNotAccelerated, "connection is not available for pairing");
      }
      // Our guest has not registered yet: keep the request for a while.
      VS_LOG(kDebug, "host %u conn %lu (port %u -> %u): PAIR_REQUEST kept until our guest registers", host,
             static_cast<unsigned long>(h.value), info->local.port, info->peer.port);
      if (pending_remote_.size() >= kMaxPendingRemote) {
        int64_t now = MonotonicMs();
        std::erase_if(pending_remote_, [now](const auto& kv) { return kv.second.expires_ms < now; });
        if (pending_remote_.size() >= kMaxPendingRemote)
          return refuse(Reason::kResourceLimit, "too many pending pairing requests");
      }
      pending_remote_[key] = r;
      return;
    }
    case FrameType::kPairAccept: {
      BackendConn* c = conn(h.handle);
      if (c == nullptr || c->gone || c->remote.stage != RemotePeer::Stage::kRequested || c->remote.host != host ||
          c->key.tenant != h.tenant || h.value == 0) {
        // We withdrew meanwhile (or never asked): tell the acceptor.
        VS_LOG(kDebug, "PAIR_ACCEPT from host %u for conn %lu not wanted (stage %d): PAIR_CANCEL", host,
               static_cast<unsigned long>(h.handle), c ? static_cast<int>(c->remote.stage) : -1);
        hosts_->SendPairing(host, Frame(FrameType::kPairCancel, h.tenant, h.value, h.handle), {});
        return;
      }
      auto info = proto::DecodePairInfo(payload);
      c->remote.handle = h.value;
      c->remote.window = h.aux;
      if (info.ok()) {
        c->remote.rdma_addr = info->rx_addr;
        c->remote.rdma_rkey = info->rx_rkey;
      }
      UpgradeRemote(*c);
      // Completes the handshake on the link, ahead of any data: the
      // acceptor's guest upgrades at once, whether or not ours ever sends.
      Owe(*c, kOweConfirm);
      return;
    }
    case FrameType::kPairReject: {
      BackendConn* c = conn(h.handle);
      if (c == nullptr || c->remote.stage != RemotePeer::Stage::kRequested || c->remote.host != host) return;
      c->remote.stage = RemotePeer::Stage::kNone;
      DropRx(*c);
      {
        std::lock_guard<std::mutex> lock(snapshot_mu_);
        c->reason = static_cast<Reason>(h.aux);
      }
      Raise(*c, kEvDowngrade);  // not upgraded: the guest just stays on kernel TCP
      return;
    }
    case FrameType::kPairCancel: {
      if (h.handle != 0) {
        BackendConn* c = conn(h.handle);
        if (c == nullptr || c->remote.host != host || c->remote.handle != h.value) return;
        if (c->remote.stage == RemotePeer::Stage::kAccepted) {
          c->remote.stage = RemotePeer::Stage::kNone;
          {
            std::lock_guard<std::mutex> lock(snapshot_mu_);
            c->reason = Reason::kPeerNotAccelerated;
          }
          Raise(*c, kEvDowngrade);  // a guest waiting on kernel EOF learns it is final
        } else if (c->remote.paired()) {
          DetachRemote(*c, Reason::kPeerNotAccelerated);
        }
        return;
      }
      // The requester withdrew before we answered (or before we accepted).
      std::erase_if(pending_remote_, [&](const auto& kv) { return kv.second.host == host && kv.second.handle == h.value; });
      for (auto& [hd, c] : conns_)
        if (c->remote.stage == RemotePeer::Stage::kAccepted && c->remote.host == host && c->remote.handle == h.value) {
          c->remote.stage = RemotePeer::Stage::kNone;
          Raise(*c, kEvDowngrade);
        }
      return;
    }
    default:
      counters_.frames_dropped.fetch_add(1, std::memory_order_relaxed);
      return;
  }
}

BackendConn* ConnManager::FrameTarget(uint32_t host, const FrameHeader& h) {
  auto it = conns_.find(h.handle);
  BackendConn* c = it == conns_.end() ? nullptr : it->second.get();
  if (c != nullptr && c->key.tenant != h.tenant) {
    // Never act on another tenant's connection, whatever the peer says.
    counters_.frames_cross_tenant.fetch_add(1, std::memory_order_relaxed);
    counters_.frames_dropped.fetch_add(1, std::memory_order_relaxed);
    VS_LOG(kWarn, "peer host %u: %s frame for tenant %u names a connection of tenant %u: dropped", host,
           proto::ToString(h.type), h.tenant, c->key.tenant);
    return nullptr;
  }
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
    counters_.fabric_violations.fetch_add(1, std::memory_order_relaxed);
    VS_LOG(kWarn, "peer host %u: DATA for conn %lu at %lu+%u, expected %lu with %lu free: connection reset", host,
           static_cast<unsigned long>(c->handle), static_cast<unsigned long>(h.value), h.len,
           static_cast<unsigned long>(c->rx_tail), static_cast<unsigned long>(space));
    Violation(*c, "peer host sent data outside the credit window");
    Owe(*c, kOweAbort);
    return d;
  }
  if (c->rx.host == nullptr) {
    // Device paused for reconfiguration: hold the bytes until it is back.
    size_t at = c->rx_stash.size();
    c->rx_stash.resize(at + h.len);
    d.iov[0] = {c->rx_stash.data() + at, h.len};
    d.n = 1;
    return d;
  }
  uint64_t off = c->rx_tail & (c->rx.size - 1);
  uint64_t first = std::min<uint64_t>(h.len, c->rx.size - off);
  d.iov[0] = {c->rx.host + off, first};
  d.n = 1;
  if (first < h.len) {
    d.iov[1] = {c->rx.host, h.len - first};
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
  bool registered = c->rx_mr != nullptr || !c->rx_mr_retired.empty();
  if (!c->remote.paired() || !registered || h.value != c->rx_tail || h.len > space) {
    counters_.fabric_violations.fetch_add(1, std::memory_order_relaxed);
    VS_LOG(kWarn, "peer host %u: placed DATA for conn %lu at %lu+%u, expected %lu with %lu free%s: connection reset",
           host, static_cast<unsigned long>(c->handle), static_cast<unsigned long>(h.value), h.len,
           static_cast<unsigned long>(c->rx_tail), static_cast<unsigned long>(space),
           registered ? "" : " (no registration)");
    Violation(*c, "peer host placed data outside the credit window");
    Owe(*c, kOweAbort);
    return;
  }
  counters_.fabric_bytes_placed.fetch_add(h.len, std::memory_order_relaxed);
  OnLinkFrame(host, h);
}

void ConnManager::RegisterRx(BackendConn& c, uint64_t* addr, uint32_t* rkey) {
  *addr = 0;
  *rkey = 0;
  // A library that would reuse the ring right after UNREGISTER's answer
  // (no kFeatureRingHold) could have a late one-sided write land in
  // whatever it puts there next: its bytes are staged instead.
  if (hosts_ == nullptr || c.rx.host == nullptr || c.gone || !c.ring_hold) return;
  if (c.rx_mr == nullptr) {
    uint32_t k = 0;
    int64_t t0 = MonotonicNs();
    Status st = hosts_->RegisterRemoteWritable(c.rx.host, c.rx.size, &k);
    counters_.rdma_reg_us.fetch_add((MonotonicNs() - t0) / 1000, std::memory_order_relaxed);
    if (!st.ok()) {
      // Another fabric, or (rarely) a ring the guest placed where another
      // registration starts: the link's staging ring carries its bytes.
      if (st.code() != Code::kFailedPrecondition)
        VS_LOG(kWarn, "conn %lu: RX ring not registered (%s): staged instead", static_cast<unsigned long>(c.handle),
               st.message().c_str());
      return;
    }
    c.rx_mr = c.rx.host;
    c.rx_rkey = k;
    counters_.rdma_rx_regions.fetch_add(1, std::memory_order_relaxed);
  }
  *addr = reinterpret_cast<uint64_t>(c.rx_mr);
  *rkey = c.rx_rkey;
}

void ConnManager::RetireRx(BackendConn& c) {
  if (c.rx_mr == nullptr) return;
  // (remote.gone is no reason to drop it: a peer whose guest left still
  // sends what that guest had written.)
  if (!c.remote.paired() || hosts_ == nullptr || hosts_->LinkTo(c.remote.host, c.handle) == nullptr) {
    // Not paired yet (the peer may hold the rkey from PAIR_ACCEPT): kept to
    // the end; or no link, so nothing writes any more: dropped now.
    if (c.remote.stage != RemotePeer::Stage::kAccepted) {
      UnregisterRx(c.rx_mr);
      c.rx_mr = nullptr;
    }
    return;
  }
  // The PLACEMENT that withdraws it is the next one sent (owed frames are
  // coalesced: it carries whatever the registration is by then).
  c.rx_mr_retired.emplace_back(c.placements_sent + 1, c.rx_mr);
  c.rx_mr = nullptr;
  c.rx_rkey = 0;
  Owe(c, kOwePlacement);
}

void ConnManager::UnregisterRx(void* addr) {
  if (hosts_ == nullptr) return;
  hosts_->UnregisterRemoteWritable(addr);
  counters_.rdma_rx_regions_dropped.fetch_add(1, std::memory_order_relaxed);
}

void ConnManager::DropRx(BackendConn& c) {
  if (hosts_ == nullptr) return;
  if (c.rx_mr != nullptr) UnregisterRx(c.rx_mr);
  for (const auto& [tag, addr] : c.rx_mr_retired) UnregisterRx(addr);
  c.rx_mr = nullptr;
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
  Status st = hosts_->RegisterSendable(c.tx.host, c.tx.size);
  counters_.rdma_reg_us.fetch_add((MonotonicNs() - t0) / 1000, std::memory_order_relaxed);
  if (!st.ok()) {
    if (st.code() != Code::kFailedPrecondition)
      VS_LOG(kWarn, "conn %lu: TX ring not registered (%s): its sends are copied",
             static_cast<unsigned long>(c.handle), st.message().c_str());
    return;
  }
  c.tx_mr = c.tx.host;
  if (!c.txh) c.txh = std::make_unique<TxHold>();
  counters_.rdma_tx_regions.fetch_add(1, std::memory_order_relaxed);
}

void ConnManager::WithdrawTx(BackendConn& c) {
  if (c.tx_mr == nullptr) return;
  uint64_t token = hosts_ ? hosts_->WithdrawSendable(c.tx_mr) : 0;
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
  return c.rx_mr != nullptr || !c.rx_mr_retired.empty() || (c.txh && c.txh->Busy());
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
      if (c->rx.host != nullptr) Raise(*c, kEvRxTail);
      break;
    case FrameType::kFence:
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
      break;
    case FrameType::kCredit:
      if (h.value < c->remote.credit || h.value > c->tx_copied) {
        counters_.fabric_violations.fetch_add(1, std::memory_order_relaxed);
        Violation(*c, "peer host sent a credit for bytes never sent");
        Owe(*c, kOweAbort);
        break;
      }
      c->remote.credit = h.value;
      UpdateCredit(*c);
      MarkMovable(*c);
      break;
    case FrameType::kShutWr:
      Raise(*c, kEvPeerShutWr | kEvRxTail);
      break;
    case FrameType::kGone:
      c->remote.gone = true;
      Raise(*c, kEvPeerGone);
      MaybeAnnounceShutdown(*c);
      MaybeDestroy(c);
      break;
    case FrameType::kAbort:
    case FrameType::kDowngrade: {
      {
        std::lock_guard<std::mutex> lock(snapshot_mu_);
        c->reason = h.type == FrameType::kAbort ? Reason::kPeerDowngraded : static_cast<Reason>(h.aux);
      }
      c->remote.gone = true;
      Raise(*c, kEvDowngrade);
      MaybeDestroy(c);
      break;
    }
    case FrameType::kPairConfirm:
      break;  // the upgrade above was all it asked for
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
      c->remote.stage = RemotePeer::Stage::kDetached;
      c->link_owed &= ~kOweData;
      MaybeDestroy(c);
      break;
    default:
      counters_.frames_dropped.fetch_add(1, std::memory_order_relaxed);
      break;
  }
}

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
  static const std::pair<uint32_t, FrameType> kOrder[] = {
      {kOweConfirm, FrameType::kPairConfirm}, {kOwePlacement, FrameType::kPlacement},
      {kOwePlacementAck, FrameType::kPlacementAck},
      {kOweFence, FrameType::kFence}, {kOweFenceAck, FrameType::kFenceAck},
      {kOweCredit, FrameType::kCredit}, {kOweShutWr, FrameType::kShutWr},
      {kOweGone, FrameType::kGone},   {kOweAbort, FrameType::kAbort},   {kOweRelease, FrameType::kRelease}};
  for (const auto& [bit, type] : kOrder) {
    if (!(c.link_owed & bit)) continue;
    uint64_t value = type == FrameType::kFence ? c.fence_bytes
                     : type == FrameType::kCredit ? c.rx_consumed
                     : type == FrameType::kShutWr ? c.tx_copied
                     : type == FrameType::kPlacement ? reinterpret_cast<uint64_t>(c.rx_mr)
                     : type == FrameType::kPlacementAck ? c.remote.placements_seen : 0;
    uint32_t aux = type == FrameType::kPlacement ? c.rx_rkey : 0;
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
  reaped |= RegisterQueuedTx();
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

void ConnManager::DetachRemote(BackendConn& c, Reason why) {
  bool upgraded = c.remote.paired();
  c.remote.stage = upgraded ? RemotePeer::Stage::kDetached : RemotePeer::Stage::kNone;
  c.remote.gone = true;
  c.link_owed = 0;
  DropRx(c);
  WithdrawTx(c);  // frames in flight on a live link still read it (OnHostDown: the link goes)
  if (!c.gone) {
    {
      std::lock_guard<std::mutex> lock(snapshot_mu_);
      c.reason = why;
    }
    Raise(c, kEvDowngrade);
  }
  if (upgraded) counters_.fabric_downgrades.fetch_add(1, std::memory_order_relaxed);
  MaybeDestroy(&c);
}

void ConnManager::OnHostUp(uint32_t host) {
  if (hosts_ == nullptr) return;
  std::vector<BackendConn*> todo;
  for (auto& [h, c] : conns_)
    if (!c->gone && c->state == ConnState::kPending && c->peer == nullptr &&
        c->remote.stage == RemotePeer::Stage::kNone && c->role == proto::Role::kClient &&
        c->reason == Reason::kPending && c->key.scope == 0)
      todo.push_back(c.get());
  for (BackendConn* c : todo)
    if (LocalPortFor(c->key.tenant, c->key.peer) == nullptr && hosts_->Locate(c->key.tenant, c->key.peer) == host)
      RequestRemotePair(*c, host);
}

void ConnManager::OnHostDown(uint32_t host) {
  for (auto& [k, s] : sinks_)
    if (s->host() == host) s->Reset();
  std::erase_if(pending_remote_, [host](const auto& kv) { return kv.second.host == host; });
  std::vector<BackendConn*> hit;
  for (auto& [h, c] : conns_)
    if (c->remote.host == host && c->remote.stage != RemotePeer::Stage::kNone &&
        c->remote.stage != RemotePeer::Stage::kDetached)
      hit.push_back(c.get());
  for (BackendConn* c : hit) DetachRemote(*c, Reason::kFabricDown);
  // The host's links are destroyed right after this: no frame on them
  // reads a TX ring any more (including connections detached earlier).
  std::vector<BackendConn*> held;
  for (auto& [h, c] : conns_)
    if (c->txh && c->txh->host() == host && c->txh->Busy()) held.push_back(c.get());
  for (BackendConn* c : held) {
    std::vector<uint64_t> tokens;
    c->txh->Forget(&tokens);
    for (uint64_t t : tokens) ReleaseTxToken(t);
    UpdateCredit(*c);
    MaybeReleaseRings(*c);
  }
}

}  // namespace vsocket::backend
