// netload server: one epoll loop over every accepted connection. Echoes
// what it reads (the connect-time and scale runs) or, with --sink, counts
// and discards it (the message-rate runs).
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <unordered_map>
#include <vector>

#include "bench/netload_common.h"

namespace vsocket::bench {
namespace {

constexpr int kListenBacklog = 4096;
constexpr size_t kReadBytes = 64 * 1024;
// Reads per readiness event: one fast sender must not starve the others.
constexpr int kReadsPerEvent = 16;

volatile sig_atomic_t g_stop = 0;
void OnStop(int) { g_stop = 1; }

struct Peer {
  UniqueFd fd;
  std::vector<uint8_t> unsent;  // echo bytes the socket did not take yet
};

class Server {
 public:
  Server(bool echo, int epoll_fd) : echo_(echo), ep_(epoll_fd) {}

  void Accept(int listen_fd) {
    for (;;) {
      int c = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK);
      if (c < 0) return;  // EAGAIN, or out of fds: the client's deadline tells
      SetNoDelay(c);
      epoll_event ev{EPOLLIN, {.fd = c}};
      epoll_ctl(ep_, EPOLL_CTL_ADD, c, &ev);
      peers_[c].fd.reset(c);
      ++accepted_;
    }
  }

  void Serve(int fd, uint32_t events) {
    auto it = peers_.find(fd);
    if (it == peers_.end()) return;
    Peer& p = it->second;
    if (!p.unsent.empty()) {
      if (!FlushUnsent(p)) return Drop(fd, true);
      if (!p.unsent.empty()) return;
      epoll_event ev{EPOLLIN, {.fd = fd}};
      epoll_ctl(ep_, EPOLL_CTL_MOD, fd, &ev);
    }
    if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
    for (int i = 0; i < kReadsPerEvent; ++i) {
      ssize_t r = read(fd, buf_.data(), buf_.size());
      if (r == 0) return Drop(fd, false);
      if (r < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        return Drop(fd, true);
      }
      bytes_in_ += static_cast<uint64_t>(r);
      if (!echo_) continue;
      p.unsent.assign(buf_.begin(), buf_.begin() + r);
      if (!FlushUnsent(p)) return Drop(fd, true);
      if (!p.unsent.empty()) {
        // Stop reading until the echo is out: back-pressure to the client.
        epoll_event ev{EPOLLOUT, {.fd = fd}};
        epoll_ctl(ep_, EPOLL_CTL_MOD, fd, &ev);
        return;
      }
    }
  }

  uint64_t accepted() const { return accepted_; }
  uint64_t closed() const { return closed_; }
  uint64_t errors() const { return errors_; }
  uint64_t bytes_in() const { return bytes_in_; }
  uint64_t bytes_out() const { return bytes_out_; }
  size_t open() const { return peers_.size(); }

 private:
  bool FlushUnsent(Peer& p) {
    size_t done = 0;
    while (done < p.unsent.size()) {
      ssize_t w = write(p.fd.get(), p.unsent.data() + done, p.unsent.size() - done);
      if (w > 0) {
        done += static_cast<size_t>(w);
      } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
        break;
      } else {
        return false;
      }
    }
    bytes_out_ += done;
    p.unsent.erase(p.unsent.begin(), p.unsent.begin() + static_cast<ptrdiff_t>(done));
    return true;
  }

  void Drop(int fd, bool error) {
    epoll_ctl(ep_, EPOLL_CTL_DEL, fd, nullptr);
    peers_.erase(fd);  // closes it
    ++closed_;
    if (error) ++errors_;
  }

  const bool echo_;
  const int ep_;
  std::vector<uint8_t> buf_ = std::vector<uint8_t>(kReadBytes);
  std::unordered_map<int, Peer> peers_;
  uint64_t accepted_ = 0, closed_ = 0, errors_ = 0, bytes_in_ = 0, bytes_out_ = 0;
};

}  // namespace

// --sink: discard instead of echoing. --conns N: exit once N connections
// came and went (0: until SIGTERM). --max-seconds: hard limit.
int RunServer(const sockaddr_in& addr, const Options& o) {
  const bool echo = !o.Flag("sink");
  const int64_t expect = o.Int("conns", 0);
  const int64_t deadline = NowNs() + SecondsToNs(o.Real("max-seconds", 60));
  std::signal(SIGTERM, OnStop);
  std::signal(SIGINT, OnStop);
  std::signal(SIGPIPE, SIG_IGN);
  UniqueFd ls(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
  int one = 1;
  setsockopt(ls.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(ls.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(ls.get(), kListenBacklog) != 0) {
    std::perror("netload server: bind/listen");
    return 1;
  }
  UniqueFd ep(epoll_create1(EPOLL_CLOEXEC));
  epoll_event lev{EPOLLIN, {.fd = ls.get()}};
  epoll_ctl(ep.get(), EPOLL_CTL_ADD, ls.get(), &lev);
  Server server(echo, ep.get());
  Say("listening");
  std::vector<epoll_event> events(512);
  while (!g_stop && NowNs() < deadline && (expect == 0 || server.closed() < static_cast<uint64_t>(expect))) {
    int n = epoll_wait(ep.get(), events.data(), static_cast<int>(events.size()), 100);
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == ls.get()) {
        server.Accept(ls.get());
      } else {
        server.Serve(events[i].data.fd, events[i].events);
      }
    }
  }
  bool complete = expect == 0 || server.closed() >= static_cast<uint64_t>(expect);
  Say("{\"role\":\"server\",\"accepted\":%llu,\"closed\":%llu,\"still_open\":%zu,\"errors\":%llu,"
      "\"bytes_in\":%llu,\"bytes_out\":%llu,\"cpu_s\":%.3f,\"complete\":%s}",
      static_cast<unsigned long long>(server.accepted()), static_cast<unsigned long long>(server.closed()),
      server.open(), static_cast<unsigned long long>(server.errors()),
      static_cast<unsigned long long>(server.bytes_in()), static_cast<unsigned long long>(server.bytes_out()),
      CpuSeconds(), complete ? "true" : "false");
  return complete && server.errors() == 0 ? 0 : 1;
}

}  // namespace vsocket::bench
