// syscall(3): a program that makes a system call through it, for a call
// libc also names — libuv closes every fd with syscall(SYS_close, fd)
// (uv__close_nocancel), others read or write that way — would go around
// the library, which then never sees the connection closed (its rings
// stay taken until the region is full) or its bytes move. So each number
// whose libc name the library wraps goes through that wrapper, as if the
// program had called the name; every other number is the kernel's.
// (A close that avoids even this — inline assembly, io_uring — is still
// caught: fd_table.h ReclaimStale.)
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <type_traits>

#include "guest/preload/wrap.h"

using namespace vsocket::guest::preload;

namespace {

using SyscallFn = long (*)(long, ...);

SyscallFn RealSyscall() {
  static std::atomic<SyscallFn> real{nullptr};
  SyscallFn f = real.load(std::memory_order_acquire);
  if (f == nullptr) {
    f = reinterpret_cast<SyscallFn>(dlsym(RTLD_NEXT, "syscall"));
    real.store(f, std::memory_order_release);
  }
  return f;
}

// pselect6's sixth argument: the signal mask and its size.
struct Pselect6Mask {
  const sigset_t* set;
  size_t size;
};

template <typename T>
T As(long v) {
  if constexpr (std::is_pointer_v<T>) return reinterpret_cast<T>(v);
  else return static_cast<T>(v);
}

}  // namespace

extern "C" {

// The six argument words are read whatever the number takes, as libc's
// syscall() does (it cannot know either): the words past the caller's are
// its stack, read and ignored. AddressSanitizer would take that read for an
// overflow of the caller's frame.
__attribute__((no_sanitize("address"))) long syscall(long number, ...) {
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (long& v : a) v = va_arg(ap, long);
  va_end(ap);
  if (!t_depth) {
    switch (number) {
      case SYS_close: return close(As<int>(a[0]));
#ifdef SYS_close_range
      case SYS_close_range: return close_range(As<unsigned>(a[0]), As<unsigned>(a[1]), As<int>(a[2]));
#endif
      case SYS_shutdown: return shutdown(As<int>(a[0]), As<int>(a[1]));
      case SYS_dup: return dup(As<int>(a[0]));
#ifdef SYS_dup2
      case SYS_dup2: return dup2(As<int>(a[0]), As<int>(a[1]));
#endif
      case SYS_dup3: return dup3(As<int>(a[0]), As<int>(a[1]), As<int>(a[2]));
      case SYS_fcntl: return fcntl(As<int>(a[0]), As<int>(a[1]), a[2]);
      case SYS_ioctl: return ioctl(As<int>(a[0]), As<unsigned long>(a[1]), a[2]);
      case SYS_socket: return socket(As<int>(a[0]), As<int>(a[1]), As<int>(a[2]));
      case SYS_accept: return accept(As<int>(a[0]), As<sockaddr*>(a[1]), As<socklen_t*>(a[2]));
      case SYS_accept4:
        return accept4(As<int>(a[0]), As<sockaddr*>(a[1]), As<socklen_t*>(a[2]), As<int>(a[3]));
      case SYS_listen: return listen(As<int>(a[0]), As<int>(a[1]));
      case SYS_read: return read(As<int>(a[0]), As<void*>(a[1]), As<size_t>(a[2]));
      case SYS_write: return write(As<int>(a[0]), As<const void*>(a[1]), As<size_t>(a[2]));
      case SYS_readv: return readv(As<int>(a[0]), As<const iovec*>(a[1]), As<int>(a[2]));
      case SYS_writev: return writev(As<int>(a[0]), As<const iovec*>(a[1]), As<int>(a[2]));
      case SYS_recvfrom:
        return recvfrom(As<int>(a[0]), As<void*>(a[1]), As<size_t>(a[2]), As<int>(a[3]), As<sockaddr*>(a[4]),
                        As<socklen_t*>(a[5]));
      case SYS_sendto:
        return sendto(As<int>(a[0]), As<const void*>(a[1]), As<size_t>(a[2]), As<int>(a[3]),
                      As<const sockaddr*>(a[4]), As<socklen_t>(a[5]));
      case SYS_recvmsg: return recvmsg(As<int>(a[0]), As<msghdr*>(a[1]), As<int>(a[2]));
      case SYS_sendmsg: return sendmsg(As<int>(a[0]), As<const msghdr*>(a[1]), As<int>(a[2]));
      case SYS_recvmmsg:
        return recvmmsg(As<int>(a[0]), As<mmsghdr*>(a[1]), As<unsigned>(a[2]), As<int>(a[3]), As<timespec*>(a[4]));
      case SYS_sendmmsg: return sendmmsg(As<int>(a[0]), As<mmsghdr*>(a[1]), As<unsigned>(a[2]), As<int>(a[3]));
      case SYS_sendfile: return sendfile(As<int>(a[0]), As<int>(a[1]), As<off_t*>(a[2]), As<size_t>(a[3]));
      case SYS_splice:
        return splice(As<int>(a[0]), As<loff_t*>(a[1]), As<int>(a[2]), As<loff_t*>(a[3]), As<size_t>(a[4]),
                      As<unsigned>(a[5]));
#ifdef SYS_poll
      case SYS_poll: return poll(As<pollfd*>(a[0]), As<nfds_t>(a[1]), As<int>(a[2]));
#endif
      case SYS_ppoll:  // (a[4]: the mask's size, the kernel's business)
        return ppoll(As<pollfd*>(a[0]), As<nfds_t>(a[1]), As<const timespec*>(a[2]), As<const sigset_t*>(a[3]));
#ifdef SYS_select
      case SYS_select:
        return select(As<int>(a[0]), As<fd_set*>(a[1]), As<fd_set*>(a[2]), As<fd_set*>(a[3]), As<timeval*>(a[4]));
#endif
      case SYS_pselect6: {
        const auto* m = As<const Pselect6Mask*>(a[5]);
        return pselect(As<int>(a[0]), As<fd_set*>(a[1]), As<fd_set*>(a[2]), As<fd_set*>(a[3]),
                       As<const timespec*>(a[4]), m != nullptr ? m->set : nullptr);
      }
      case SYS_epoll_ctl: return epoll_ctl(As<int>(a[0]), As<int>(a[1]), As<int>(a[2]), As<epoll_event*>(a[3]));
#ifdef SYS_epoll_wait
      case SYS_epoll_wait: return epoll_wait(As<int>(a[0]), As<epoll_event*>(a[1]), As<int>(a[2]), As<int>(a[3]));
#endif
      case SYS_epoll_pwait:
        return epoll_pwait(As<int>(a[0]), As<epoll_event*>(a[1]), As<int>(a[2]), As<int>(a[3]),
                           As<const sigset_t*>(a[4]));
      default: break;
    }
  }
  return RealSyscall()(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}

}  // extern "C"
