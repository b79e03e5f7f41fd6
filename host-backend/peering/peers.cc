#include "host-backend/peering/peers.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "base/clock.h"
#include "base/log.h"
#include "host-backend/fabric/rdma_link.h"
#include "host-backend/fabric/tcp_fabric.h"

namespace vsocket::backend {

using proto::FrameHeader;
using proto::FrameType;

namespace {

constexpr int kSetupTimeoutMs = 5000;
constexpr int kBackoffMinMs = 200;
constexpr int kBackoffMaxMs = 10000;
constexpr const char* kLinkKeyLabel = "vsocket fabric link v1";

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

std::vector<uint8_t> Message(const FrameHeader& h, std::span<const uint8_t> payload) {
  std::vector<uint8_t> m(proto::kFrameHeaderSize + payload.size());
  proto::EncodeFrameHeader(h, m.data());
  if (!payload.empty()) std::memcpy(m.data() + proto::kFrameHeaderSize, payload.data(), payload.size());
  return m;
}

int SocketError(int fd) {
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
  return err;
}

}  // namespace

const char* Peering::ToString(State s) {
  switch (s) {
    case State::kIdle: return "waiting-for-peer";
    case State::kBackoff: return "backoff";
    case State::kConnecting: return "connecting";
    case State::kHandshake: return "tls-handshake";
    case State::kLinkConnecting: return "link-connecting";
    case State::kWaitLink: return "waiting-for-link";
    case State::kWaitReady: return "waiting-for-ready";
    case State::kUp: return "up";
  }
  return "?";
}

void LinkTotals::Add(const fabric::LinkStats& s) {
  frames_out += s.frames_out;
  frames_in += s.frames_in;
  bytes_out += s.data_bytes_out;
  bytes_in += s.data_bytes_in;
  writes += s.write_calls;
  reads += s.read_calls;
  busy += s.busy;
  copied += s.backlog_bytes;
  inplace += s.inplace_bytes;
}

Peering::~Peering() {
  for (auto& h : hosts_)
    if (h->tls) h->tls->Close();
}

Status Peering::Start(const DaemonConfig& config) {
  if (config.peers.empty()) return Status::Ok();
  host_name_ = config.host_name;
  fabric_ = config.fabric;
  links_per_peer_ = std::clamp(config.links_per_peer, 1, kMaxLinksPerPeer);
  if (fabric_ == "rdma") {
    // Never a silent fall back to tcp: without the device the daemon stops.
    fabric::RdmaDevice::Options o;
    o.name = config.rdma_device;
    o.gid_index = config.rdma_gid_index;
    auto dev = fabric::RdmaDevice::Open(o);
    if (!dev.ok()) {
      std::string present;
      for (const std::string& n : fabric::RdmaDevice::List()) present += (present.empty() ? "" : ", ") + n;
      return Status(Code::kFailedPrecondition,
                    "fabric = rdma, but RDMA device '" + (o.name.empty() ? std::string("(first)") : o.name) +
                        "' cannot be used: " + dev.status().message() +
                        " (devices present: " + (present.empty() ? "none" : present) + ")");
    }
    rdma_ = std::move(dev).value();
  }
  auto ctx = peering::TlsContext::Create({config.tls_cert, config.tls_key, config.tls_ca});
  if (!ctx.ok()) return ctx.status();
  tls_ctx_ = std::move(ctx).value();
  if (tls_ctx_->own_name() != host_name_)
    return Status(Code::kInvalidArgument, "tls_cert is for '" + tls_ctx_->own_name() + "', but host_name is '" +
                                              host_name_ + "'");
  auto loc = fabric::StaticLocator::Load(config.locator);
  if (!loc.ok()) return loc.status();
  locator_ = std::move(loc).value();

  epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  timer_.reset(timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (!epoll_ || !timer_) return Status::FromErrno("peering epoll/timerfd");
  Watch(timer_.get(), false);

  sockaddr_storage ss;
  unsigned len;
  VS_RETURN_IF_ERROR(ParseHostPort(config.peer_listen, &ss, &len));
  listener_.reset(socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  int one = 1;
  if (!listener_ || setsockopt(listener_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
      bind(listener_.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0 || listen(listener_.get(), 64) != 0)
    return Status::FromErrno("peer_listen " + config.peer_listen);
  Watch(listener_.get(), false);

  for (const PeerHostConfig& p : config.peers) {
    auto h = std::make_unique<Host>();
    h->id = static_cast<uint32_t>(hosts_.size() + 1);
    h->name = p.name;
    h->address = p.address;
    unsigned alen;
    VS_RETURN_IF_ERROR(ParseHostPort(p.address, &h->addr, &alen));
    h->addr_len = alen;
    h->initiator = host_name_ < p.name;
    h->state = h->initiator ? State::kBackoff : State::kIdle;
    h->retry_at_ms = MonotonicMs();
    hosts_.push_back(std::move(h));
  }
  conns_->SetRemoteHosts(this);
  VS_LOG(kInfo, "peering: host %s listening on %s, %zu peer host(s), locator with %zu entries, %s fabric, %d link(s) per peer",
         host_name_.c_str(), config.peer_listen.c_str(), hosts_.size(),
         static_cast<fabric::StaticLocator*>(locator_.get())->size(), fabric_.c_str(), links_per_peer_);
  if (rdma_)
    VS_LOG(kInfo, "peering: rdma device %s port %u GID index %u", rdma_->name().c_str(), rdma_->port(),
           rdma_->gid_index());
  ArmTimer();
  return Status::Ok();
}

void Peering::Watch(int fd, bool out) {
  epoll_event ev{};
  ev.events = EPOLLIN | (out ? EPOLLOUT : 0);
  ev.data.fd = fd;
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &ev) != 0) epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
}

void Peering::ArmTimer() {
  int64_t next = 0;
  for (auto& h : hosts_)
    if (h->state == State::kBackoff && (next == 0 || h->retry_at_ms < next)) next = h->retry_at_ms;
  for (auto& h : hosts_)
    if (h->state != State::kUp && h->state != State::kBackoff && h->state != State::kIdle && h->deadline_ms &&
        (next == 0 || h->deadline_ms < next))
      next = h->deadline_ms;
  for (auto& in : incoming_)
    if (next == 0 || in.deadline_ms < next) next = in.deadline_ms;
  itimerspec ts{};
  if (next != 0) {
    int64_t delta = std::max<int64_t>(1, next - MonotonicMs());
    ts.it_value.tv_sec = delta / 1000;
    ts.it_value.tv_nsec = (delta % 1000) * 1000000;
  }
  timerfd_settime(timer_.get(), 0, &ts, nullptr);
}

Peering::Host* Peering::ByName(const std::string& name) {
  for (auto& h : hosts_)
    if (h->name == name) return h.get();
  return nullptr;
}

// A non-blocking TCP connect to the peer's peer_listen address (null, with
// *error set, if it failed at once).
UniqueFd Peering::ConnectTo(Host& h, std::string* error) {
  UniqueFd fd(socket(h.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) {
    *error = "socket: " + std::string(strerror(errno));
    return fd;
  }
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&h.addr), h.addr_len) != 0 && errno != EINPROGRESS) {
    *error = h.address + ": " + strerror(errno);
    return UniqueFd();
  }
  Watch(fd.get(), true);
  return fd;
}

// Starts the TLS channel's TCP connect (and the setup deadline).
void Peering::StartConnect(Host& h) {
  std::string error;
  UniqueFd fd = ConnectTo(h, &error);
  if (!fd) return HostDown(h, "connect " + error);
  h.connecting = std::move(fd);
  h.state = State::kConnecting;
  h.deadline_ms = MonotonicMs() + kSetupTimeoutMs;
}

void Peering::OnTlsUp(Host& h) {
  if (rdma_) return StartRdmaLink(h);
  auto key = h.tls->ExportKey(kLinkKeyLabel);
  if (!key.ok()) return HostDown(h, key.status().message());
  h.link_key = *key;
  if (!h.initiator) {
    h.state = State::kWaitLink;  // the links arrive on the listener
    h.deadline_ms = MonotonicMs() + kSetupTimeoutMs;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    h.lanes.clear();
    h.lanes.resize(static_cast<size_t>(links_per_peer_));
  }
  for (Lane& l : h.lanes) {
    std::string error;
    l.connecting = ConnectTo(h, &error);
    if (!l.connecting) return HostDown(h, "link connect " + error);
  }
  h.state = State::kLinkConnecting;  // within the deadline the TLS connect started
}

bool Peering::AllLanes(const Host& h, bool rdma_connected) const {
  if (h.lanes.empty()) return false;
  for (const Lane& l : h.lanes)
    if (!l.link || (rdma_connected && !l.rdma_connected)) return false;
  return true;
}

bool Peering::LaneOf(Host& h, const FrameHeader& hdr, size_t* lane, std::string* why) {
  uint64_t count = hdr.aux == 0 ? 1 : hdr.aux;
  if (count > static_cast<uint64_t>(kMaxLinksPerPeer) || hdr.value >= count) {
    *why = "link " + std::to_string(hdr.value) + " of " + std::to_string(count) + " (at most " +
           std::to_string(kMaxLinksPerPeer) + " links per peer)";
    return false;
  }
  if (h.lanes.empty()) {
    if (count != static_cast<uint64_t>(links_per_peer_))
      VS_LOG(kInfo, "peer %s: runs %lu link(s) per host pair, this host's links_per_peer is %d: %lu it is",
             h.name.c_str(), static_cast<unsigned long>(count), links_per_peer_, static_cast<unsigned long>(count));
    std::lock_guard<std::mutex> lock(mu_);
    h.lanes.resize(count);
  } else if (count != h.lanes.size()) {
    *why = "link count changed from " + std::to_string(h.lanes.size()) + " to " + std::to_string(count);
    return false;
  }
  *lane = hdr.value;
  return true;
}

void Peering::OnLinkConnected(Host& h, size_t lane) {
  Lane& l = h.lanes[lane];
  int fd = l.connecting.get();
  Status st = fabric::ConfigureLinkSocket(fd);
  if (!st.ok()) return HostDown(h, st.message());
  epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  auto link = fabric::MakeStreamLink(fabric::MakeFdTransport(l.connecting.release()));
  FrameHeader hello;
  hello.type = FrameType::kLinkHello;
  hello.len = 32;
  hello.value = lane;
  hello.aux = static_cast<uint32_t>(h.lanes.size());
  iovec v{h.link_key.data(), 32};
  if (!link->Send(hello, {&v, 1}) || !link->Flush().ok()) return HostDown(h, "link hello not sent");
  Watch(link->wake_fd(), false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    l.link = std::move(link);
  }
  if (AllLanes(h, false)) h.state = State::kWaitReady;  // the acceptor confirms on the TLS channel
}

// rdma fabric: the initiator creates its QPs and offers their setups at
// once; the acceptor creates each QP when the initiator's setup for it
// arrives (OnRdmaSetup).
void Peering::StartRdmaLink(Host& h) {
  h.deadline_ms = MonotonicMs() + kSetupTimeoutMs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    h.lanes.clear();
  }
  h.rdma_cq.reset();
  if (!h.initiator) {
    h.state = State::kWaitLink;
    // The initiator's setup may have come with the end of the handshake and
    // already sit in the TLS buffer, where no epoll event announces it.
    (void)ServiceUp(h);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    h.lanes.resize(static_cast<size_t>(links_per_peer_));
  }
  for (size_t i = 0; i < h.lanes.size(); ++i) {
    Status st = CreateRdmaLane(h, i);
    if (!st.ok()) return HostDown(h, st.message());
    if (!SendRdmaSetup(h, i)) return;
  }
  h.state = State::kWaitReady;
}

// The QP of lane i, on the session's completion queue (made for all its
// lanes with the first one).
Status Peering::CreateRdmaLane(Host& h, size_t i) {
  if (!h.rdma_cq) {
    auto cq = fabric::RdmaCompletionQueue::Create(rdma_, static_cast<int>(h.lanes.size()));
    if (!cq.ok()) return Status(cq.status().code(), "rdma completion queue: " + cq.status().message());
    h.rdma_cq = std::move(cq).value();
  }
  auto link = fabric::RdmaLink::Create(rdma_, {}, h.rdma_cq);
  if (!link.ok()) return Status(link.status().code(), "rdma link: " + link.status().message());
  std::lock_guard<std::mutex> lock(mu_);
  h.lanes[i].rdma = link->get();
  h.lanes[i].link = std::move(link).value();
  return Status::Ok();
}

bool Peering::SendRdmaSetup(Host& h, size_t lane) {
  auto info = h.lanes[lane].rdma->LocalInfo().Encode();
  FrameHeader setup;
  setup.type = FrameType::kRdmaSetup;
  setup.len = static_cast<uint32_t>(info.size());
  setup.value = lane;
  setup.aux = static_cast<uint32_t>(h.lanes.size());
  Status st = h.tls->Send(Message(setup, info));
  if (!st.ok()) {
    HostDown(h, "control channel: " + st.message());
    return false;
  }
  return true;
}

// The peer's RDMA_SETUP for one lane (only ever on the TLS channel):
// connects our QP to its. The acceptor creates that QP, answers with its
// own setup, and once every lane is connected sends LINK_READY and is up;
// the initiator is up at LINK_READY. False if the host went down.
bool Peering::OnRdmaSetup(Host& h, const FrameHeader& hdr, std::span<const uint8_t> payload) {
  bool expected = h.initiator ? h.state == State::kWaitReady : h.state == State::kWaitLink;
  size_t i = 0;
  std::string why;
  if (!expected || !LaneOf(h, hdr, &i, &why) || (h.initiator && !h.lanes[i].rdma) || h.lanes[i].rdma_connected) {
    HostDown(h, "unexpected RDMA_SETUP on the control channel" + (why.empty() ? "" : ": " + why));
    return false;
  }
  auto info = fabric::RdmaEndpointInfo::Decode(payload);
  if (!info.ok()) {
    HostDown(h, "bad RDMA_SETUP: " + info.status().message());
    return false;
  }
  Lane& l = h.lanes[i];
  if (!l.rdma) {
    Status created = CreateRdmaLane(h, i);
    if (!created.ok()) {
      HostDown(h, created.message());
      return false;
    }
  }
  Status st = l.rdma->Connect(*info);
  if (!st.ok()) {
    HostDown(h, "rdma link: " + st.message());
    return false;
  }
  l.rdma_connected = true;
  Watch(l.link->wake_fd(), false);
  if (h.initiator) return true;
  if (!SendRdmaSetup(h, i)) return false;
  if (!AllLanes(h, true)) return true;
  FrameHeader ready;
  ready.type = FrameType::kLinkReady;
  st = h.tls->Send(Message(ready, {}));
  if (!st.ok()) {
    HostDown(h, "control channel: " + st.message());
    return false;
  }
  HostUp(h);
  return true;
}

void Peering::HostUp(Host& h) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    h.state = State::kUp;
    h.last_error.clear();
  }
  h.backoff_ms = 0;
  h.deadline_ms = 0;
  h.connects.fetch_add(1, std::memory_order_relaxed);
  VS_LOG(kInfo, "peer %s (%s): up with %zu link(s)", h.name.c_str(), h.address.c_str(), h.lanes.size());
  conns_->OnHostUp(h.id);
}

void Peering::HostDown(Host& h, const std::string& why) {
  bool was_up = h.state == State::kUp;
  if (was_up)
    VS_LOG(kWarn, "peer %s (%s): link lost: %s", h.name.c_str(), h.address.c_str(), why.c_str());
  else
    VS_LOG(kInfo, "peer %s (%s): link setup failed: %s", h.name.c_str(), h.address.c_str(), why.c_str());
  if (h.tls) {
    epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, h.tls->fd(), nullptr);
    h.tls->Close();
  }
  if (h.connecting) epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, h.connecting.get(), nullptr);
  std::vector<Lane> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Lane& l : h.lanes) {
      if (l.connecting) epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, l.connecting.get(), nullptr);
      if (l.link) {
        epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, l.link->wake_fd(), nullptr);
        h.old.Add(l.link->stats());
      }
    }
    old.swap(h.lanes);
    h.rdma_cq.reset();  // goes with the last of the old lanes
    h.last_error = why;
    h.state = h.initiator ? State::kBackoff : State::kIdle;
  }
  h.tls.reset();
  h.connecting.reset();
  if (was_up) h.losses.fetch_add(1, std::memory_order_relaxed);
  // Connections on it leave the fabric (before the link objects go away).
  conns_->OnHostDown(h.id);
  old.clear();
  if (h.initiator) {
    h.backoff_ms = h.backoff_ms == 0 ? kBackoffMinMs : std::min(kBackoffMaxMs, h.backoff_ms * 2);
    static thread_local std::minstd_rand rng(static_cast<unsigned>(MonotonicNs()));
    h.retry_at_ms = MonotonicMs() + h.backoff_ms / 2 + static_cast<int64_t>(rng() % (h.backoff_ms / 2 + 1));
  }
  h.deadline_ms = 0;
}

void Peering::Step(Host& h) {
  int64_t now = MonotonicMs();
  if (h.deadline_ms != 0 && now > h.deadline_ms && h.state != State::kUp) {
    HostDown(h, std::string("timed out in ") + ToString(h.state));
    return;
  }
  switch (h.state) {
    case State::kIdle:
    case State::kUp:
      return;
    case State::kBackoff:
      if (now >= h.retry_at_ms) StartConnect(h);
      return;
    case State::kConnecting: {
      pollfd p{h.connecting.get(), POLLOUT, 0};
      if (poll(&p, 1, 0) <= 0) return;
      if (int err = SocketError(h.connecting.get()))
        return HostDown(h, "connect " + h.address + ": " + strerror(err));
      h.tls = peering::TlsChannel::Client(*tls_ctx_, std::move(h.connecting), h.name);
      h.state = State::kHandshake;
      [[fallthrough]];
    }
    case State::kHandshake: {
      auto p = h.tls->Handshake();
      if (p == peering::TlsChannel::Progress::kFailed) {
        counters_.refused_tls.fetch_add(1, std::memory_order_relaxed);
        return HostDown(h, "TLS: " + h.tls->error().message());
      }
      Watch(h.tls->fd(), p == peering::TlsChannel::Progress::kWantWrite);
      if (p == peering::TlsChannel::Progress::kDone) OnTlsUp(h);
      return;
    }
    case State::kLinkConnecting: {
      for (size_t i = 0; i < h.lanes.size(); ++i) {
        Lane& l = h.lanes[i];
        if (!l.connecting) continue;
        pollfd p{l.connecting.get(), POLLOUT, 0};
        if (poll(&p, 1, 0) <= 0) continue;
        if (int err = SocketError(l.connecting.get()))
          return HostDown(h, "link connect " + h.address + ": " + strerror(err));
        OnLinkConnected(h, i);
        if (h.state != State::kLinkConnecting) return;  // all connected, or down
      }
      return;
    }
    case State::kWaitLink:
    case State::kWaitReady:
      (void)ServiceUp(h);  // reads the TLS channel (LINK_READY, or a refusal)
      return;
  }
}

// Reads control messages and link frames of a host whose TLS channel is
// open; sends what is owed. True if anything arrived.
bool Peering::ServiceUp(Host& h) {
  bool worked = false;
  std::vector<std::vector<uint8_t>> msgs;
  Status st = h.tls->Receive(&msgs);
  for (const auto& m : msgs) {
    worked = true;
    if (m.size() < proto::kFrameHeaderSize) {
      HostDown(h, "short control message");
      return true;
    }
    auto hdr = proto::DecodeFrameHeader(std::span<const uint8_t, proto::kFrameHeaderSize>(m.data(), proto::kFrameHeaderSize));
    if (!hdr.ok() || hdr->len != m.size() - proto::kFrameHeaderSize) {
      HostDown(h, "bad control message: " + (hdr.ok() ? std::string("length mismatch") : hdr.status().message()));
      return true;
    }
    std::span<const uint8_t> payload(m.data() + proto::kFrameHeaderSize, hdr->len);
    switch (hdr->type) {
      case FrameType::kLinkReady:
        if (h.state == State::kWaitReady) {
          if (!AllLanes(h, rdma_ != nullptr)) {
            HostDown(h, rdma_ ? "LINK_READY before the peer's RDMA_SETUP for every link"
                              : "LINK_READY before every link was connected");
            return true;
          }
          HostUp(h);
        }
        break;
      case FrameType::kRdmaSetup:
        if (!OnRdmaSetup(h, *hdr, payload)) return true;
        break;
      case FrameType::kLinkClose:
        HostDown(h, "peer closed the link");
        return true;
      case FrameType::kKeepalive:
        break;
      case FrameType::kPairRequest:
      case FrameType::kPairAccept:
      case FrameType::kPairReject:
      case FrameType::kPairCancel:
        if (h.state == State::kUp) conns_->OnPairingFrame(h.id, *hdr, payload);
        break;
      default:
        HostDown(h, std::string("unexpected ") + proto::ToString(hdr->type) + " on the control channel");
        return true;
    }
  }
  if (!st.ok()) {
    HostDown(h, "control channel: " + st.message());
    return true;
  }
  if (h.state != State::kUp) return worked;
  for (size_t i = 0; i < h.lanes.size(); ++i) {
    Lane& l = h.lanes[i];
    uint64_t before = l.link->stats().frames_in.load(std::memory_order_relaxed);
    Status ls = l.link->Poll(conns_->LinkSink(h.id, static_cast<uint32_t>(i)), kMaxFramesPerPoll);
    if (!ls.ok()) {
      HostDown(h, "data link " + std::to_string(i) + ": " + ls.message());
      return true;
    }
    uint64_t got = l.link->stats().frames_in.load(std::memory_order_relaxed) - before;
    // A full batch may leave frames read but not yet delivered: they make
    // no new epoll event, so the next Poll() must come back for them.
    l.link_more = got >= kMaxFramesPerPoll;
    worked |= got != 0;
  }
  return worked;
}

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
      auto h = proto::DecodeFrameHeader(std::span<const uint8_t, proto::kFrameHeaderSize>(buf, proto::kFrameHeaderSize));
      if (!h.ok() || h->type != FrameType::kLinkHello) return refuse(counters_.refused_link, "neither TLS nor a link hello");
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
  if (p == peering::TlsChannel::Progress::kFailed) return refuse(counters_.refused_tls, "TLS: " + in.tls->error().message());
  Watch(in.tls->fd(), p == peering::TlsChannel::Progress::kWantWrite);
  if (p != peering::TlsChannel::Progress::kDone) return;
  Host* h = ByName(in.tls->peer_name());
  if (h == nullptr)
    return refuse(counters_.refused_name, "authenticated as '" + in.tls->peer_name() + "', which is not a configured peer");
  if (h->initiator)
    return refuse(counters_.refused_name, "'" + h->name + "' connected, but this host is the one that connects to it");
  if (h->state != State::kIdle) HostDown(*h, "peer reconnected");
  h->tls = std::move(in.tls);
  h->state = State::kHandshake;
  OnTlsUp(*h);
  *done = true;
}

bool Peering::Poll() {
  if (hosts_.empty()) return false;
  epoll_event evs[64];
  int n = epoll_wait(epoll_.get(), evs, 64, 0);
  bool any_out = false;
  for (auto& h : hosts_)
    if (h->state == State::kUp)
      for (const Lane& l : h->lanes) any_out |= l.link->WantsWritable() || l.link_more;
  bool worked = false;
  if (n > 0 || any_out || !incoming_.empty()) {
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.fd == listener_.get()) AcceptAll();
      if (evs[i].data.fd == timer_.get()) {
        uint64_t v;
        (void)!read(timer_.get(), &v, sizeof(v));
      }
    }
    for (size_t i = 0; i < incoming_.size();) {
      bool done;
      StepIncoming(incoming_[i], &done);
      if (done) {
        incoming_.erase(incoming_.begin() + static_cast<ptrdiff_t>(i));
        worked = true;
      } else {
        ++i;
      }
    }
    for (auto& h : hosts_) {
      if (h->state == State::kUp) worked |= ServiceUp(*h);
      else Step(*h);
    }
  }
  worked |= conns_->PumpLinks();
  for (auto& h : hosts_) {
    if (h->state != State::kUp) continue;
    bool down = false;
    for (size_t i = 0; i < h->lanes.size() && !down; ++i) {
      fabric::Link& link = *h->lanes[i].link;
      uint64_t w = link.stats().write_calls.load(std::memory_order_relaxed);
      Status st = link.Flush();
      if (!st.ok()) {
        HostDown(*h, "data link " + std::to_string(i) + ": " + st.message());
        down = true;
        break;
      }
      worked |= link.stats().write_calls.load(std::memory_order_relaxed) != w;
      Watch(link.wake_fd(), link.WantsWritable());
    }
    if (down) continue;
    if (h->tls) {
      Status st = h->tls->Flush();
      if (!st.ok()) {
        HostDown(*h, "control channel: " + st.message());
        continue;
      }
      Watch(h->tls->fd(), h->tls->WantsWrite());
    }
  }
  if (n > 0) ArmTimer();
  return worked;
}

uint32_t Peering::Locate(uint32_t tenant, const proto::Endpoint& addr) {
  std::string name = locator_->Find(tenant, addr);
  if (name.empty() || name == host_name_) return 0;
  Host* h = ByName(name);
  return h != nullptr && h->state == State::kUp ? h->id : 0;
}

bool Peering::Runs(uint32_t host, uint32_t tenant, const proto::Endpoint& addr) {
  if (host == 0 || host > hosts_.size()) return false;
  return locator_->Find(tenant, addr) == hosts_[host - 1]->name;
}

bool Peering::SendPairing(uint32_t host, const FrameHeader& h, std::span<const uint8_t> payload) {
  if (host == 0 || host > hosts_.size()) return false;
  Host& p = *hosts_[host - 1];
  if (p.state != State::kUp || !p.tls) return false;
  Status st = p.tls->Send(Message(h, payload));
  if (!st.ok()) {
    VS_LOG(kWarn, "peer %s: pairing message not sent: %s", p.name.c_str(), st.message().c_str());
    return false;
  }
  return true;
}

fabric::Link* Peering::LinkTo(uint32_t host, uint64_t conn) {
  if (host == 0 || host > hosts_.size()) return nullptr;
  Host& p = *hosts_[host - 1];
  if (p.state != State::kUp || p.lanes.empty()) return nullptr;
  // Handles are handed out in sequence: consecutive connections spread
  // round-robin over the links.
  return p.lanes[conn % p.lanes.size()].link.get();
}

Status Peering::RegisterRemoteWritable(void* addr, size_t len, uint32_t* rkey) {
  if (!rdma_) return Status(Code::kFailedPrecondition, "fabric " + fabric_ + " has no one-sided writes");
  uint32_t lkey;
  return rdma_->RegisterMemory(addr, len, fabric::RdmaDevice::Use::kRemoteWrite, &lkey, rkey);
}

void Peering::UnregisterRemoteWritable(void* addr) {
  if (rdma_) (void)rdma_->UnregisterMemory(addr);
}

Status Peering::RegisterSendable(void* addr, size_t len) {
  if (!rdma_) return Status(Code::kFailedPrecondition, "fabric " + fabric_ + " reads no memory in place");
  uint32_t lkey, rkey;
  return rdma_->RegisterMemory(addr, len, fabric::RdmaDevice::Use::kLocalRead, &lkey, &rkey);
}

uint64_t Peering::WithdrawSendable(void* addr) { return rdma_ ? rdma_->WithdrawMemory(addr) : 0; }

void Peering::ReleaseSendable(uint64_t token) {
  if (rdma_) rdma_->ReleaseWithdrawn(token);
}

std::vector<PeerSnapshot> Peering::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<PeerSnapshot> out;
  for (const auto& h : hosts_) {
    LinkTotals t = h->old;
    std::vector<uint64_t> per_link;
    for (const Lane& l : h->lanes)
      if (l.link) {
        t.Add(l.link->stats());
        if (h->state == State::kUp) per_link.push_back(l.link->stats().frames_out.load());
      }
    PeerSnapshot s{h->name, h->address, fabric_, ToString(h->state), h->initiator, h->connects.load(), h->losses.load(),
                   0, h->last_error, t.frames_out, t.frames_in, t.bytes_out, t.bytes_in, t.writes, t.reads, t.busy,
                   t.copied, t.inplace, std::move(per_link)};
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace vsocket::backend
