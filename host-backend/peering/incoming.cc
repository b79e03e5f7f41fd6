// Connections accepted on peer_listen: TLS control channels of peers that
// connect to us, and the data links of their sessions.
#include "host-backend/peering/peers.h"

#include <arpa/inet.h>
#include <netinet/in.h>
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

namespace {

std::string AddrString(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    port = ntohs(a->sin6_port);
  }
  return std::string(buf) + ":" + std::to_string(port);
}

}  // namespace

void Peering::AcceptAll() {
  for (;;) {
    sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int fd = accept4(listener_.get(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    if (incoming_.size() >= 64) {  // a flood of half-open peers: shed it
      close(fd);
      continue;
    }
    Incoming in{UniqueFd(fd), nullptr, AddrString(ss), MonotonicMs() + kSetupTimeoutMs};
    Watch(fd, false);
    incoming_.push_back(std::move(in));
  }
}

// An accepted connection: a TLS control channel (first byte 0x16, a TLS
// handshake record) or one of a session's data links (LINK_HELLO with the
// session key, the link's index and the count).
void Peering::StepIncoming(Incoming& in, bool* done) {
  *done = false;
  auto refuse = [&](std::atomic<uint64_t>& counter, const std::string& why) {
    counter.fetch_add(1, std::memory_order_relaxed);
    VS_LOG(kWarn, "peering: refused connection from %s: %s", in.from.c_str(), why.c_str());
    int fd = in.tls ? in.tls->fd() : in.fd.get();
    epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
    *done = true;
  };
  if (MonotonicMs() > in.deadline_ms) return refuse(counters_.refused_tls, "setup timed out");
  if (!in.tls) {
    uint8_t first;
    ssize_t n = recv(in.fd.get(), &first, 1, MSG_PEEK);
    if (n == 0) return refuse(counters_.refused_tls, "closed before saying anything");
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      return refuse(counters_.refused_tls, strerror(errno));
    }
    if (first == 0x16) {
      in.tls = peering::TlsChannel::Server(*tls_ctx_, std::move(in.fd));
    } else {
      // A data link: exactly the LINK_HELLO frame, nothing of what follows.
      uint8_t buf[proto::kFrameHeaderSize + 32];
      n = recv(in.fd.get(), buf, sizeof(buf), MSG_PEEK);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) return refuse(counters_.refused_link, "closed during link hello");
      if (static_cast<size_t>(n) < sizeof(buf)) return;  // more to come
      auto h =
          proto::DecodeFrameHeader(std::span<const uint8_t, proto::kFrameHeaderSize>(buf, proto::kFrameHeaderSize));
      if (!h.ok() || h->type != FrameType::kLinkHello)
        return refuse(counters_.refused_link, "neither TLS nor a link hello");
      if (rdma_) return refuse(counters_.refused_link, "a tcp data link offered, but this host runs the rdma fabric");
      Host* owner = nullptr;
      for (auto& host : hosts_)
        if (host->state == State::kWaitLink &&
            CRYPTO_memcmp(host->link_key.data(), buf + proto::kFrameHeaderSize, 32) == 0)
          owner = host.get();
      if (owner == nullptr) return refuse(counters_.refused_link, "data link with an unknown session key");
      size_t lane = 0;
      std::string why;
      if (!LaneOf(*owner, *h, &lane, &why) || owner->lanes[lane].link)
        return refuse(counters_.refused_link, "data link for peer " + owner->name + ": " +
                                                  (why.empty() ? "link " + std::to_string(lane) + " twice" : why));
      (void)!recv(in.fd.get(), buf, sizeof(buf), 0);  // consume the hello
      Status st = fabric::ConfigureLinkSocket(in.fd.get());
      if (!st.ok()) return refuse(counters_.refused_link, st.message());
      Lane& l = owner->lanes[lane];
      {
        std::lock_guard<std::mutex> lock(mu_);
        l.link = fabric::MakeStreamLink(fabric::MakeFdTransport(in.fd.release()));
      }
      Watch(l.link->wake_fd(), false);
      *done = true;
      if (!AllLanes(*owner, false)) return;  // more to come
      FrameHeader ready;
      ready.type = FrameType::kLinkReady;
      Status sent = owner->tls->Send(Message(ready, {}));
      if (!sent.ok()) {
        HostDown(*owner, "control channel: " + sent.message());
      } else {
        HostUp(*owner);
      }
      return;
    }
  }
  auto p = in.tls->Handshake();
  if (p == peering::TlsChannel::Progress::kFailed)
    return refuse(counters_.refused_tls, "TLS: " + in.tls->error().message());
  Watch(in.tls->fd(), p == peering::TlsChannel::Progress::kWantWrite);
  if (p != peering::TlsChannel::Progress::kDone) return;
  // The peer is the configured host its certificate names, by the rule the
  // connecting side applies to us (TlsChannel::PeerIs): exactly one.
  Host* h = nullptr;
  int named = 0;
  for (auto& candidate : hosts_) {
    if (!in.tls->PeerIs(candidate->name)) continue;
    h = candidate.get();
    ++named;
  }
  if (named != 1)
    return refuse(counters_.refused_name, "authenticated as " + in.tls->PeerNames() + ", which " +
                                              (named == 0 ? "is not a configured peer" : "names several peers"));
  if (h->initiator)
    return refuse(counters_.refused_name, "'" + h->name + "' connected, but this host is the one that connects to it");
  if (h->state != State::kIdle) HostDown(*h, "peer reconnected");
  h->tls = std::move(in.tls);
  h->state = State::kHandshake;
  OnTlsUp(*h);
  *done = true;
}

}  // namespace vsocket::backend
