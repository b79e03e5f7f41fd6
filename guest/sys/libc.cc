#include "guest/sys/libc.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace vsocket::guest {
namespace libc_internal {

LibcCalls g_calls;
// Set once g_calls is filled: every wrapper calls Libc(), and std::call_once
// alone costs a thread-local access each time (libstdc++ passes the callable
// through TLS), so it runs only until this is seen.
std::atomic<bool> g_resolved{false};

}  // namespace libc_internal

namespace {

using libc_internal::g_calls;
std::once_flag g_once;

template <typename T>
void Resolve(T& slot, const char* name) {
  slot = reinterpret_cast<T>(dlsym(RTLD_NEXT, name));
  if (slot == nullptr) {
    std::fprintf(stderr, "libvsocket: cannot resolve %s: %s\n", name, dlerror());
    std::abort();  // the process cannot do I/O without it
  }
}

void ResolveAll() {
#define VS_RESOLVE(name) Resolve(g_calls.name, #name)
  VS_RESOLVE(socket);
  VS_RESOLVE(connect);
  VS_RESOLVE(accept);
  VS_RESOLVE(accept4);
  VS_RESOLVE(listen);
  VS_RESOLVE(close);
  VS_RESOLVE(shutdown);
  VS_RESOLVE(dup);
  VS_RESOLVE(dup2);
  VS_RESOLVE(dup3);
  VS_RESOLVE(fcntl);
  VS_RESOLVE(ioctl);
  VS_RESOLVE(read);
  VS_RESOLVE(write);
  VS_RESOLVE(readv);
  VS_RESOLVE(writev);
  VS_RESOLVE(preadv2);
  VS_RESOLVE(pwritev2);
  VS_RESOLVE(send);
  VS_RESOLVE(recv);
  VS_RESOLVE(sendto);
  VS_RESOLVE(recvfrom);
  VS_RESOLVE(sendmsg);
  VS_RESOLVE(recvmsg);
  VS_RESOLVE(sendfile);
  VS_RESOLVE(splice);
  VS_RESOLVE(tee);
  VS_RESOLVE(sendmmsg);
  VS_RESOLVE(recvmmsg);
  VS_RESOLVE(poll);
  VS_RESOLVE(ppoll);
  VS_RESOLVE(select);
  VS_RESOLVE(pselect);
  VS_RESOLVE(epoll_create);
  VS_RESOLVE(epoll_create1);
  VS_RESOLVE(epoll_ctl);
  VS_RESOLVE(epoll_wait);
  VS_RESOLVE(epoll_pwait);
  g_calls.epoll_pwait2 = reinterpret_cast<decltype(g_calls.epoll_pwait2)>(dlsym(RTLD_NEXT, "epoll_pwait2"));
  VS_RESOLVE(fork);
  VS_RESOLVE(execve);
  VS_RESOLVE(execv);
  VS_RESOLVE(execvp);
  VS_RESOLVE(execvpe);
  VS_RESOLVE(execveat);
  VS_RESOLVE(fexecve);
#undef VS_RESOLVE
}

}  // namespace

const LibcCalls& libc_internal::ResolveOnce() {
  std::call_once(g_once, ResolveAll);
  g_resolved.store(true, std::memory_order_release);
  return g_calls;
}

ssize_t KernelSendIov(int fd, const iovec* iov, int iovcnt, int flags) {
  if (iovcnt == 1) return Libc().send(fd, iov[0].iov_base, iov[0].iov_len, flags);
  msghdr mh{};
  mh.msg_iov = const_cast<iovec*>(iov);
  mh.msg_iovlen = static_cast<size_t>(iovcnt);
  return Libc().sendmsg(fd, &mh, flags);
}

ssize_t KernelRecvIov(int fd, const iovec* iov, int iovcnt, int flags) {
  if (iovcnt == 1) return Libc().recv(fd, iov[0].iov_base, iov[0].iov_len, flags);
  msghdr mh{};
  mh.msg_iov = const_cast<iovec*>(iov);
  mh.msg_iovlen = static_cast<size_t>(iovcnt);
  return Libc().recvmsg(fd, &mh, flags);
}

}  // namespace vsocket::guest
