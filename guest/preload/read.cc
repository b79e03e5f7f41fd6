// The read side of libvsocket.so's libc surface: read, readv, preadv2,
// recv, recvfrom, recvmsg and their fortified variants. On a connection we
// follow: held, the kernel's own call; otherwise the ring (guest/core Recv).
#include <limits.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "guest/core/held_io.h"
#include "guest/preload/wrap.h"
#include "guest/sys/libc.h"

using namespace vsocket::guest;
using namespace vsocket::guest::preload;

extern "C" {

ssize_t read(int fd, void* buf, size_t n) {
  auto c = Ours(fd);
  if (!c || n == 0) return Libc().read(fd, buf, n);  // read(0) returns at once
  ssize_t r;
  if (HeldRecv(*c, 0, [&] { return Libc().read(fd, buf, n); }, &r)) return r;
  iovec v{buf, n};
  return RecvIov(fd, *c, &v, 1, 0);
}

ssize_t readv(int fd, const iovec* iov, int n) {
  auto c = Ours(fd);
  if (!c || n < 0 || n > IOV_MAX) return Libc().readv(fd, iov, n);
  ssize_t r;
  if (HeldRecv(*c, 0, [&] { return Libc().readv(fd, iov, n); }, &r)) return r;
  return RecvIov(fd, *c, iov, n, 0);
}

// preadv2 and its 64-bit-offset name: a socket's rules in wrap.h
// (KernelAnswersV2).
ssize_t preadv2(int fd, const iovec* iov, int n, off_t offset, int flags) {
  auto c = Ours(fd);
  if (!c || KernelAnswersV2(offset, n, flags)) return Libc().preadv2(fd, iov, n, offset, flags);
  const int msg = (flags & RWF_NOWAIT) ? MSG_DONTWAIT : 0;
  ssize_t r;
  if (HeldRecv(*c, msg, [&] { return Libc().preadv2(fd, iov, n, offset, flags); }, &r)) return r;
  return RecvIov(fd, *c, iov, n, msg);
}

ssize_t preadv64v2(int fd, const iovec* iov, int n, off64_t offset, int flags) {
  return preadv2(fd, iov, n, offset, flags);
}

ssize_t recv(int fd, void* buf, size_t n, int flags) {
  auto c = Ours(fd);
  if (!c || (flags & MSG_ERRQUEUE)) return Libc().recv(fd, buf, n, flags);
  ssize_t r;
  if (HeldRecv(*c, flags, [&] { return Libc().recv(fd, buf, n, flags); }, &r)) return r;
  iovec v{buf, n};
  return RecvIov(fd, *c, &v, 1, flags);
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

}  // extern "C"
