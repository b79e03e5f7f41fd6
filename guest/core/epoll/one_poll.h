#pragma once

#include <sys/epoll.h>

#include "guest/core/epoll/set.h"

namespace vsocket::guest::epoll {

// A deferred change that asks a level-triggered registration the kernel
// has for more than it has: wrk and every ae client ask for writing once an
// answer is in (MOD to IN|OUT, or redis-benchmark's DEL and ADD for OUT),
// wait, write the next request and ask for reading again: two epoll_ctl
// per request, each 1-3 us in a VM. A wait while such changes are pending
// may be answered by one poll() of those sockets (ReadyNow), the kernel's
// registrations left as they are, if one of them is ready; the next wait
// of the set is the kernel's own, with every change applied (decision 75).
struct PendingInterest {
  int fd;
  uint32_t events;  // the application's
  epoll_data_t data;
};
inline constexpr int kMaxPendingInterest = 16;
inline constexpr uint32_t kPollable = EPOLLIN | EPOLLOUT | EPOLLPRI | EPOLLRDHUP | EPOLLERR | EPOLLHUP;
inline constexpr uint32_t kAskable = EPOLLIN | EPOLLOUT | EPOLLPRI | EPOLLRDHUP;


// Requires set.mu. Whether e's deferred change asks for more than the
// kernel's registration has.
bool AsksForMore(const EpEntry& e);
// Requires set.mu. The entries whose deferred change asks for more, into
// out (at most `limit`, sorted by fd), if every one of them fits; 0 when
// there are none or too many.
int FindPendingInterest(const EpSet& set, PendingInterest* out, int limit) REQUIRES(set.mu);
// What the kernel's wait would report now for the pending entries, by one
// poll() of their sockets (no sleep); the count reported into ev.
int ReadyNow(const PendingInterest* p, int n, epoll_event* ev);

}  // namespace vsocket::guest::epoll
