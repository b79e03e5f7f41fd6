// What every wrapper of libvsocket.so's libc surface (guest/preload/*.cc)
// shares: the re-entry guard, the owner-process check, and the turning of a
// guest/core result into a return value and errno. Internal to the preload
// library; each wrapper file keeps its own helpers to itself.
#pragma once

#include <errno.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <memory>

#include "base/status.h"
#include "guest/core/conn.h"
#include "guest/core/fd_table.h"
#include "guest/core/socket_ops.h"

// Set by the vfork() trampoline (guest/preload/wrap.cc) on the calling
// thread.
extern "C" {
extern __attribute__((visibility("hidden"))) __thread bool vsocket_t_vforked;
}

namespace vsocket::guest::preload {

// Set while the library's own code runs, so its internal libc calls pass
// straight through.
extern constinit thread_local int t_depth;
struct Guard {
  Guard() { ++t_depth; }
  ~Guard() { --t_depth; }
};

inline ConnRef Ours(int fd) { return t_depth ? ConnRef() : LookupForCall(fd); }

// The process the library's tables belong to: set at start-up and in a
// fork child. A vfork child (python's subprocess) runs in its parent's
// memory, with an fd table of its own, until it execs or exits: what it
// closes or dups there is that table's alone, and the tables here (the
// parent's) must not change (decision 72). A system call per wrapper call
// to tell (getpid: ~1 us here) would cost more than some calls themselves,
// so vfork() marks the calling thread first (the trampoline in wrap.cc; the
// child runs on that thread's memory, thread-locals included) and only a
// marked thread asks getpid(): the child keeps the mark, the parent, once
// resumed, clears it at its next wrapper call.
extern std::atomic<pid_t> g_pid;
#if defined(__x86_64__)
inline bool InForeignChild() {
  if (!vsocket_t_vforked) return false;
  if (getpid() != g_pid.load(std::memory_order_relaxed)) return true;
  vsocket_t_vforked = false;  // the parent, resumed
  return false;
}
#else
inline bool InForeignChild() { return getpid() != g_pid.load(std::memory_order_relaxed); }
#endif

inline ssize_t Fail(const Status& st) {
  errno = st.sys_errno();
  return -1;
}

template <typename T>
ssize_t Ret(const Result<T>& r) {
  if (!r.ok()) return Fail(r.status());
  return static_cast<ssize_t>(r.value());
}

inline ssize_t SendIov(int fd, Conn& c, const iovec* iov, int n, int flags) {
  Guard g;
  return Ret(Send(fd, c, iov, n, flags));
}

inline ssize_t RecvIov(int fd, Conn& c, const iovec* iov, int n, int flags) {
  Guard g;
  return Ret(Recv(fd, c, iov, n, flags));
}

// preadv2/pwritev2 (glibc 2.26+, and their 64-bit-offset names): with
// offset -1 a socket is read and written as by readv/writev, RWF_NOWAIT
// as MSG_DONTWAIT; RWF_HIPRI, RWF_DSYNC, RWF_SYNC and RWF_APPEND mean
// nothing to a socket's bytes. Any other offset (the kernel's ESPIPE) or
// flag (its EOPNOTSUPP) is the kernel's answer, no byte moved.
inline constexpr int kSocketRwf = RWF_HIPRI | RWF_DSYNC | RWF_SYNC | RWF_NOWAIT | RWF_APPEND;

// Whether a preadv2/pwritev2 call is the kernel's to answer alone.
inline bool KernelAnswersV2(off_t offset, int n, int flags) {
  return offset != -1 || n < 0 || n > IOV_MAX || (flags & ~kSocketRwf);
}

}  // namespace vsocket::guest::preload
