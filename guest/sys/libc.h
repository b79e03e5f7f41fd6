// The real libc functions behind every wrapper, resolved once with
// dlsym(RTLD_NEXT) (std::call_once, then an atomic flag). Internal code
// calls these, never the interposed symbols, so the library cannot recurse
// into itself.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>

namespace vsocket::guest {

struct LibcCalls {
  int (*socket)(int, int, int);
  int (*connect)(int, const sockaddr*, socklen_t);
  int (*accept)(int, sockaddr*, socklen_t*);
  int (*accept4)(int, sockaddr*, socklen_t*, int);
  int (*listen)(int, int);
  int (*close)(int);
  int (*shutdown)(int, int);
  int (*dup)(int);
  int (*dup2)(int, int);
  int (*dup3)(int, int, int);
  int (*fcntl)(int, int, ...);
  int (*ioctl)(int, unsigned long, ...);
  ssize_t (*read)(int, void*, size_t);
  ssize_t (*write)(int, const void*, size_t);
  ssize_t (*readv)(int, const iovec*, int);
  ssize_t (*writev)(int, const iovec*, int);
  ssize_t (*preadv2)(int, const iovec*, int, off_t, int);
  ssize_t (*pwritev2)(int, const iovec*, int, off_t, int);
  ssize_t (*send)(int, const void*, size_t, int);
  ssize_t (*recv)(int, void*, size_t, int);
  ssize_t (*sendto)(int, const void*, size_t, int, const sockaddr*, socklen_t);
  ssize_t (*recvfrom)(int, void*, size_t, int, sockaddr*, socklen_t*);
  ssize_t (*sendmsg)(int, const msghdr*, int);
  ssize_t (*recvmsg)(int, msghdr*, int);
  ssize_t (*sendfile)(int, int, off_t*, size_t);
  ssize_t (*splice)(int, loff_t*, int, loff_t*, size_t, unsigned int);
  ssize_t (*tee)(int, int, size_t, unsigned int);
  int (*sendmmsg)(int, mmsghdr*, unsigned int, int);
  int (*recvmmsg)(int, mmsghdr*, unsigned int, int, timespec*);
  int (*poll)(pollfd*, nfds_t, int);
  int (*ppoll)(pollfd*, nfds_t, const timespec*, const sigset_t*);
  int (*select)(int, fd_set*, fd_set*, fd_set*, timeval*);
  int (*pselect)(int, fd_set*, fd_set*, fd_set*, const timespec*, const sigset_t*);
  int (*epoll_create)(int);
  int (*epoll_create1)(int);
  int (*epoll_ctl)(int, int, int, epoll_event*);
  int (*epoll_wait)(int, epoll_event*, int, int);
  int (*epoll_pwait)(int, epoll_event*, int, int, const sigset_t*);
  // glibc 2.35 and later; null before (no program there can call it).
  int (*epoll_pwait2)(int, epoll_event*, int, const timespec*, const sigset_t*);
  pid_t (*fork)();
  int (*execve)(const char*, char* const[], char* const[]);
  int (*execv)(const char*, char* const[]);
  int (*execvp)(const char*, char* const[]);
  int (*execvpe)(const char*, char* const[], char* const[]);
  int (*execveat)(int, const char*, char* const[], char* const[], int);
  int (*fexecve)(int, char* const[], char* const[]);
};

namespace libc_internal {
extern LibcCalls g_calls;
extern std::atomic<bool> g_resolved;  // g_calls is filled
const LibcCalls& ResolveOnce();
}  // namespace libc_internal

// Every wrapper calls this at least once: inline, one acquire load (a plain
// load on x86) once resolved, no call (an out-of-line call was ~2% of a
// held connection's library time, bench/conn_cost).
inline const LibcCalls& Libc() {
  if (__builtin_expect(!libc_internal::g_resolved.load(std::memory_order_acquire), 0))
    return libc_internal::ResolveOnce();
  return libc_internal::g_calls;
}

// The kernel's own send / receive of an iovec: send()/recv() for one part
// (the kernel's shorter path), sendmsg()/recvmsg() otherwise.
ssize_t KernelSendIov(int fd, const iovec* iov, int iovcnt, int flags);
ssize_t KernelRecvIov(int fd, const iovec* iov, int iovcnt, int flags);

}  // namespace vsocket::guest
