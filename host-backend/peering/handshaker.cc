#include "host-backend/peering/handshaker.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/clock.h"
#include "base/log.h"
#include "host-backend/peering/peers.h"

namespace vsocket::backend {

namespace {

// "address:port" and the address alone (the per-source key).
void Describe(const sockaddr_storage& ss, std::string* from, std::string* source) {
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
  *source = buf;
  *from = *source + ":" + std::to_string(port);
}

void Signal(int efd) {
  uint64_t one = 1;
  (void)!write(efd, &one, sizeof(one));
}

}  // namespace

Handshaker::~Handshaker() { Stop(); }

Status Handshaker::Start(int listen_fd, std::shared_ptr<peering::TlsContext> ctx, PeeringCounters* counters,
                         size_t link_hello_bytes, Limits limits) {
  listen_fd_ = listen_fd;
  ctx_ = std::move(ctx);
  counters_ = counters;
  hello_bytes_ = link_hello_bytes;
  limits_ = limits;
  epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  ready_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  wake_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!epoll_ || !ready_ || !wake_) return Status::FromErrno("peering handshaker epoll/eventfd");
  WatchFd(epoll_.get(), listen_fd_, false);
  WatchFd(epoll_.get(), wake_.get(), false);
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void Handshaker::Stop() {
  if (!thread_.joinable()) return;
  stop_.store(true, std::memory_order_release);
  Signal(wake_.get());
  thread_.join();
}

std::vector<Handshaker::Ready> Handshaker::Take() {
  uint64_t v;
  (void)!read(ready_.get(), &v, sizeof(v));
  MutexLock lock(mu_);
  return std::move(ready_list_);
}

void Handshaker::SetContext(std::shared_ptr<peering::TlsContext> ctx) {
  {
    MutexLock lock(mu_);
    next_ctx_ = std::move(ctx);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  Signal(wake_.get());
}

void WatchFd(int epoll_fd, int fd, bool out) {
  epoll_event ev{};
  ev.events = EPOLLIN | (out ? EPOLLOUT : 0);
  ev.data.fd = fd;
  if (epoll_ctl(epoll_fd, EPOLL_CTL_MOD, fd, &ev) != 0) epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev);
}

void Handshaker::Run() {
  pthread_setname_np(pthread_self(), "vsocketd-tls");
  while (!stop_.load(std::memory_order_acquire)) {
    int timeout = -1;
    int64_t now = MonotonicMs();
    for (const Pending& p : pending_) {
      int left = static_cast<int>(std::max<int64_t>(0, p.deadline_ms - now));
      timeout = timeout < 0 ? left : std::min(timeout, left);
    }
    epoll_event evs[64];
    int n = epoll_wait(epoll_.get(), evs, 64, timeout);
    if (n < 0 && errno != EINTR) {
      VS_LOG(kError, "peering: handshaker epoll_wait: %s", strerror(errno));
      return;
    }
    bool accept = false;
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.fd == listen_fd_) accept = true;
      if (evs[i].data.fd == wake_.get()) {
        uint64_t v;
        (void)!read(wake_.get(), &v, sizeof(v));
      }
    }
    std::shared_ptr<peering::TlsContext> next;
    uint64_t gen = 0;
    {
      MutexLock lock(mu_);
      if (next_ctx_) {
        next = std::move(next_ctx_);
        gen = generation_.load(std::memory_order_acquire);
      }
    }
    if (next) {
      ctx_ = std::move(next);
      ctx_generation_ = gen;
      // Verified (or being verified) against the old lists: dropped; the
      // peer dials again and meets the new ones.
      std::erase_if(pending_, [&](Pending& p) {
        if (!p.tls) return false;
        Forget(p);
        return true;
      });
    }
    if (accept) AcceptAll();
    std::erase_if(pending_, [&](Pending& p) {
      Outcome o = Step(p);
      if (o == Outcome::kWaiting) return false;
      Forget(p);  // (unwatched while p still holds its socket)
      if (o == Outcome::kReady) HandOver(p);
      return true;
    });
  }
}

void Handshaker::AcceptAll() {
  for (;;) {
    sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    Pending p{UniqueFd(fd), nullptr, "", "", MonotonicMs() + limits_.timeout_ms, ctx_generation_};
    Describe(ss, &p.from, &p.source);
    size_t& mine = per_source_[p.source];
    if (pending_.size() >= limits_.max_pending || mine >= limits_.per_source) {
      // A flood: shed what comes beyond the limits (the address's own
      // earlier connections, and every other address's, keep their slots).
      if (mine == 0) per_source_.erase(p.source);
      counters_->refused_busy.fetch_add(1, std::memory_order_relaxed);
      VS_LOG(kWarn, "peering: refused connection from %s: %zu half-open from that address, %zu in all",
             p.from.c_str(), mine, pending_.size());
      continue;
    }
    ++mine;
    WatchFd(epoll_.get(), fd, false);
    pending_.push_back(std::move(p));
  }
}

void Handshaker::Forget(Pending& p) {
  int fd = p.tls ? p.tls->fd() : p.fd.get();
  if (fd >= 0) epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  auto it = per_source_.find(p.source);
  if (it != per_source_.end() && --it->second == 0) per_source_.erase(it);
}

Handshaker::Outcome Handshaker::Refuse(Pending& p, std::atomic<uint64_t>& counter, const std::string& why) {
  counter.fetch_add(1, std::memory_order_relaxed);
  VS_LOG(kWarn, "peering: refused connection from %s: %s", p.from.c_str(), why.c_str());
  return Outcome::kRefused;
}

void Handshaker::HandOver(Pending& p) {
  Ready r{std::move(p.tls), std::move(p.fd), p.from, p.generation};
  {
    MutexLock lock(mu_);
    ready_list_.push_back(std::move(r));
  }
  Signal(ready_.get());
}

Handshaker::Outcome Handshaker::Step(Pending& p) {
  if (MonotonicMs() > p.deadline_ms) return Refuse(p, counters_->refused_tls, "setup timed out");
  if (!p.tls) {
    uint8_t first;
    ssize_t n = recv(p.fd.get(), &first, 1, MSG_PEEK);
    if (n == 0) return Refuse(p, counters_->refused_tls, "closed before saying anything");
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Outcome::kWaiting;
      return Refuse(p, counters_->refused_tls, strerror(errno));
    }
    if (first != 0x16) {
      // A data link: its LINK_HELLO whole (the worker reads and checks it).
      std::vector<uint8_t> buf(hello_bytes_);
      n = recv(p.fd.get(), buf.data(), buf.size(), MSG_PEEK);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Outcome::kWaiting;
      if (n <= 0) return Refuse(p, counters_->refused_link, "closed during link hello");
      return static_cast<size_t>(n) < buf.size() ? Outcome::kWaiting : Outcome::kReady;
    }
    p.tls = peering::TlsChannel::Server(*ctx_, std::move(p.fd));
    p.generation = ctx_generation_;
  }
  auto progress = p.tls->Handshake();
  if (progress == peering::TlsChannel::Progress::kFailed)
    return Refuse(p, counters_->refused_tls, "TLS: " + p.tls->error().message());
  WatchFd(epoll_.get(), p.tls->fd(), progress == peering::TlsChannel::Progress::kWantWrite);
  return progress == peering::TlsChannel::Progress::kDone ? Outcome::kReady : Outcome::kWaiting;
}

}  // namespace vsocket::backend
