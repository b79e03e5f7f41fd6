// The wrappers that make, name, rename and end fds: socket, accept, listen,
// shutdown, close, close_range, closefrom, dup/dup2/dup3, and fcntl/ioctl
// (F_DUPFD, the non-blocking flag, FIONREAD). Our tables follow what the
// kernel's fd table does, in the process they belong to (wrap.h).
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

#include "base/own_fd.h"
#include "guest/core/fd_table.h"
#include "guest/core/poll_ops.h"
#include "guest/core/session.h"
#include "guest/core/socket_ops.h"
#include "guest/preload/wrap.h"
#include "guest/sys/libc.h"

using vsocket::IsOwnFd;
using vsocket::Status;
using namespace vsocket::guest;
using namespace vsocket::guest::preload;

namespace {

bool IsTcp(int domain, int type, int protocol) {
  return (domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM &&
         (protocol == 0 || protocol == IPPROTO_TCP);
}

// fd no longer names what it named (still_open: not yet, close() is about
// to): drop it from our tables. An epoll registration lives as long as the
// socket does (another dup may keep it, or a lingering close).
void Release(int fd, bool still_open = true) {
  auto c = Lookup(fd);
  bool last = !c || c->fd_refs.load() == 1;
  Forget(fd, still_open);
  if (last) EpollForget(fd, c && c->linger_fd.load() >= 0);
}

// close_range(2) and closefrom(3) close fds without close(): what close()
// does first is done here for every fd of the range our tables can hold
// (numbers below kTableFds), or a number would keep naming a connection
// that is gone, and the next file given that number (by open(), pipe(),
// anything) would be taken for it. CLOSE_RANGE_CLOEXEC closes nothing.
// CLOSE_RANGE_UNSHARE closes in a table of the calling thread's own, which
// the other threads (and our tables) do not share: nothing to release, but
// the library's fds stay open in that table too (the thread may go on
// using its connections).
void ReleaseRange(unsigned int first, unsigned int last) {
  Guard g;
  constexpr unsigned int kTracked = kTableFds;
  if (first >= kTracked) return;
  unsigned int end = std::min(last, kTracked - 1);
  for (unsigned int fd = first; fd <= end; ++fd) {
    EpollSettleFd(static_cast<int>(fd));
    Release(static_cast<int>(fd));
  }
}

using CloseRangeFn = int (*)(unsigned int, unsigned int, int);

CloseRangeFn RealCloseRange() {
  static CloseRangeFn real = reinterpret_cast<CloseRangeFn>(dlsym(RTLD_NEXT, "close_range"));
  return real;
}

// Closes [first, last] but the library's own fds: the kernel's close_range
// per run between them (the first call carries CLOSE_RANGE_UNSHARE if
// asked), or close() per number where there is no close_range.
int CloseRangeAroundOwnFds(unsigned int first, unsigned int last, int flags) {
  int result = 0, err = 0;
  bool unshare = flags & CLOSE_RANGE_UNSHARE;
  vsocket::ForEachRunWithoutOwnFds(first, last, [&](unsigned lo, unsigned hi) {
    if (!(flags & (CLOSE_RANGE_CLOEXEC | CLOSE_RANGE_UNSHARE))) ReleaseRange(lo, hi);
    int f = unshare ? flags : flags & ~CLOSE_RANGE_UNSHARE;
    unshare = false;
    CloseRangeFn real = RealCloseRange();
    int r = real != nullptr ? real(lo, hi, f) : (errno = ENOSYS, -1);
    if (r != 0 && errno == ENOSYS && flags == 0) {
      // (No close_range: a kernel before 5.9 or a libc before 2.34.)
      rlimit rl{};
      unsigned cap = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (1u << 20) ? rl.rlim_cur : 1u << 20;
      for (unsigned fd = lo; fd <= hi && fd < cap; ++fd) Libc().close(static_cast<int>(fd));
      r = 0;
    }
    if (r != 0 && result == 0) {
      result = r;
      err = errno;
    }
  });
  if (result != 0) errno = err;
  return result;
}

// dup2/dup3 onto one of the library's own fds would close it under the
// library (and its eventfd writes would reach the program's file): EBUSY,
// the kernel's answer when a number is not free to take.
// (Called only where the tables are ours: not in a vfork child.)
bool OntoOwnFd(int fd, int fd2) {
  if (fd == fd2 || !IsOwnFd(fd2)) return false;
  errno = EBUSY;
  return true;
}

}  // namespace

extern "C" {

int socket(int domain, int type, int protocol) {
  int fd = Libc().socket(domain, type, protocol);
  if (fd >= 0 && !t_depth && IsTcp(domain, type, protocol) && !InForeignChild()) Adopt(fd, type & SOCK_NONBLOCK);
  return fd;
}

int connect(int fd, const sockaddr* addr, socklen_t len) { return Libc().connect(fd, addr, len); }

// A listening socket never carries data: waits on it need no session. But
// a server learns the upgrade policy here if it does not know it yet
// (decision 132): the workers it forks then hold their connections by it
// without opening a session each.
int listen(int fd, int backlog) {
  int r = Libc().listen(fd, backlog);
  if (r == 0) {
    if (auto c = Ours(fd)) {
      c->listening.store(true, std::memory_order_relaxed);
      if (!InForeignChild()) {
        int saved = errno;
        Session::LearnPolicy();
        errno = saved;
      }
    }
  }
  return r;
}

int accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  int c = Libc().accept4(fd, addr, len, flags);
  if (c >= 0 && Ours(fd) && !InForeignChild()) Adopt(c, flags & SOCK_NONBLOCK, true);
  return c;
}

int accept(int fd, sockaddr* addr, socklen_t* len) {
  int c = Libc().accept(fd, addr, len);
  if (c >= 0 && Ours(fd) && !InForeignChild()) Adopt(c, false, true);
  return c;
}

// The library's own fds (its vsocketd sockets, eventfds, shared memory,
// dups that hold a closed connection's FIN: base/own_fd.h) are not the
// program's to close: a program that closes every fd it did not open
// while it goes on using its connections would otherwise cut them off
// (decision 71). close() of one answers 0 as if it had closed it and
// leaves it open (its number is high, out of the way of the program's
// own); dup2/dup3 onto one fail with EBUSY; close_range and closefrom
// close around them.
int close(int fd) {
  if (!t_depth && !InForeignChild()) {
    if (IsOwnFd(fd)) return 0;
    Guard g;
    EpollSettleFd(fd);  // (a registration of fd may outlive fd: a dup, a child)
    Release(fd);
  }
  return Libc().close(fd);
}

// close_range and closefrom: ReleaseRange and CloseRangeAroundOwnFds above.
int close_range(unsigned int first, unsigned int last, int flags) {
  if (RealCloseRange() == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  if (t_depth || first > last || (flags & CLOSE_RANGE_CLOEXEC) || InForeignChild())
    return RealCloseRange()(first, last, flags);
  return CloseRangeAroundOwnFds(first, last, flags);
}

void closefrom(int lowfd) {
  if (t_depth || lowfd < 0 || InForeignChild()) {
    using Fn = void (*)(int);
    static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "closefrom"));
    if (real != nullptr) real(lowfd);
    return;
  }
  (void)CloseRangeAroundOwnFds(static_cast<unsigned int>(lowfd), ~0u, 0);
}

int shutdown(int fd, int how) {
  auto c = Ours(fd);
  if (!c) return Libc().shutdown(fd, how);
  Guard g;
  Status st = Shutdown(fd, *c, how);
  return st.ok() ? 0 : static_cast<int>(Fail(st));
}

int dup(int fd) {
  int n = Libc().dup(fd);
  if (n >= 0 && !t_depth && !InForeignChild()) Duplicate(fd, n);
  return n;
}

// dup2/dup3: onto the library's own fds, OntoOwnFd above.
int dup2(int fd, int fd2) {
  bool ours = !t_depth && !InForeignChild();
  if (ours && OntoOwnFd(fd, fd2)) return -1;
  if (ours) {
    Guard g;
    EpollSettleFd(fd2);  // as close(fd2)
  }
  int n = Libc().dup2(fd, fd2);
  if (n >= 0 && fd != fd2 && ours) {
    Guard g;
    Release(fd2, false);  // the kernel closed what fd2 was
    Duplicate(fd, n);
  }
  return n;
}

int dup3(int fd, int fd2, int flags) {
  bool ours = !t_depth && !InForeignChild();
  if (ours && OntoOwnFd(fd, fd2)) return -1;
  if (ours) {
    Guard g;
    EpollSettleFd(fd2);
  }
  int n = Libc().dup3(fd, fd2, flags);
  if (n >= 0 && ours) {
    Guard g;
    Release(fd2, false);
    Duplicate(fd, n);
  }
  return n;
}

int fcntl(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  long arg = va_arg(ap, long);
  va_end(ap);
  int r = Libc().fcntl(fd, cmd, arg);
  if (r < 0 || t_depth) return r;
  if (cmd == F_SETFL) {
    if (auto c = Lookup(fd)) c->nonblocking.store(arg & O_NONBLOCK);
  } else if ((cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) && !InForeignChild()) {
    Duplicate(fd, r);
  }
  return r;
}

int fcntl64(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  long arg = va_arg(ap, long);
  va_end(ap);
  return fcntl(fd, cmd, arg);
}

int ioctl(int fd, unsigned long req, ...) {
  va_list ap;
  va_start(ap, req);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  auto c = Ours(fd);
  if (c && req == FIONREAD) {
    Guard g;
    auto r = Readable(fd, *c);
    if (!r.ok()) return static_cast<int>(Fail(r.status()));
    *static_cast<int*>(arg) = *r;
    return 0;
  }
  int r = Libc().ioctl(fd, req, arg);
  if (r == 0 && c && req == FIONBIO) c->nonblocking.store(*static_cast<int*>(arg) != 0);
  return r;
}

}  // extern "C"
