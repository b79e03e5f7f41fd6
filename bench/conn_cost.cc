// conn_cost: what a connection per request costs the process that makes it,
// in CPU time, with and without libvsocket.so preloaded. One process is both
// ends of N loopback connections, one after the other, each the life of a
// Connection: close request in an epoll loop (nginx's and wrk's calls):
// socket, connect, accept4, epoll_ctl ADD (both ends), a wait, MOD, a 18 B
// request, a 1 KiB answer, DEL, close (both ends), and a file opened and
// closed (nginx's per response). Prints wall, user and system microseconds
// per connection. Held by the default policy, the library adds only user
// time here: its own bookkeeping (issue 39's Connection: close rows).
//
//   LD_PRELOAD=.../libvsocket.so deploy/testbed.sh exec vm1 conn_cost [N]
//   (in a VM of the bed, so the library has its vsocketd and holds
//   connections as in the benchmark rows; bench/conn_cost.sh runs both ways)
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace {

double Us(const timeval& t) { return t.tv_sec * 1e6 + t.tv_usec; }

[[noreturn]] void Die(const char* what) {
  std::perror(what);
  std::exit(1);
}

// One connection's life; the listener and the epoll set are the caller's.
void OneConnection(int listener, const sockaddr_in& addr, int ep, char* buf, size_t cap) {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (s < 0) Die("socket");
  if (connect(s, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 && errno != EINPROGRESS) Die("connect");
  int c = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK);
  if (c < 0) Die("accept4");
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT;
  ev.data.fd = s;
  if (epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) != 0) Die("epoll_ctl");
  epoll_event ev2{};
  ev2.events = EPOLLIN;
  ev2.data.fd = c;
  if (epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev2) != 0) Die("epoll_ctl");
  epoll_event out[8];
  (void)epoll_wait(ep, out, 8, 0);
  ev.events = EPOLLIN;
  if (epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev) != 0) Die("epoll_ctl");
  if (write(s, "GET / HTTP/1.1\r\n\r\n", 18) != 18) Die("write");
  (void)epoll_wait(ep, out, 8, 0);
  if (recv(c, buf, cap, 0) != 18) Die("recv");
  if (send(c, buf, 1024, 0) != 1024) Die("send");
  (void)epoll_wait(ep, out, 8, 0);
  if (read(s, buf, cap) != 1024) Die("read");
  epoll_ctl(ep, EPOLL_CTL_DEL, c, nullptr);
  close(c);
  epoll_ctl(ep, EPOLL_CTL_DEL, s, nullptr);
  close(s);
  int f = open("/proc/self/stat", O_RDONLY);
  if (f >= 0) close(f);
}

}  // namespace

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 100000;
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(listener, 1024) != 0)
    Die("bind/listen");
  socklen_t len = sizeof addr;
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  int ep = epoll_create1(0);
  static char buf[4096];
  // A first connection outside the measurement: the library's start-up
  // (its session with vsocketd) is not a per-connection cost.
  OneConnection(listener, addr, ep, buf, sizeof buf);
  rusage r0{}, r1{};
  timespec t0{}, t1{};
  getrusage(RUSAGE_SELF, &r0);
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < n; ++i) OneConnection(listener, addr, ep, buf, sizeof buf);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  getrusage(RUSAGE_SELF, &r1);
  double wall_us = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3;
  std::printf("conn_cost: %d connections, per connection: wall %.2f us, user %.2f us, sys %.2f us\n", n, wall_us / n,
              (Us(r1.ru_utime) - Us(r0.ru_utime)) / n, (Us(r1.ru_stime) - Us(r0.ru_stime)) / n);
  return 0;
}
