#include "host-backend/peering/peers.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "base/clock.h"
#include "base/log.h"
#include "host-backend/fabric/rdma_link.h"
#include "host-backend/fabric/tcp_fabric.h"
#include "host-backend/peering/control_message.h"

namespace vsocket::backend {

using proto::FrameHeader;
using proto::FrameType;

namespace {

constexpr int kBackoffMinMs = 200;
constexpr int kBackoffMaxMs = 10000;
constexpr const char* kLinkKeyLabel = "vsocket fabric link v1";

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
    case State::kRetired: return "retired";
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
  StopDirectory();
  handshaker_.Stop();
  for (auto& h : hosts_)
    if (h->tls) h->tls->Close();
}

Status Peering::Start(const DaemonConfig& config) {
  if (config.peers.empty() && !IsEtcdLocator(config.locator)) return Status::Ok();
  enabled_ = true;
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
      return Status(Code::kFailedPrecondition, "fabric = rdma, but RDMA device '" +
                                                   (o.name.empty() ? std::string("(first)") : o.name) +
                                                   "' cannot be used: " + dev.status().message() +
                                                   " (devices present: " + (present.empty() ? "none" : present) + ")");
    }
    rdma_ = std::move(dev).value();
  }
  tls_config_ = {config.tls_cert, config.tls_key, config.tls_ca, config.tls_crl};
  crl_id_ = CrlFileId(config.tls_crl);
  auto ctx = peering::TlsContext::Create(tls_config_);
  if (!ctx.ok()) return ctx.status();
  tls_ctx_ = std::move(ctx).value();
  if (!config.tls_crl.empty()) {
    VS_LOG(kInfo, "peering: tls_crl %s: %zu certificate(s) revoked; re-read within %d s of a change",
           config.tls_crl.c_str(), tls_ctx_->revoked(), kCrlCheckMs / 1000);
    if (!tls_ctx_->crl_warning().empty()) VS_LOG(kWarn, "peering: %s", tls_ctx_->crl_warning().c_str());
    crl_check_at_ms_ = MonotonicMs() + kCrlCheckMs;
  }
  if (tls_ctx_->own_name() != host_name_)
    return Status(Code::kInvalidArgument,
                  "tls_cert is for '" + tls_ctx_->own_name() + "', but host_name is '" + host_name_ + "'");
  size_t locations = 0;
  if (!IsEtcdLocator(config.locator)) {
    auto loc = fabric::StaticLocator::Load(config.locator);
    if (!loc.ok()) return loc.status();
    locations = loc.value()->size();
    MutexLock lock(locator_mu_);
    locator_ = std::move(loc).value();
  }
  locator_path_ = config.locator;

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
      bind(listener_.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0 ||
      // The kernel's cap (net.core.somaxconn), not 64: a flood of half-open
      // connections is then accepted and shed by the handshaker's per-address
      // limit, instead of filling the queue so a real peer's SYN is dropped
      // and its connect waits for the retransmit.
      listen(listener_.get(), SOMAXCONN) != 0)
    return Status::FromErrno("peer_listen " + config.peer_listen);
  VS_RETURN_IF_ERROR(
      handshaker_.Start(listener_.get(), tls_ctx_, &counters_, proto::kFrameHeaderSize + 32, Handshaker::Limits{}));
  Watch(handshaker_.ready_fd(), false);

  for (const PeerHostConfig& p : config.peers) VS_RETURN_IF_ERROR(AddHost(p.name, p.address, false));
  if (IsEtcdLocator(config.locator)) {
    VS_RETURN_IF_ERROR(StartDirectory(config));
    locations = etcd_locator_->Health().entries;
    FollowDirectoryHosts();
  }
  conns_->SetRemoteHosts(this);
  VS_LOG(kInfo,
         "peering: host %s listening on %s, %zu peer host(s), locator with %zu entries, %s fabric, %d link(s) per peer",
         host_name_.c_str(), config.peer_listen.c_str(), hosts_.size(),
         locations, fabric_.c_str(), links_per_peer_);
  if (rdma_)
    VS_LOG(kInfo, "peering: rdma device %s port %u GID index %u", rdma_->name().c_str(), rdma_->port(),
           rdma_->gid_index());
  ArmTimer();
  return Status::Ok();
}

void Peering::Watch(int fd, bool out) { WatchFd(epoll_.get(), fd, out); }

void Peering::ArmTimer() {
  int64_t next = crl_check_at_ms_;  // 0 without tls_crl
  for (auto& h : hosts_)
    if (h->state == State::kBackoff && (next == 0 || h->retry_at_ms < next)) next = h->retry_at_ms;
  for (auto& h : hosts_)
    if (h->state != State::kUp && h->state != State::kBackoff && h->state != State::kIdle && h->deadline_ms &&
        (next == 0 || h->deadline_ms < next))
      next = h->deadline_ms;
  itimerspec ts{};
  if (next != 0) {
    int64_t delta = std::max<int64_t>(1, next - MonotonicMs());
    ts.it_value.tv_sec = delta / 1000;
    ts.it_value.tv_nsec = (delta % 1000) * 1000000;
  }
  timerfd_settime(timer_.get(), 0, &ts, nullptr);
}

Peering::FileId Peering::CrlFileId(const std::string& path) {
  struct stat st{};
  if (path.empty() || stat(path.c_str(), &st) != 0) return FileId{};
  return FileId{st.st_dev, st.st_ino, st.st_size, int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec};
}

void Peering::CheckCrl() {
  crl_check_at_ms_ = MonotonicMs() + kCrlCheckMs;
  ArmTimer();
  FileId id = CrlFileId(tls_config_.crl_file);
  if (id == crl_id_) return;
  crl_id_ = id;
  auto ctx = peering::TlsContext::Create(tls_config_);
  if (!ctx.ok()) {
    VS_LOG(kWarn, "peering: tls_crl %s changed but cannot be used (%s): the previous lists stay in force",
           tls_config_.crl_file.c_str(), ctx.status().message().c_str());
    return;
  }
  // Channels keep their own reference to the old context's SSL_CTX.
  tls_ctx_ = std::move(ctx).value();
  VS_LOG(kInfo, "peering: tls_crl %s re-read: %zu certificate(s) revoked", tls_config_.crl_file.c_str(),
         tls_ctx_->revoked());
  if (!tls_ctx_->crl_warning().empty()) VS_LOG(kWarn, "peering: %s", tls_ctx_->crl_warning().c_str());
  // Handshakes under way were verified against the old lists: the peer
  // dials again (or is dialled again) and meets the new ones.
  handshaker_.SetContext(tls_ctx_);
  for (auto& h : hosts_) {
    if (!h->tls) continue;
    if (h->state == State::kHandshake) {
      HostDown(*h, "tls_crl changed during the handshake");
      continue;
    }
    Status st = h->tls->Reverify(*tls_ctx_);
    if (st.ok() || st.code() == Code::kFailedPrecondition) continue;
    counters_.refused_revoked.fetch_add(1, std::memory_order_relaxed);
    HostDown(*h, "its certificate is no longer accepted: " + st.message());
  }
}

Peering::Host* Peering::ByName(const std::string& name) {
  for (auto& h : hosts_)
    if (h->name == name) return h.get();
  return nullptr;
}

Status Peering::AddHost(const std::string& name, const std::string& address, bool from_directory) {
  auto h = std::make_unique<Host>();
  h->id = static_cast<uint32_t>(hosts_.size() + 1);
  h->name = name;
  h->address = address;
  unsigned alen;
  VS_RETURN_IF_ERROR(ParseHostPort(address, &h->addr, &alen));
  h->addr_len = alen;
  h->initiator = host_name_ < name;
  h->from_directory = from_directory;
  h->state = h->initiator ? State::kBackoff : State::kIdle;
  h->retry_at_ms = MonotonicMs();
  if (rdma_) {
    auto pd = rdma_->Domain();
    if (!pd.ok()) return Status(pd.status().code(), "peer " + name + ": " + pd.status().message());
    h->rdma = std::move(pd).value();
  }
  MutexLock lock(hosts_mu_);
  hosts_.push_back(std::move(h));
  return Status::Ok();
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
  FollowAddress(h);  // (a directory host that moved its peer_listen while linked)
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
    MutexLock lock(h.mu);
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
    MutexLock lock(h.mu);
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
    MutexLock lock(h.mu);
    l.link = std::move(link);
  }
  if (AllLanes(h, false)) h.state = State::kWaitReady;  // the acceptor confirms on the TLS channel
}

void Peering::HostUp(Host& h) {
  {
    MutexLock lock(h.mu);
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
  if (was_up) VS_LOG(kWarn, "peer %s (%s): link lost: %s", h.name.c_str(), h.address.c_str(), why.c_str());
  else VS_LOG(kInfo, "peer %s (%s): link setup failed: %s", h.name.c_str(), h.address.c_str(), why.c_str());
  if (h.tls) {
    epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, h.tls->fd(), nullptr);
    h.tls->Close();
  }
  if (h.connecting) epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, h.connecting.get(), nullptr);
  std::vector<Lane> old;
  {
    MutexLock lock(h.mu);
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
    h.state = !h.listed ? State::kRetired : h.initiator ? State::kBackoff : State::kIdle;
  }
  h.tls.reset();
  h.connecting.reset();
  if (was_up) h.losses.fetch_add(1, std::memory_order_relaxed);
  // Connections on it leave the fabric (before the link objects go away).
  conns_->OnHostDown(h.id);
  old.clear();
  if (h.initiator && h.listed) {
    h.backoff_ms = h.backoff_ms == 0 ? kBackoffMinMs : std::min(kBackoffMaxMs, h.backoff_ms * 2);
    static thread_local std::minstd_rand rng(static_cast<unsigned>(MonotonicNs()));
    h.retry_at_ms = MonotonicMs() + h.backoff_ms / 2 + static_cast<int64_t>(rng() % (h.backoff_ms / 2 + 1));
  }
  h.deadline_ms = 0;
  // The retry must be on the timer now: a loss found by a flush in a pass
  // without epoll events (Poll re-arms only after events), with the peer's
  // sockets gone from the set, would otherwise wait for an event that never
  // comes (seen: hostB restarted, hostA never reconnected).
  ArmTimer();
}

void Peering::Step(Host& h) {
  int64_t now = MonotonicMs();
  if (h.deadline_ms != 0 && now > h.deadline_ms && h.state != State::kUp) {
    HostDown(h, std::string("timed out in ") + ToString(h.state));
    return;
  }
  switch (h.state) {
    case State::kIdle:
    case State::kRetired:
    case State::kUp: return;
    case State::kBackoff:
      if (now >= h.retry_at_ms) StartConnect(h);
      return;
    case State::kConnecting: {
      pollfd p{h.connecting.get(), POLLOUT, 0};
      if (poll(&p, 1, 0) <= 0) return;
      if (int err = SocketError(h.connecting.get())) return HostDown(h, "connect " + h.address + ": " + strerror(err));
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
    auto hdr =
        proto::DecodeFrameHeader(std::span<const uint8_t, proto::kFrameHeaderSize>(m.data(), proto::kFrameHeaderSize));
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
      case FrameType::kLinkClose: HostDown(h, "peer closed the link"); return true;
      case FrameType::kKeepalive: break;
      case FrameType::kPairRequest:
      case FrameType::kPairAccept:
      case FrameType::kPairReject:
      case FrameType::kPairCancel:
      case FrameType::kPairDecline:
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

bool Peering::Poll() {
  if (!enabled_) return false;
  epoll_event evs[64];
  int n = epoll_wait(epoll_.get(), evs, 64, 0);
  bool any_out = false;
  for (auto& h : hosts_)
    if (h->state == State::kUp)
      for (const Lane& l : h->lanes) any_out |= l.link->WantsWritable() || l.link_more;
  bool worked = false;
  if (n > 0 || any_out) {
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.fd == handshaker_.ready_fd()) {
        TakeIncoming();
        worked = true;
      }
      if (directory_wake_ && evs[i].data.fd == directory_wake_.get()) {
        uint64_t v;
        (void)!read(directory_wake_.get(), &v, sizeof(v));  // (the relocation is the connections')
        FollowDirectoryHosts();
        worked = true;
      }
      if (evs[i].data.fd == timer_.get()) {
        uint64_t v;
        (void)!read(timer_.get(), &v, sizeof(v));
        // (ArmTimer keeps the timer at or before the next look at tls_crl.)
        if (crl_check_at_ms_ != 0 && MonotonicMs() >= crl_check_at_ms_) CheckCrl();
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

std::vector<PeerSnapshot> Peering::Snapshot() const {
  std::vector<PeerSnapshot> out;
  MutexLock hosts_lock(hosts_mu_);
  for (const auto& h : hosts_) {
    MutexLock lock(h->mu);
    LinkTotals t = h->old;
    std::vector<uint64_t> per_link;
    for (const Lane& l : h->lanes)
      if (l.link) {
        t.Add(l.link->stats());
        if (h->state == State::kUp) per_link.push_back(l.link->stats().frames_out.load());
      }
    PeerSnapshot s{h->name,
                   h->address,
                   fabric_,
                   ToString(h->state),
                   h->initiator,
                   h->connects.load(),
                   h->losses.load(),
                   0,
                   h->last_error,
                   t.frames_out,
                   t.frames_in,
                   t.bytes_out,
                   t.bytes_in,
                   t.writes,
                   t.reads,
                   t.busy,
                   t.copied,
                   t.inplace,
                   std::move(per_link)};
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace vsocket::backend
