// libvsocket.so's libc surface. Each wrapper is a few lines: find out whether
// the fd is a TCP connection the library follows, dispatch to guest/core, or
// pass through. errno is set here and only here.
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/close_range.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <vector>

#include "base/clock.h"
#include "base/own_fd.h"
#include "guest/core/config.h"
#include "guest/core/exec.h"
#include "guest/core/fd_table.h"
#include "guest/core/held_io.h"
#include "guest/core/iov.h"
#include "guest/core/poll_ops.h"
#include "guest/core/report.h"
#include "guest/core/resync.h"
#include "guest/core/session.h"
#include "guest/core/socket_ops.h"
#include "guest/core/writer.h"
#include "guest/sys/libc.h"

using vsocket::IsOwnFd;
using vsocket::MonotonicNs;
using vsocket::NsTimespec;
using vsocket::Result;
using vsocket::Status;
using vsocket::TimespecNs;
using vsocket::TimespecValid;
using namespace vsocket::guest;

// vfork() as the application calls it: marks the calling thread, then
// jumps to libc's vfork with the caller's stack untouched (a wrapper with a
// frame of its own would have that frame reused by the child and then
// returned through by the parent). Both return straight to the caller.
extern "C" {
__attribute__((visibility("hidden"))) __thread bool vsocket_t_vforked = false;
__attribute__((visibility("hidden"))) void* vsocket_real_vfork = nullptr;
}
#if defined(__x86_64__)
asm(R"(
  .text
  .globl vfork
  .type vfork, @function
vfork:
  movq vsocket_t_vforked@gottpoff(%rip), %rax
  movb $1, %fs:(%rax)
  jmpq *vsocket_real_vfork(%rip)
  .size vfork, .-vfork
)");
#endif

namespace {

// Set while the library's own code runs, so its internal libc calls pass
// straight through.
thread_local int t_depth = 0;
struct Guard {
  Guard() { ++t_depth; }
  ~Guard() { --t_depth; }
};

std::shared_ptr<Conn> Ours(int fd) { return t_depth ? nullptr : Lookup(fd); }

// The process the library's tables belong to: set at start-up and in a
// fork child. A vfork child (python's subprocess) runs in its parent's
// memory, with an fd table of its own, until it execs or exits: what it
// closes or dups there is that table's alone, and the tables here (the
// parent's) must not change (decision 72). A system call per wrapper call
// to tell (getpid: ~1 us here) would cost more than some calls themselves,
// so vfork() marks the calling thread first (the trampoline above; the
// child runs on that thread's memory, thread-locals included) and only a
// marked thread asks getpid(): the child keeps the mark, the parent, once
// resumed, clears it at its next wrapper call.
std::atomic<pid_t> g_pid{0};
#if defined(__x86_64__)
bool InForeignChild() {
  if (!vsocket_t_vforked) return false;
  if (getpid() != g_pid.load(std::memory_order_relaxed)) return true;
  vsocket_t_vforked = false;  // the parent, resumed
  return false;
}
#else
bool InForeignChild() { return getpid() != g_pid.load(std::memory_order_relaxed); }
#endif

ssize_t Fail(const Status& st) {
  errno = st.sys_errno();
  return -1;
}

template <typename T>
ssize_t Ret(const Result<T>& r) {
  if (!r.ok()) return Fail(r.status());
  return static_cast<ssize_t>(r.value());
}

bool IsTcp(int domain, int type, int protocol) {
  return (domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM &&
         (protocol == 0 || protocol == IPPROTO_TCP);
}

// Urgent data (MSG_OOB) may take the held path only while the connection
// never registered (it never will then); otherwise Send answers
// EOPNOTSUPP (decision 79).
bool UrgentMayGo(Conn& c, int flags) { return !(flags & MSG_OOB) || NoteUrgent(c); }

ssize_t SendIov(int fd, Conn& c, const iovec* iov, int n, int flags) {
  Guard g;
  return Ret(Send(fd, c, iov, n, flags));
}

ssize_t RecvIov(int fd, Conn& c, const iovec* iov, int n, int flags) {
  Guard g;
  return Ret(Recv(fd, c, iov, n, flags));
}

int MsToTimeout(const timespec* ts) {
  if (ts == nullptr) return -1;
  return static_cast<int>(ts->tv_sec * 1000 + (ts->tv_nsec + 999999) / 1000000);
}

__attribute__((constructor)) void Init() {
  // The library's own fds are numbered high and left alone by the
  // program's close() calls (base/own_fd.h, close() below).
  vsocket::ProtectOwnFds();
  g_pid.store(getpid());
  vsocket_real_vfork = dlsym(RTLD_NEXT, "vfork");
  Libc();
  // Read the settings now: servers such as nginx clear the environment
  // before their workers do any I/O.
  Config();
  Session::SetLinkLostHandler(StartResync);
  // The child's only thread is not inside any of our wrappers, whatever the
  // forking thread's state was (a fork from a signal handler that
  // interrupted a wrapper would otherwise leave the guard set for good).
  pthread_atfork([] {
    EpollSettleAll();  // the child shares the epoll objects
    BeforeFork();
  }, AfterForkInParent, [] {
    t_depth = 0;
    g_pid.store(getpid());
    AfterForkInChild();
  });
  atexit([] { ReportAll("exit"); });
}

// The exec family: the connections the new program inherits are named
// first, and an accelerated one is reset (guest/core/exec.h). Each variant
// is wrapped: glibc's execl/execvp reach execve internally, not through us.
void NoteExec(const char* program, char* const envp[]) {
  if (t_depth) return;
  Guard g;
  int saved = errno;
  EpollSettleAll();
  BeforeExec(program, envp);
  errno = saved;
}

// The arguments of execl/execlp/execle up to the terminating null pointer.
std::vector<char*> ArgList(const char* arg0, va_list ap) {
  std::vector<char*> v{const_cast<char*>(arg0)};
  if (arg0 != nullptr)
    while (char* a = va_arg(ap, char*)) v.push_back(a);
  v.push_back(nullptr);
  return v;
}

// ---- stdio on a connection ---------------------------------------------
// glibc's stdio reads, writes and closes a FILE's fd through its internal
// calls, never through ours: a FILE made by fdopen() on a connection would
// read the kernel socket while the bytes come by the ring, write past the
// ring, and fclose() would leave the connection in our tables under a
// closed number. Such a FILE is made with fopencookie() instead, its read,
// write and close going through the wrappers (and fileno() answering the
// fd, as for any FILE); dprintf formats, then writes through write()
// (decision 74).
struct ConnCookie {
  int fd;
};

ssize_t CookieRead(void* cookie, char* buf, size_t n) { return read(static_cast<ConnCookie*>(cookie)->fd, buf, n); }

ssize_t CookieWrite(void* cookie, const char* buf, size_t n) {
  int fd = static_cast<ConnCookie*>(cookie)->fd;
  size_t done = 0;
  while (done < n) {
    ssize_t w = write(fd, buf + done, n - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      return done > 0 ? static_cast<ssize_t>(done) : -1;
    }
    done += static_cast<size_t>(w);
  }
  return static_cast<ssize_t>(done);
}

int CookieSeek(void*, off64_t*, int) {
  errno = ESPIPE;
  return -1;
}

int CookieClose(void* cookie) {
  auto* c = static_cast<ConnCookie*>(cookie);
  int r = close(c->fd);
  delete c;
  return r;
}

// Whether fd names a connection this library follows that can carry bytes.
bool CarriesBytes(int fd) {
  if (t_depth || InForeignChild()) return false;
  auto c = Lookup(fd);
  return c && !c->listening.load(std::memory_order_relaxed);
}

}  // namespace

extern "C" {

// (glibc's checked vasprintf: dprintf's _FORTIFY_SOURCE variants keep its
// checks.)
int __vasprintf_chk(char** out, int flag, const char* fmt, va_list ap);

int socket(int domain, int type, int protocol) {
  int fd = Libc().socket(domain, type, protocol);
  if (fd >= 0 && !t_depth && IsTcp(domain, type, protocol) && !InForeignChild()) Adopt(fd, type & SOCK_NONBLOCK);
  return fd;
}

int connect(int fd, const sockaddr* addr, socklen_t len) { return Libc().connect(fd, addr, len); }

// A listening socket never carries data: waits on it need no session.
int listen(int fd, int backlog) {
  int r = Libc().listen(fd, backlog);
  if (r == 0) {
    if (auto c = Ours(fd)) c->listening.store(true, std::memory_order_relaxed);
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

// fd no longer names what it named (still_open: not yet, close() is about
// to): drop it from our tables. An epoll registration lives as long as the
// socket does (another dup may keep it, or a lingering close).
void Release(int fd, bool still_open = true) {
  auto c = Lookup(fd);
  bool last = !c || c->fd_refs.load() == 1;
  Forget(fd, still_open);
  if (last) EpollForget(fd, c && c->linger_fd.load() >= 0);
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

// dup2/dup3 onto one of the library's own fds would close it under the
// library (and its eventfd writes would reach the program's file): EBUSY,
// the kernel's answer when a number is not free to take.
// (Called only where the tables are ours: not in a vfork child.)
bool OntoOwnFd(int fd, int fd2) {
  if (fd == fd2 || !IsOwnFd(fd2)) return false;
  errno = EBUSY;
  return true;
}

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

ssize_t write(int fd, const void* buf, size_t n) {
  auto c = Ours(fd);
  if (!c) return Libc().write(fd, buf, n);
  ssize_t r;
  if (HeldSend(*c, [&] { return Libc().write(fd, buf, n); }, &r)) return r;
  iovec v{const_cast<void*>(buf), n};
  return SendIov(fd, *c, &v, 1, 0);
}

ssize_t read(int fd, void* buf, size_t n) {
  auto c = Ours(fd);
  if (!c || n == 0) return Libc().read(fd, buf, n);  // read(0) returns at once
  ssize_t r;
  if (HeldRecv(*c, 0, [&] { return Libc().read(fd, buf, n); }, &r)) return r;
  iovec v{buf, n};
  return RecvIov(fd, *c, &v, 1, 0);
}

FILE* fdopen(int fd, const char* mode) {
  using Fn = FILE* (*)(int, const char*);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "fdopen"));
  if (!CarriesBytes(fd)) return real(fd, mode);
  if (Libc().fcntl(fd, F_GETFL) < 0) return nullptr;  // (EBADF, as glibc's)
  auto* cookie = new ConnCookie{fd};
  FILE* f = fopencookie(cookie, mode, cookie_io_functions_t{CookieRead, CookieWrite, CookieSeek, CookieClose});
  if (f == nullptr) {
    delete cookie;
    return nullptr;
  }
  f->_fileno = fd;  // fileno() answers the fd (glibc marks a cookie stream -2; any value but -1 is "open")
  return f;
}

// The formatted text goes through write(); returns its length or -1.
int WriteFormatted(int fd, char* text, int len) {
  if (len < 0) return -1;
  ConnCookie cookie{fd};
  ssize_t done = CookieWrite(&cookie, text, static_cast<size_t>(len));
  int saved = errno;
  free(text);
  errno = saved;
  return done == len ? len : -1;
}

int vdprintf(int fd, const char* fmt, va_list ap) {
  using Fn = int (*)(int, const char*, va_list);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "vdprintf"));
  if (!CarriesBytes(fd)) return real(fd, fmt, ap);
  char* text = nullptr;
  int len = vasprintf(&text, fmt, ap);
  return WriteFormatted(fd, text, len);
}

int dprintf(int fd, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = vdprintf(fd, fmt, ap);
  va_end(ap);
  return r;
}

int __vdprintf_chk(int fd, int flag, const char* fmt, va_list ap) {
  using Fn = int (*)(int, int, const char*, va_list);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "__vdprintf_chk"));
  if (!CarriesBytes(fd)) return real(fd, flag, fmt, ap);
  char* text = nullptr;
  int len = __vasprintf_chk(&text, flag, fmt, ap);
  return WriteFormatted(fd, text, len);
}

int __dprintf_chk(int fd, int flag, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = __vdprintf_chk(fd, flag, fmt, ap);
  va_end(ap);
  return r;
}

ssize_t writev(int fd, const iovec* iov, int n) {
  auto c = Ours(fd);
  if (!c || n < 0 || n > IOV_MAX) return Libc().writev(fd, iov, n);  // the kernel's EINVAL
  ssize_t r;
  if (HeldSend(*c, [&] { return Libc().writev(fd, iov, n); }, &r)) return r;
  return SendIov(fd, *c, iov, n, 0);
}

ssize_t readv(int fd, const iovec* iov, int n) {
  auto c = Ours(fd);
  if (!c || n < 0 || n > IOV_MAX) return Libc().readv(fd, iov, n);
  ssize_t r;
  if (HeldRecv(*c, 0, [&] { return Libc().readv(fd, iov, n); }, &r)) return r;
  return RecvIov(fd, *c, iov, n, 0);
}

// preadv2/pwritev2 (glibc 2.26+, and their 64-bit-offset names): with
// offset -1 a socket is read and written as by readv/writev, RWF_NOWAIT
// as MSG_DONTWAIT; RWF_HIPRI, RWF_DSYNC, RWF_SYNC and RWF_APPEND mean
// nothing to a socket's bytes. Any other offset (the kernel's ESPIPE) or
// flag (its EOPNOTSUPP) is the kernel's answer, no byte moved.
constexpr int kSocketRwf = RWF_HIPRI | RWF_DSYNC | RWF_SYNC | RWF_NOWAIT | RWF_APPEND;

// Whether a preadv2/pwritev2 call is the kernel's to answer alone.
bool KernelAnswersV2(off_t offset, int n, int flags) {
  return offset != -1 || n < 0 || n > IOV_MAX || (flags & ~kSocketRwf);
}

ssize_t preadv2(int fd, const iovec* iov, int n, off_t offset, int flags) {
  auto c = Ours(fd);
  if (!c || KernelAnswersV2(offset, n, flags)) return Libc().preadv2(fd, iov, n, offset, flags);
  const int msg = (flags & RWF_NOWAIT) ? MSG_DONTWAIT : 0;
  ssize_t r;
  if (HeldRecv(*c, msg, [&] { return Libc().preadv2(fd, iov, n, offset, flags); }, &r)) return r;
  return RecvIov(fd, *c, iov, n, msg);
}

ssize_t pwritev2(int fd, const iovec* iov, int n, off_t offset, int flags) {
  auto c = Ours(fd);
  if (!c || KernelAnswersV2(offset, n, flags)) return Libc().pwritev2(fd, iov, n, offset, flags);
  ssize_t r;
  if (HeldSend(*c, [&] { return Libc().pwritev2(fd, iov, n, offset, flags); }, &r)) return r;
  return SendIov(fd, *c, iov, n, (flags & RWF_NOWAIT) ? MSG_DONTWAIT : 0);
}

ssize_t preadv64v2(int fd, const iovec* iov, int n, off64_t offset, int flags) {
  return preadv2(fd, iov, n, offset, flags);
}

ssize_t pwritev64v2(int fd, const iovec* iov, int n, off64_t offset, int flags) {
  return pwritev2(fd, iov, n, offset, flags);
}

ssize_t send(int fd, const void* buf, size_t n, int flags) {
  auto c = Ours(fd);
  if (!c) return Libc().send(fd, buf, n, flags);
  ssize_t r;
  if (UrgentMayGo(*c, flags) && HeldSend(*c, [&] { return Libc().send(fd, buf, n, flags); }, &r)) return r;
  iovec v{const_cast<void*>(buf), n};
  return SendIov(fd, *c, &v, 1, flags);
}

ssize_t recv(int fd, void* buf, size_t n, int flags) {
  auto c = Ours(fd);
  if (!c || (flags & MSG_ERRQUEUE)) return Libc().recv(fd, buf, n, flags);
  ssize_t r;
  if (HeldRecv(*c, flags, [&] { return Libc().recv(fd, buf, n, flags); }, &r)) return r;
  iovec v{buf, n};
  return RecvIov(fd, *c, &v, 1, flags);
}

ssize_t sendto(int fd, const void* buf, size_t n, int flags, const sockaddr* addr, socklen_t len) {
  auto c = Ours(fd);
  if (!c) return Libc().sendto(fd, buf, n, flags, addr, len);
  ssize_t r;
  if (UrgentMayGo(*c, flags) && HeldSend(*c, [&] { return Libc().sendto(fd, buf, n, flags, addr, len); }, &r)) return r;
  iovec v{const_cast<void*>(buf), n};
  return SendIov(fd, *c, &v, 1, flags);  // a connected stream ignores the address
}

ssize_t recvfrom(int fd, void* buf, size_t n, int flags, sockaddr* addr, socklen_t* len) {
  auto c = Ours(fd);
  if (!c || (flags & MSG_ERRQUEUE)) return Libc().recvfrom(fd, buf, n, flags, addr, len);
  ssize_t r;
  if (HeldRecv(*c, flags, [&] { return Libc().recvfrom(fd, buf, n, flags, addr, len); }, &r)) return r;
  if (len) *len = 0;  // as the kernel does for TCP
  iovec v{buf, n};
  return RecvIov(fd, *c, &v, 1, flags);
}

ssize_t sendmsg(int fd, const msghdr* m, int flags) {
  auto c = Ours(fd);
  if (!c || m == nullptr || m->msg_iovlen > IOV_MAX) return Libc().sendmsg(fd, m, flags);
  ssize_t r;
  if (UrgentMayGo(*c, flags) && HeldSend(*c, [&] { return Libc().sendmsg(fd, m, flags); }, &r)) return r;
  return SendIov(fd, *c, m->msg_iov, static_cast<int>(m->msg_iovlen), flags);
}

ssize_t recvmsg(int fd, msghdr* m, int flags) {
  auto c = Ours(fd);
  // The error queue (timestamps, zerocopy completions) is the kernel
  // socket's, never stream bytes: not read from the ring, not counted.
  if (!c || m == nullptr || m->msg_iovlen > IOV_MAX || (flags & MSG_ERRQUEUE)) return Libc().recvmsg(fd, m, flags);
  ssize_t r;
  if (HeldRecv(*c, flags, [&] { return Libc().recvmsg(fd, m, flags); }, &r)) return r;
  m->msg_namelen = 0;
  m->msg_controllen = 0;
  m->msg_flags = 0;
  return RecvIov(fd, *c, m->msg_iov, static_cast<int>(m->msg_iovlen), flags);
}

ssize_t sendfile(int out, int in, off_t* offset, size_t count) {
  auto c = Ours(out);
  if (!c) return Libc().sendfile(out, in, offset, count);
  ssize_t held;
  if (HeldSend(*c, [&] { return Libc().sendfile(out, in, offset, count); }, &held)) return held;
  {
    Guard g;
    Result<size_t> direct = size_t{0};
    if (KernelSendFile(out, *c, in, offset, count, &direct)) return Ret(direct);
  }
  // Through the ring (or, not yet upgraded, through Send, which counts the
  // kernel bytes the fence needs): read the file in chunks.
  std::vector<char> buf(std::min<size_t>(count, 256 * 1024));
  off_t pos = offset ? *offset : lseek(in, 0, SEEK_CUR);
  size_t done = 0;
  while (done < count) {
    size_t want = std::min(buf.size(), count - done);
    ssize_t r = pread(in, buf.data(), want, pos);
    if (r < 0) {
      if (done) break;
      return -1;
    }
    if (r == 0) break;
    iovec v{buf.data(), static_cast<size_t>(r)};
    ssize_t w = SendIov(out, *c, &v, 1, 0);
    if (w < 0) {
      if (done) break;
      return -1;
    }
    pos += w;
    done += static_cast<size_t>(w);
    if (w < r) break;  // non-blocking socket full
  }
  if (offset) *offset = pos;
  else lseek(in, pos, SEEK_SET);
  return static_cast<ssize_t>(done);
}

// sendmmsg/recvmmsg on a connection we follow: one sendmsg/recvmsg per
// message through the wrappers above (held: the kernel's own; upgraded: the
// ring), with the kernel's rules for TCP: at most UIO_MAXIOV messages; a
// message sent in part ends the batch; an error after the first message
// ends it and the count is returned; MSG_WAITFORONE makes every message
// after the first non-blocking; recvmmsg's timeout is looked at after each
// message and left holding what remains of it.
int sendmmsg(int fd, mmsghdr* v, unsigned int n, int flags) {
  auto c = Ours(fd);
  if (!c) return Libc().sendmmsg(fd, v, n, flags);
  n = std::min(n, static_cast<unsigned int>(UIO_MAXIOV));
  unsigned int i = 0;
  for (; i < n; ++i) {
    const msghdr& m = v[i].msg_hdr;
    ssize_t r = sendmsg(fd, &m, flags);
    if (r < 0) {
      if (i == 0) return -1;
      break;
    }
    v[i].msg_len = static_cast<unsigned int>(r);
    if (static_cast<size_t>(r) < IovLen(m.msg_iov, static_cast<int>(m.msg_iovlen))) {  // (sent: a valid iovec)
      ++i;
      break;
    }
  }
  return static_cast<int>(i);
}

int recvmmsg(int fd, mmsghdr* v, unsigned int n, int flags, timespec* timeout) {
  auto c = Ours(fd);
  if (!c || (flags & MSG_ERRQUEUE)) return Libc().recvmmsg(fd, v, n, flags, timeout);
  int64_t end = 0;
  if (timeout != nullptr) {
    if (!TimespecValid(*timeout)) {
      errno = EINVAL;
      return -1;
    }
    end = MonotonicNs() + TimespecNs(*timeout);
  }
  n = std::min(n, static_cast<unsigned int>(UIO_MAXIOV));
  int f = flags & ~MSG_WAITFORONE;
  unsigned int i = 0;
  while (i < n) {
    ssize_t r = recvmsg(fd, &v[i].msg_hdr, f);
    if (r < 0) {
      if (i == 0) return -1;
      break;
    }
    v[i].msg_len = static_cast<unsigned int>(r);
    ++i;
    if (flags & MSG_WAITFORONE) f |= MSG_DONTWAIT;
    if (timeout != nullptr) {
      int64_t left = std::max<int64_t>(0, end - MonotonicNs());
      *timeout = NsTimespec(left);
      if (left == 0) break;
    }
  }
  return static_cast<int>(i);
}

// splice(2) between a pipe and a connection we follow. Held (or on kernel
// TCP for good): the kernel's own splice, its bytes counted like any held
// call's (a later upgrade fences on them). Otherwise the bytes take the
// ring, in chunks of at most 64 KiB, and nothing is taken from one side
// that the other did not accept: from the connection, the bytes are peeked,
// written to the pipe, and only what the pipe took is then read; into the
// connection, the pipe's bytes are copied (tee) into a pipe of our own and
// read from there, sent, and only what was sent is then taken from the
// application's pipe. An offset on the socket side, two sockets or two
// pipes: the kernel's call and its answer.
constexpr size_t kSpliceChunk = 64 * 1024;

bool IsPipe(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode);
}

// A pipe of one call's own, 64 KiB, blocking (tee and splice treat a
// non-blocking pipe on either side as SPLICE_F_NONBLOCK); it starts empty
// and is closed when the call returns (one kept open could be closed under
// us by a program that closes every fd it does not know).
struct OwnPipe {
  int fd[2] = {-1, -1};
  OwnPipe() {
    if (pipe2(fd, O_CLOEXEC) != 0) fd[0] = fd[1] = -1;
    else (void)Libc().fcntl(fd[1], F_SETPIPE_SZ, static_cast<int>(kSpliceChunk));
  }
  ~OwnPipe() {
    if (fd[0] >= 0) Libc().close(fd[0]);
    if (fd[1] >= 0) Libc().close(fd[1]);
  }
  bool ok() const { return fd[0] >= 0; }
};

// Reads up to n bytes of a pipe that holds them (fewer only if another
// reader took some); returns how many.
size_t ReadUpTo(int fd, char* buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = Libc().read(fd, buf + got, n - got);
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

ssize_t SpliceFromConn(int fd, Conn& c, int pipe_out, size_t len, unsigned int flags) {
  std::vector<char> buf(std::min(len, kSpliceChunk));
  if (buf.empty()) return 0;
  iovec v{buf.data(), buf.size()};
  ssize_t n = RecvIov(fd, c, &v, 1, MSG_PEEK);  // blocks as the socket does
  if (n <= 0) return n;
  int fl = Libc().fcntl(pipe_out, F_GETFL);
  if (fl < 0) return -1;
  ssize_t w;
  if ((flags & SPLICE_F_NONBLOCK) && !(fl & O_NONBLOCK)) {
    // A blocking pipe the call must not block on: the bytes go through a
    // pipe of the call's own, and the kernel's splice moves from there what
    // the application's pipe takes without waiting.
    OwnPipe own;
    if (!own.ok()) return -1;
    ssize_t in = Libc().write(own.fd[1], buf.data(), static_cast<size_t>(n));
    if (in <= 0) return -1;
    w = Libc().splice(own.fd[0], nullptr, pipe_out, nullptr, static_cast<size_t>(in), flags & ~SPLICE_F_MOVE);
  } else {
    w = Libc().write(pipe_out, buf.data(), static_cast<size_t>(n));
  }
  if (w <= 0) return w;
  iovec take{buf.data(), static_cast<size_t>(w)};
  ssize_t got = RecvIov(fd, c, &take, 1, MSG_WAITALL);  // there already: peeked
  return got < 0 ? got : w;
}

ssize_t SpliceIntoConn(int fd, Conn& c, int pipe_in, size_t len, unsigned int flags) {
  size_t want = std::min(len, kSpliceChunk);
  if (want == 0) return 0;
  OwnPipe own;
  if (!own.ok()) return -1;
  // Blocks for the pipe's first byte as splice would (unless NONBLOCK).
  ssize_t n = Libc().tee(pipe_in, own.fd[1], want, flags & SPLICE_F_NONBLOCK);
  if (n <= 0) return n;  // 0: no writer left and nothing in the pipe
  std::vector<char> buf(static_cast<size_t>(n));
  size_t have = ReadUpTo(own.fd[0], buf.data(), buf.size());
  if (have == 0) return -1;
  iovec v{buf.data(), have};
  ssize_t w = SendIov(fd, c, &v, 1, (flags & SPLICE_F_MORE) ? MSG_MORE : 0);
  if (w <= 0) return w;
  (void)ReadUpTo(pipe_in, buf.data(), static_cast<size_t>(w));  // what was sent leaves the application's pipe
  return w;
}

ssize_t splice(int in, loff_t* off_in, int out, loff_t* off_out, size_t len, unsigned int flags) {
  auto ci = Ours(in), co = Ours(out);
  auto kernel = [&] { return Libc().splice(in, off_in, out, off_out, len, flags); };
  if ((!ci && !co) || (ci && co) || (ci && off_in) || (co && off_out)) return kernel();
  ssize_t r;
  if (ci) {
    if (HeldRecv(*ci, 0, kernel, &r)) return r;
    if (!IsPipe(out)) return kernel();
    return SpliceFromConn(in, *ci, out, len, flags);
  }
  if (HeldSend(*co, kernel, &r)) return r;
  if (!IsPipe(in)) return kernel();
  return SpliceIntoConn(out, *co, in, len, flags);
}

// On LP64, off_t is 64 bits: sendfile64 is the same call (nginx uses it).
ssize_t sendfile64(int out, int in, off64_t* offset, size_t count) {
  return sendfile(out, in, reinterpret_cast<off_t*>(offset), count);
}
static_assert(sizeof(off_t) == sizeof(off64_t));

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

// The exec family (NoteExec above).
int execve(const char* path, char* const argv[], char* const envp[]) {
  NoteExec(path, envp);
  return Libc().execve(path, argv, envp);
}

int execv(const char* path, char* const argv[]) {
  NoteExec(path, environ);
  return Libc().execv(path, argv);
}

int execvp(const char* file, char* const argv[]) {
  NoteExec(file, environ);
  return Libc().execvp(file, argv);
}

int execvpe(const char* file, char* const argv[], char* const envp[]) {
  NoteExec(file, envp);
  return Libc().execvpe(file, argv, envp);
}

int execveat(int dirfd, const char* path, char* const argv[], char* const envp[], int flags) {
  NoteExec(path, envp);
  return Libc().execveat(dirfd, path, argv, envp, flags);
}

int fexecve(int fd, char* const argv[], char* const envp[]) {
  char link[64], program[PATH_MAX] = "(fexecve)";
  snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, program, sizeof(program) - 1);
  if (n > 0) program[n] = '\0';
  NoteExec(program, envp);
  return Libc().fexecve(fd, argv, envp);
}

int execl(const char* path, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  std::vector<char*> argv = ArgList(arg, ap);
  va_end(ap);
  NoteExec(path, environ);
  return Libc().execv(path, argv.data());
}

int execlp(const char* file, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  std::vector<char*> argv = ArgList(arg, ap);
  va_end(ap);
  NoteExec(file, environ);
  return Libc().execvp(file, argv.data());
}

int execle(const char* path, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  std::vector<char*> argv = ArgList(arg, ap);
  char* const* envp = va_arg(ap, char* const*);
  va_end(ap);
  NoteExec(path, envp);
  return Libc().execve(path, argv.data(), envp);
}

// Fortified variants (_FORTIFY_SOURCE): same checks as glibc, then ours.
ssize_t __read_chk(int fd, void* buf, size_t n, size_t buflen) {
  if (n > buflen) abort();
  return read(fd, buf, n);
}

ssize_t __recv_chk(int fd, void* buf, size_t n, size_t buflen, int flags) {
  if (n > buflen) abort();
  return recv(fd, buf, n, flags);
}

ssize_t __recvfrom_chk(int fd, void* buf, size_t n, size_t buflen, int flags, sockaddr* a, socklen_t* l) {
  if (n > buflen) abort();
  return recvfrom(fd, buf, n, flags, a, l);
}

int __poll_chk(pollfd* fds, nfds_t n, int timeout, size_t fdslen) {
  if (fdslen / sizeof(*fds) < n) abort();
  return poll(fds, n, timeout);
}

int __ppoll_chk(pollfd* fds, nfds_t n, const timespec* ts, const sigset_t* mask, size_t fdslen) {
  if (fdslen / sizeof(*fds) < n) abort();
  return ppoll(fds, n, ts, mask);
}

}  // extern "C"
