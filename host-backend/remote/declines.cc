// Declines (decisions 63 and 95): a side kept on kernel TCP tells its
// peer's host with PAIR_DECLINE, so that the other side does not wait for a
// pairing that never comes; and what a decline said, for a registration or
// a request that comes after it.
#include "host-backend/conn/conn_manager.h"

#include "base/clock.h"
#include "base/log.h"
#include "host-backend/conn/address.h"
#include "host-backend/remote/frame.h"

namespace vsocket::backend {

using proto::FrameHeader;
using proto::FrameType;
using proto::Reason;

namespace {

// Declines kept for a registration or request still to come; one peer
// host may hold a quarter of them.
constexpr size_t kMaxDeclined = 16384;
constexpr size_t kMaxDeclinedPerHost = kMaxDeclined / 4;
// Decision 95: PAIR_DECLINE frames one second's directory-unavailable
// fallbacks may broadcast (one per host up each): with 64 hosts, 64
// connections a second; beyond it a peer's side is not told and waits as
// for a peer that never registers.
constexpr size_t kMaxDirectoryDeclinesPerSecond = 4096;

// A registration as PAIR_DECLINE describes it (rx_addr/rx_rkey 0).
std::array<uint8_t, proto::kPairInfoSize> DeclinePayload(const proto::RegisterConn& r) {
  proto::PairInfo info;
  info.local = r.local;
  info.peer = r.peer;
  info.role = r.role;
  std::array<uint8_t, proto::kPairInfoSize> payload;
  proto::EncodePairInfo(info, payload.data());
  return payload;
}

}  // namespace

void ConnManager::DeclineRemote(uint32_t tenant, const proto::RegisterConn& r, Reason why) {
  if (hosts_ == nullptr || IsLoopback(r.local) || IsLoopback(r.peer)) return;
  ConnKey key{tenant, 0, r.local, r.peer};
  auto pr = pending_remote_.find(key);
  if (pr != pending_remote_.end()) {
    // Its peer asked already: the answer.
    PendingRemote asked = pr->second;
    ErasePendingRemote(pr);
    if (hosts_->SendPairing(asked.host,
                            Frame(FrameType::kPairReject, tenant, asked.handle, 0, static_cast<uint32_t>(why)), {}))
      counters_.pair_declines_sent.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // A request that comes later gets the same answer; the peer's host, if
  // its guest registered already (or does later), learns it now.
  RememberDecline(key, 0, why);
  uint32_t host = hosts_->Locate(tenant, r.peer);
  if (host == 0) return;
  FrameHeader h = Frame(FrameType::kPairDecline, tenant, 0, 0, static_cast<uint32_t>(why));
  h.len = proto::kPairInfoSize;
  if (hosts_->SendPairing(host, h, DeclinePayload(r)))
    counters_.pair_declines_sent.fetch_add(1, std::memory_order_relaxed);
}

bool ConnManager::DirectoryCannotPlace(uint32_t tenant, const proto::RegisterConn& r) {
  if (hosts_ == nullptr || IsLoopback(r.local) || IsLoopback(r.peer) || LocalPortFor(tenant, r.peer) != nullptr)
    return false;
  // (A peer host that asked already knows where we are: PairRemote answers it.)
  if (pending_remote_.count(ConnKey{tenant, 0, r.local, r.peer}) != 0) return false;
  return hosts_->DirectoryCannotPlace(tenant, r.peer);
}

void ConnManager::DeclineEverywhere(uint32_t tenant, const proto::RegisterConn& r, Reason why) {
  // Where the peer runs is what the directory cannot say: every host up is
  // told, and only one that runs a VM with the peer's address keeps it
  // (the PAIR_DECLINE case of OnPairingFrame).
  std::vector<uint32_t> up = hosts_->HostsUp();
  if (up.empty()) return;
  int64_t second = MonotonicMs() / 1000;
  if (second != decline_second_) {
    decline_second_ = second;
    decline_frames_ = 0;
  }
  if (decline_frames_ + up.size() > kMaxDirectoryDeclinesPerSecond) {
    counters_.pair_declines_unsent.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  decline_frames_ += up.size();
  FrameHeader h = Frame(FrameType::kPairDecline, tenant, 0, 0, static_cast<uint32_t>(why));
  h.len = proto::kPairInfoSize;
  std::array<uint8_t, proto::kPairInfoSize> payload = DeclinePayload(r);
  size_t sent = 0;
  for (uint32_t host : up) sent += hosts_->SendPairing(host, h, payload);
  if (sent > 0) counters_.pair_declines_sent.fetch_add(1, std::memory_order_relaxed);
  VS_LOG(kDebug, "tenant %u port %u -> %u: %s, PAIR_DECLINE to %zu of %zu host(s)", tenant, r.local.port,
         r.peer.port, proto::ToString(why), sent, up.size());
}

void ConnManager::DeclineHere(uint32_t host, const ConnKey& key, proto::Role their_role, Reason why) {
  uint64_t mine = 0;
  if (registry_.find(key, mine)) {
    auto it = conns_.find(mine);
    BackendConn* c = it == conns_.end() ? nullptr : it->second.get();
    if (c != nullptr && c->WaitsForPeer() && c->role != their_role) {
      c->reason = why;
      Raise(*c, kEvDowngrade);  // before any upgrade: kernel TCP for good
    }
    // (Asked, accepted or paired: that pairing answers for itself.)
    return;
  }
  RememberDecline(key, host, why);
}

void ConnManager::RememberDecline(const ConnKey& key, uint32_t host, Reason why) {
  auto full = [&] {
    return declined_.size() >= kMaxDeclined || (host != 0 && declined_per_host_[host] >= kMaxDeclinedPerHost);
  };
  if (full()) {
    int64_t now = MonotonicMs();
    std::erase_if(declined_, [&](const auto& kv) {
      if (kv.second.expires_ms >= now) return false;
      UnshareDecline(kv.second);
      return true;
    });
    if (full()) return;  // (then that registration just waits, as without a decline)
  }
  auto [it, added] = declined_.try_emplace(key, Declined{host, why, MonotonicMs() + kPendingRemoteMs});
  if (!added) {
    UnshareDecline(it->second);
    it->second = Declined{host, why, MonotonicMs() + kPendingRemoteMs};
  }
  if (host != 0) ++declined_per_host_[host];
}

std::optional<Reason> ConnManager::TakeDecline(const ConnKey& key, bool from_peer) {
  if (declined_.empty()) return std::nullopt;
  auto it = declined_.find(key);
  if (it == declined_.end()) return std::nullopt;
  Declined d = it->second;
  // Either way the entry is used up: a registration (or a request) after it
  // is a new connection with the same 4-tuple.
  UnshareDecline(d);
  declined_.erase(it);
  if (d.expires_ms < MonotonicMs() || (d.host != 0) != from_peer) return std::nullopt;
  return d.why;
}

}  // namespace vsocket::backend
