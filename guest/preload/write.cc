// The write side of libvsocket.so's libc surface: write, writev, pwritev2,
// send, sendto, sendmsg, sendfile. On a connection we follow: held, the
// kernel's own call; otherwise the ring (guest/core Send).
#include <limits.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "guest/core/held_io.h"
#include "guest/core/registration.h"
#include "guest/core/socket_ops.h"
#include "guest/preload/wrap.h"
#include "guest/sys/libc.h"

using vsocket::Result;
using namespace vsocket::guest;
using namespace vsocket::guest::preload;

namespace {

// Urgent data (MSG_OOB) may take the held path only while the connection
// never registered (it never will then); otherwise Send answers
// EOPNOTSUPP (decision 79).
bool UrgentMayGo(Conn& c, int flags) { return !(flags & MSG_OOB) || NoteUrgent(c); }

}  // namespace

extern "C" {

ssize_t write(int fd, const void* buf, size_t n) {
  auto c = Ours(fd);
  if (!c) return Libc().write(fd, buf, n);
  ssize_t r;
  if (HeldSend(*c, [&] { return Libc().write(fd, buf, n); }, &r)) return r;
  iovec v{const_cast<void*>(buf), n};
  return SendIov(fd, *c, &v, 1, 0);
}

ssize_t writev(int fd, const iovec* iov, int n) {
  auto c = Ours(fd);
  if (!c || n < 0 || n > IOV_MAX) return Libc().writev(fd, iov, n);  // the kernel's EINVAL
  ssize_t r;
  if (HeldSend(*c, [&] { return Libc().writev(fd, iov, n); }, &r)) return r;
  return SendIov(fd, *c, iov, n, 0);
}

// pwritev2 and its 64-bit-offset name: a socket's rules in wrap.h
// (KernelAnswersV2).
ssize_t pwritev2(int fd, const iovec* iov, int n, off_t offset, int flags) {
  auto c = Ours(fd);
  if (!c || KernelAnswersV2(offset, n, flags)) return Libc().pwritev2(fd, iov, n, offset, flags);
  ssize_t r;
  if (HeldSend(*c, [&] { return Libc().pwritev2(fd, iov, n, offset, flags); }, &r)) return r;
  return SendIov(fd, *c, iov, n, (flags & RWF_NOWAIT) ? MSG_DONTWAIT : 0);
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

ssize_t sendto(int fd, const void* buf, size_t n, int flags, const sockaddr* addr, socklen_t len) {
  auto c = Ours(fd);
  if (!c) return Libc().sendto(fd, buf, n, flags, addr, len);
  ssize_t r;
  if (UrgentMayGo(*c, flags) && HeldSend(*c, [&] { return Libc().sendto(fd, buf, n, flags, addr, len); }, &r)) return r;
  iovec v{const_cast<void*>(buf), n};
  return SendIov(fd, *c, &v, 1, flags);  // a connected stream ignores the address
}

ssize_t sendmsg(int fd, const msghdr* m, int flags) {
  auto c = Ours(fd);
  if (!c || m == nullptr || m->msg_iovlen > IOV_MAX) return Libc().sendmsg(fd, m, flags);
  ssize_t r;
  if (UrgentMayGo(*c, flags) && HeldSend(*c, [&] { return Libc().sendmsg(fd, m, flags); }, &r)) return r;
  return SendIov(fd, *c, m->msg_iov, static_cast<int>(m->msg_iovlen), flags);
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

// On LP64, off_t is 64 bits: sendfile64 is the same call (nginx uses it).
ssize_t sendfile64(int out, int in, off64_t* offset, size_t count) {
  return sendfile(out, in, reinterpret_cast<off_t*>(offset), count);
}
static_assert(sizeof(off_t) == sizeof(off64_t));

}  // extern "C"
