// The waits of libvsocket.so's libc surface: poll, ppoll, select, pselect,
// epoll_ctl, epoll_wait, epoll_pwait, epoll_pwait2 and the fortified poll
// variants. The kernel's own call when no fd is a connection we follow;
// otherwise guest/core's waits (poll_ops.h).
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <time.h>

#include "guest/core/poll_ops.h"
#include "guest/preload/wrap.h"
#include "guest/sys/libc.h"

using namespace vsocket::guest;
using namespace vsocket::guest::preload;

namespace {

int MsToTimeout(const timespec* ts) {
  if (ts == nullptr) return -1;
  return static_cast<int>(ts->tv_sec * 1000 + (ts->tv_nsec + 999999) / 1000000);
}

}  // namespace

extern "C" {

int poll(pollfd* fds, nfds_t n, int timeout) {
  if (t_depth) return Libc().poll(fds, n, timeout);
  Guard g;
  int r;
  if (PollKernelAlone(fds, n, [&] { return Libc().poll(fds, n, timeout); }, &r)) return r;
  return Poll(fds, n, timeout, nullptr);
}

int ppoll(pollfd* fds, nfds_t n, const timespec* ts, const sigset_t* mask) {
  if (t_depth) return Libc().ppoll(fds, n, ts, mask);
  Guard g;
  int r;
  if (PollKernelAlone(fds, n, [&] { return Libc().ppoll(fds, n, ts, mask); }, &r)) return r;
  return Poll(fds, n, MsToTimeout(ts), mask);
}

int select(int nfds, fd_set* r, fd_set* w, fd_set* e, timeval* tv) {
  if (t_depth) return Libc().select(nfds, r, w, e, tv);
  Guard g;
  int k;
  if (SelectKernelAlone(nfds, r, w, e, [&] { return Libc().select(nfds, r, w, e, tv); }, &k)) return k;
  int ms = tv ? static_cast<int>(tv->tv_sec * 1000 + (tv->tv_usec + 999) / 1000) : -1;
  return Select(nfds, r, w, e, ms, nullptr);
}

int pselect(int nfds, fd_set* r, fd_set* w, fd_set* e, const timespec* ts, const sigset_t* mask) {
  if (t_depth) return Libc().pselect(nfds, r, w, e, ts, mask);
  Guard g;
  int k;
  if (SelectKernelAlone(nfds, r, w, e, [&] { return Libc().pselect(nfds, r, w, e, ts, mask); }, &k)) return k;
  return Select(nfds, r, w, e, MsToTimeout(ts), mask);
}

int epoll_ctl(int epfd, int op, int fd, epoll_event* ev) {
  if (t_depth) return Libc().epoll_ctl(epfd, op, fd, ev);
  Guard g;
  return EpollCtl(epfd, op, fd, ev);
}

int epoll_wait(int epfd, epoll_event* ev, int max, int timeout) {
  if (t_depth) return Libc().epoll_wait(epfd, ev, max, timeout);
  Guard g;
  return EpollWait(epfd, ev, max, timeout, nullptr);
}

int epoll_pwait(int epfd, epoll_event* ev, int max, int timeout, const sigset_t* mask) {
  if (t_depth) return Libc().epoll_pwait(epfd, ev, max, timeout, mask);
  Guard g;
  return EpollWait(epfd, ev, max, timeout, mask);
}

int epoll_pwait2(int epfd, epoll_event* ev, int max, const timespec* ts, const sigset_t* mask) {
  if (t_depth) {
    if (Libc().epoll_pwait2 == nullptr) {
      errno = ENOSYS;
      return -1;
    }
    return Libc().epoll_pwait2(epfd, ev, max, ts, mask);
  }
  Guard g;
  return EpollWait2(epfd, ev, max, ts, mask);
}

// Fortified variants (_FORTIFY_SOURCE): same checks as glibc, then ours.
int __poll_chk(pollfd* fds, nfds_t n, int timeout, size_t fdslen) {
  if (fdslen / sizeof(*fds) < n) abort();
  return poll(fds, n, timeout);
}

int __ppoll_chk(pollfd* fds, nfds_t n, const timespec* ts, const sigset_t* mask, size_t fdslen) {
  if (fdslen / sizeof(*fds) < n) abort();
  return ppoll(fds, n, ts, mask);
}

}  // extern "C"
