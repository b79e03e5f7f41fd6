// Cross-host pairing: PAIR_REQUEST/ACCEPT/REJECT/CANCEL on the TLS control
// channel, and what happens to connections when a peer host comes or goes.
#include "host-backend/conn/conn_manager.h"

#include "base/clock.h"
#include "base/log.h"
#include "host-backend/conn/address.h"
#include "host-backend/remote/frame.h"
#include "host-backend/remote/link_sink.h"

namespace vsocket::backend {

using proto::FrameHeader;
using proto::FrameType;
using proto::Reason;

namespace {

constexpr size_t kMaxPendingRemote = 65536;
// One peer host, and one tenant (over all hosts), may hold at most a
// quarter of them each (issue 17, finding 6).
constexpr size_t kMaxPendingRemotePerHost = kMaxPendingRemote / 4;
constexpr size_t kMaxPendingRemotePerTenant = kMaxPendingRemote / 4;

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

const vhost::PortConfig* ConnManager::LocalPortFor(uint32_t tenant, const proto::Endpoint& addr, bool away) const {
  if (ports_ == nullptr) return nullptr;
  for (const vhost::PortConfig& p : *ports_)
    if (p.tenant_id == tenant && !IsLoopback(addr) && AddressAllowed(p, addr) && (away || !this->away(p.index)))
      return &p;
  return nullptr;
}

void ConnManager::PeerMoved(BackendConn& c, uint32_t refused_by) {
  c.remote.stage = RemotePeer::Stage::kNone;
  DropRx(c);
  counters_.pair_moved.fetch_add(1, std::memory_order_relaxed);
  VS_LOG(kDebug, "conn %lu (port %u -> %u): host %u says the peer's VM moved", static_cast<unsigned long>(c.handle),
         c.key.local.port, c.key.peer.port, refused_by);
  // Here now, or where the locator says if that is another host; else it
  // waits for the locator to change (kRelocate) or for its peer to come.
  if (PairWithMirror(c) || LocalPortFor(c.key.tenant, c.key.peer) != nullptr || Draining(c.vm_index)) return;
  uint32_t host = hosts_->Locate(c.key.tenant, c.key.peer);
  if (host != 0 && host != refused_by) RequestRemotePair(c, host);
}

void ConnManager::RequestRemotePair(BackendConn& c, uint32_t host) {
  uint64_t rx_addr;
  uint32_t rx_rkey;
  RegisterRx(c, host, &rx_addr, &rx_rkey);
  std::array<uint8_t, proto::kPairInfoSize> payload = PairPayload(c, rx_addr, rx_rkey);
  FrameHeader h = Frame(FrameType::kPairRequest, c.key.tenant, 0, c.handle, c.rx.size);
  h.len = proto::kPairInfoSize;
  if (!hosts_->SendPairing(host, h, payload)) {
    DropRx(c);
    return;  // stays on kernel TCP
  }
  c.remote.stage = RemotePeer::Stage::kRequested;
  c.remote.host = host;
  c.remote.fence_seen = false;  // (a connection paired again after a RESYNC)
  SubmitRx(c);  // (while the request travels)
  counters_.pair_requests_sent.fetch_add(1, std::memory_order_relaxed);
  VS_LOG(kDebug, "conn %lu (port %u -> %u): PAIR_REQUEST to host %u", static_cast<unsigned long>(c.handle),
         c.key.local.port, c.key.peer.port, host);
}

void ConnManager::AcceptRemote(BackendConn& c, const PendingRemote& r) {
  if (!hosts_) return;
  uint64_t rx_addr;
  uint32_t rx_rkey;
  RegisterRx(c, r.host, &rx_addr, &rx_rkey);
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
  SubmitRx(c);
  VS_LOG(kDebug, "conn %lu (port %u -> %u): PAIR_ACCEPT to host %u for its conn %lu",
         static_cast<unsigned long>(c.handle), c.key.local.port, c.key.peer.port, r.host,
         static_cast<unsigned long>(r.handle));
}

void ConnManager::WithdrawPairRequest(BackendConn& c) {
  if (hosts_ != nullptr) hosts_->SendPairing(c.remote.host, Frame(FrameType::kPairCancel, c.key.tenant, 0, c.handle), {});
  DropRx(c);
  c.remote.stage = RemotePeer::Stage::kNone;
}

void ConnManager::UpgradeRemote(BackendConn& c) {
  c.remote.stage = RemotePeer::Stage::kPaired;
  c.state = ConnState::kUpgraded;
  c.reason = Reason::kNone;
  VS_LOG(kDebug, "conn %lu paired with host %u conn %lu", static_cast<unsigned long>(c.handle), c.remote.host,
         static_cast<unsigned long>(c.remote.handle));
  counters_.upgrades.fetch_add(1, std::memory_order_relaxed);
  counters_.remote_upgrades.fetch_add(1, std::memory_order_relaxed);
  vm_totals_[c.vm_index % kMaxVms].upgrades.fetch_add(1, std::memory_order_relaxed);
  c.ev_peer_rx_window = c.remote.window;
  Raise(c, kEvUpgrade);
  if (c.rx_mr_untold) {
    // Registered after our pairing message left: the peer learns it now.
    c.rx_mr_untold = false;
    Owe(c, kOwePlacement);
  }
  SubmitTx(c);
  MaybeAnnounceShutdown(c);
  // Asked or accepted before its VM began to drain: it leaves the rings
  // like the others (never reset by a move for having come late).
  if (Draining(c.vm_index)) (void)AskDrain(c, draining(c.vm_index));
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
      if (!proto::IsValidRingSize(h.aux)) return refuse(Reason::kProtocolError, "window is not a valid ring size");
      // The requester may only speak for addresses it runs, and only about
      // our VMs of the same tenant.
      bool unconfirmed = false;
      if (!hosts_->Runs(host, h.tenant, info->local)) {
        if (LocalPortFor(h.tenant, info->peer, true) != nullptr && hosts_->DirectoryCannotPlace(h.tenant, info->local)) {
          // Not a lie we can tell: the directory cannot be asked (etcd
          // unreachable) and its cache lacks the address. Both sides stay
          // on kernel TCP and say why (decision 95).
          DeclineHere(host, ConnKey{h.tenant, 0, info->peer, info->local}, info->role, Reason::kDirectoryUnavailable);
          return refuse(Reason::kDirectoryUnavailable, "the directory cannot place the requester's address now");
        }
        if (LocalPortFor(h.tenant, info->peer, true) == nullptr || !hosts_->DirectoryMayLag())
          return refuse(Reason::kCrossTenant, "requester does not run that tenant address");
        // Our watch may not have caught up with a VM that has just moved
        // to the requester (its host published it, and saw it, before it
        // let the VM's connections ask): the request waits, kept like one
        // whose guest has not registered, and is accepted only once the
        // directory places the requester there (PairRemote: at our guest's
        // registration, or at the next change of the directory, Relocate);
        // else it expires unanswered (decision 104).
        unconfirmed = true;
        counters_.pair_unconfirmed.fetch_add(1, std::memory_order_relaxed);
        VS_LOG(kInfo, "peer host %u: pairing request for tenant %u port %u -> %u kept until the directory places its "
               "requester on that host", host, h.tenant, info->local.port, info->peer.port);
      }
      // A VM configured here that runs elsewhere (away) may be about to
      // arrive: the request is kept as for one whose guest has not
      // registered yet (a VM that leaves refuses what was kept for it as
      // moved: Leave).
      if (LocalPortFor(h.tenant, info->peer, true) == nullptr)
        return refuse(Reason::kCrossTenant, "no VM of that tenant has that address here");
      ConnKey key{h.tenant, 0, info->peer, info->local};
      // We kept our side on kernel TCP (decision 63): the answer is final.
      if (auto why = TakeDecline(key, false)) {
        counters_.pair_declines_sent.fetch_add(1, std::memory_order_relaxed);
        hosts_->SendPairing(host, Frame(FrameType::kPairReject, h.tenant, h.value, 0, static_cast<uint32_t>(*why)),
                            {});
        return;
      }
      PendingRemote r{host, h.value, h.aux, info->rx_addr, info->rx_rkey, MonotonicMs() + kPendingRemoteMs,
                      unconfirmed};
      uint64_t mine = 0;
      if (!unconfirmed && registry_.find(key, mine)) {
        BackendConn* c = conn(mine);
        bool available = c && c->WaitsForPeer() && c->role != info->role;
        if (available && !Draining(c->vm_index)) {
          AcceptRemote(*c, r);
          return;
        }
        // A connection that went back to kernel TCP after a link loss
        // (RESYNC), a drain or its peer's VM moving on the rings (decision
        // 110) stays registered until its library registers
        // it again to re-upgrade, and a draining VM's waits for the undrain:
        // the request waits for that, like one that comes before the
        // registration.
        bool resynced = c && c->state == ConnState::kUpgraded &&
                        (c->remote.stage == RemotePeer::Stage::kDetached || c->ring_ended || c->peer_moved);
        if (!available && !resynced)
          return refuse(Reason::kPeerNotRegistered, "connection is not available for pairing");
      }
      // Our guest has not registered yet: keep the request for a while.
      VS_LOG(kDebug, "host %u conn %lu (port %u -> %u): PAIR_REQUEST kept until our guest registers", host,
             static_cast<unsigned long>(h.value), info->local.port, info->peer.port);
      if (!KeepPendingRemote(key, r)) return refuse(Reason::kResourceLimit, "too many pending pairing requests");
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
      if (!proto::IsValidRingSize(h.aux)) {
        // Never paired: our guest stays on kernel TCP; the acceptor learns
        // it by the cancel.
        counters_.fabric_violations.fetch_add(1, std::memory_order_relaxed);
        VS_LOG(kWarn, "peer host %u: PAIR_ACCEPT for conn %lu with window %u: refused", host,
               static_cast<unsigned long>(h.handle), h.aux);
        hosts_->SendPairing(host, Frame(FrameType::kPairCancel, h.tenant, h.value, h.handle), {});
        c->remote.stage = RemotePeer::Stage::kNone;
        DropRx(*c);
        c->reason = Reason::kProtocolError;
        Raise(*c, kEvDowngrade);
        return;
      }
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
      if (OtherTenants(host, h, c)) return;
      if (c == nullptr || c->remote.stage != RemotePeer::Stage::kRequested || c->remote.host != host) return;
      if (h.aux == static_cast<uint32_t>(Reason::kMigration) && !c->gone) return PeerMoved(*c, host);
      c->remote.stage = RemotePeer::Stage::kNone;
      DropRx(*c);
      c->reason = PeerReason(h.aux);
      Raise(*c, kEvDowngrade);  // not upgraded: the guest just stays on kernel TCP
      return;
    }
    case FrameType::kPairDecline: {
      // The peer's host keeps its side on kernel TCP (decision 63): ours
      // stops waiting (DOWNGRADE before any upgrade: kernel TCP for good,
      // the library unregisters it), or, not registered yet, is answered so
      // when it registers.
      counters_.pair_declines_received.fetch_add(1, std::memory_order_relaxed);
      auto info = proto::DecodePairInfo(payload);
      if (!info.ok() || !hosts_->Runs(host, h.tenant, info->local)) {
        counters_.pair_refused.fetch_add(1, std::memory_order_relaxed);
        VS_LOG(kWarn, "peer host %u: PAIR_DECLINE for what it does not run: ignored", host);
        return;
      }
      // No VM here has the address (a decline broadcast because the
      // directory could not say where it runs, decision 95): not ours.
      if (LocalPortFor(h.tenant, info->peer, true) == nullptr) return;
      DeclineHere(host, ConnKey{h.tenant, 0, info->peer, info->local}, info->role, PeerReason(h.aux));
      return;
    }
    case FrameType::kPairCancel: {
      if (h.handle != 0) {
        BackendConn* c = conn(h.handle);
        if (OtherTenants(host, h, c)) return;
        if (c == nullptr || c->remote.host != host || c->remote.handle != h.value) return;
        if (c->remote.stage == RemotePeer::Stage::kAccepted) {
          c->remote.stage = RemotePeer::Stage::kNone;
          c->reason = Reason::kPeerNotRegistered;
          Raise(*c, kEvDowngrade);  // a guest waiting on kernel EOF learns it is final
        } else if (c->remote.paired()) {
          // (fabric-down: its peer left with a VM that moved on the rings,
          // decision 110; both finish on kernel TCP through RESYNC.)
          DetachRemote(*c, h.aux == static_cast<uint32_t>(Reason::kFabricDown) ? Reason::kFabricDown
                                                                                : Reason::kPeerNotRegistered);
        }
        return;
      }
      // The requester withdrew before we answered (or before we accepted).
      DropPendingRemote([&](const auto& kv) {
        return kv.second.host == host && kv.second.handle == h.value && kv.first.tenant == h.tenant;
      });
      for (auto& [hd, c] : conns_)
        if (c->remote.stage == RemotePeer::Stage::kAccepted && c->remote.host == host && c->remote.handle == h.value &&
            c->key.tenant == h.tenant) {
          c->remote.stage = RemotePeer::Stage::kNone;
          Raise(*c, kEvDowngrade);
        }
      return;
    }
    default: counters_.frames_dropped.fetch_add(1, std::memory_order_relaxed); return;
  }
}

void ConnManager::DetachRemote(BackendConn& c, Reason why) {
  bool upgraded = c.remote.paired();
  c.remote.stage = upgraded ? RemotePeer::Stage::kDetached : RemotePeer::Stage::kNone;
  c.remote.gone = true;
  c.link_owed = 0;
  DropRx(c);
  WithdrawTx(c);  // frames in flight on a live link still read it (OnHostDown: the link goes)
  if (!c.gone) {
    c.reason = why;
    Raise(c, kEvDowngrade);
  }
  if (upgraded) counters_.fabric_downgrades.fetch_add(1, std::memory_order_relaxed);
  MaybeDestroy(&c);
}

void ConnManager::OnHostUp(uint32_t host) {
  if (hosts_ == nullptr) return;
  std::vector<BackendConn*> todo;
  for (auto& [h, c] : conns_)
    if (c->WaitsForPeer() && c->role == proto::Role::kClient && c->key.scope == 0 && !Draining(c->vm_index))
      todo.push_back(c.get());
  for (BackendConn* c : todo)
    if (LocalPortFor(c->key.tenant, c->key.peer) == nullptr && hosts_->Locate(c->key.tenant, c->key.peer) == host)
      RequestRemotePair(*c, host);
}

bool ConnManager::KeepPendingRemote(const ConnKey& key, const PendingRemote& r) {
  auto full = [&] {
    return pending_remote_.size() >= kMaxPendingRemote || pending_per_host_[r.host] >= kMaxPendingRemotePerHost ||
           pending_per_tenant_[key.tenant] >= kMaxPendingRemotePerTenant;
  };
  if (full()) {
    int64_t now = MonotonicMs();
    DropPendingRemote([now](const auto& kv) { return kv.second.expires_ms < now; });
    if (full()) return false;
  }
  auto [it, added] = pending_remote_.try_emplace(key, r);
  if (!added) {
    Unshare(*it);  // the same 4-tuple asked for again
    it->second = r;
  }
  ++pending_per_host_[r.host];
  ++pending_per_tenant_[key.tenant];
  return true;
}

void ConnManager::OnHostDown(uint32_t host) {
  for (auto& [k, s] : sinks_)
    if (s->host() == host) s->Reset();
  DropPendingRemote([host](const auto& kv) { return kv.second.host == host; });
  std::vector<BackendConn*> hit;
  for (auto& [h, c] : conns_) {
    if (c->remote.host != host || c->remote.stage == RemotePeer::Stage::kNone ||
        c->remote.stage == RemotePeer::Stage::kDetached)
      continue;
    if (c->remote.stage == RemotePeer::Stage::kRequested && !c->gone) {
      // Asked, not answered: nobody upgraded anything (the acceptor's guest
      // upgrades at our first link frame), so our guest just stays pending
      // and asks again when the host is back (OnHostUp) — a peer host that
      // restarts after a drain kept our requests until it stopped.
      DropRx(*c);
      c->remote.stage = RemotePeer::Stage::kNone;
      continue;
    }
    hit.push_back(c.get());
  }
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
