#include "guest/core/epoll/one_poll.h"

#include <poll.h>

#include <algorithm>

#include "guest/sys/libc.h"

namespace vsocket::guest::epoll {

static_assert(POLLIN == EPOLLIN && POLLOUT == EPOLLOUT && POLLERR == EPOLLERR && POLLHUP == EPOLLHUP &&
              POLLRDHUP == EPOLLRDHUP && POLLPRI == EPOLLPRI);

bool AsksForMore(const EpEntry& e) {
  return e.dirty && e.conn && e.in_kernel && e.kern_present && (e.events & ~kPollable) == 0 &&
         (e.events & ~e.kern_events & kAskable) != 0;
}

int FindPendingInterest(const EpSet& set, PendingInterest* out, int limit) {
  int n = 0;
  for (int fd : set.dirty_fds) {
    auto it = set.entries.find(fd);
    if (it == set.entries.end() || !AsksForMore(it->second)) continue;
    bool seen = false;  // (dirty_fds may name an fd twice)
    for (int i = 0; i < n && !seen; ++i) seen = out[i].fd == fd;
    if (seen) continue;
    if (n == limit) return 0;
    out[n++] = PendingInterest{fd, it->second.events, it->second.data};
  }
  std::sort(out, out + n, [](const PendingInterest& a, const PendingInterest& b) { return a.fd < b.fd; });
  return n;
}

int ReadyNow(const PendingInterest* p, int n, epoll_event* ev) {
  // (poll's bits are epoll's: the static_assert above.)
  pollfd pf[kMaxPendingInterest];
  for (int i = 0; i < n; ++i) pf[i] = pollfd{p[i].fd, static_cast<short>(p[i].events & kAskable), 0};
  if (Libc().poll(pf, static_cast<nfds_t>(n), 0) <= 0) return 0;
  int k = 0;
  for (int i = 0; i < n; ++i) {
    auto r = static_cast<uint16_t>(pf[i].revents);
    if (r == 0 || (r & POLLNVAL)) continue;  // (POLLNVAL: closed meanwhile, gone from the set)
    ev[k].events = r & kPollable & (p[i].events | EPOLLERR | EPOLLHUP);
    ev[k].data = p[i].data;
    ++k;
  }
  return k;
}

}  // namespace vsocket::guest::epoll
