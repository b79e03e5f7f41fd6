// Connections accepted on peer_listen, once the handshaker is done with
// them: TLS control channels of peers that connect to us, and the data links
// of their sessions.
#include "host-backend/peering/peers.h"

#include <sys/socket.h>
#include <openssl/crypto.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <cstring>

#include "base/clock.h"
#include "base/log.h"
#include "host-backend/fabric/tcp_fabric.h"
#include "host-backend/peering/control_message.h"

namespace vsocket::backend {

using proto::FrameHeader;
using proto::FrameType;

void Peering::TakeIncoming() {
  for (Handshaker::Ready& r : handshaker_.Take()) {
    if (r.generation != handshaker_.generation() && r.tls) {
      // Verified against tls_crl before it changed: the peer dials again.
      VS_LOG(kInfo, "peering: connection from %s dropped: tls_crl changed during its handshake", r.from.c_str());
      continue;
    }
    if (r.tls) AcceptTls(std::move(r.tls), r.from);
    else AcceptLink(std::move(r.link), r.from);
  }
}

// A data link: exactly the LINK_HELLO frame (the handshaker saw it whole),
// nothing of what follows.
void Peering::AcceptLink(UniqueFd fd, const std::string& from) {
  auto refuse = [&](const std::string& why) {
    counters_.refused_link.fetch_add(1, std::memory_order_relaxed);
    VS_LOG(kWarn, "peering: refused connection from %s: %s", from.c_str(), why.c_str());
  };
  uint8_t buf[proto::kFrameHeaderSize + 32];
  ssize_t n = recv(fd.get(), buf, sizeof(buf), MSG_PEEK);
  if (n != static_cast<ssize_t>(sizeof(buf))) return refuse("closed during link hello");
  auto h = proto::DecodeFrameHeader(std::span<const uint8_t, proto::kFrameHeaderSize>(buf, proto::kFrameHeaderSize));
  if (!h.ok() || h->type != FrameType::kLinkHello) return refuse("neither TLS nor a link hello");
  if (rdma_) return refuse("a tcp data link offered, but this host runs the rdma fabric");
  Host* owner = nullptr;
  for (auto& host : hosts_)
    if (host->state == State::kWaitLink && CRYPTO_memcmp(host->link_key.data(), buf + proto::kFrameHeaderSize, 32) == 0)
      owner = host.get();
  if (owner == nullptr) return refuse("data link with an unknown session key");
  size_t lane = 0;
  std::string why;
  if (!LaneOf(*owner, *h, &lane, &why) || owner->lanes[lane].link)
    return refuse("data link for peer " + owner->name + ": " +
                  (why.empty() ? "link " + std::to_string(lane) + " twice" : why));
  (void)!recv(fd.get(), buf, sizeof(buf), 0);  // consume the hello
  Status st = fabric::ConfigureLinkSocket(fd.get());
  if (!st.ok()) return refuse(st.message());
  Lane& l = owner->lanes[lane];
  {
    MutexLock lock(owner->mu);
    l.link = fabric::MakeStreamLink(fabric::MakeFdTransport(fd.release()));
  }
  Watch(l.link->wake_fd(), false);
  if (!AllLanes(*owner, false)) return;  // more to come
  FrameHeader ready;
  ready.type = FrameType::kLinkReady;
  Status sent = owner->tls->Send(Message(ready, {}));
  if (!sent.ok()) {
    HostDown(*owner, "control channel: " + sent.message());
  } else {
    HostUp(*owner);
  }
}

// A TLS control channel, its handshake done: the peer is the configured
// host its certificate names, by the rule the connecting side applies to us
// (TlsChannel::PeerIs): exactly one.
void Peering::AcceptTls(std::unique_ptr<peering::TlsChannel> tls, const std::string& from) {
  auto refuse = [&](const std::string& why) {
    counters_.refused_name.fetch_add(1, std::memory_order_relaxed);
    VS_LOG(kWarn, "peering: refused connection from %s: %s", from.c_str(), why.c_str());
  };
  Host* h = nullptr;
  int named = 0;
  for (auto& candidate : hosts_) {
    // (A host that left the directory is no peer now: decision 96.)
    if (!candidate->listed || !tls->PeerIs(candidate->name)) continue;
    h = candidate.get();
    ++named;
  }
  if (named != 1)
    return refuse("authenticated as " + tls->PeerNames() + ", which " +
                  (named == 0 ? "is neither a configured peer nor a host in the directory" : "names several peers"));
  if (h->initiator) return refuse("'" + h->name + "' connected, but this host is the one that connects to it");
  if (h->state != State::kIdle) HostDown(*h, "peer reconnected");
  h->tls = std::move(tls);
  h->state = State::kHandshake;
  Watch(h->tls->fd(), h->tls->WantsWrite());
  OnTlsUp(*h);
}

}  // namespace vsocket::backend
