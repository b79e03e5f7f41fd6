// sendmmsg and recvmmsg: batches of sendmsg/recvmsg calls.
#include <errno.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstdint>

#include "base/clock.h"
#include "guest/core/iov.h"
#include "guest/preload/wrap.h"
#include "guest/sys/libc.h"

using vsocket::MonotonicNs;
using vsocket::NsTimespec;
using vsocket::TimespecNs;
using vsocket::TimespecValid;
using namespace vsocket::guest;
using namespace vsocket::guest::preload;

extern "C" {

// sendmmsg/recvmmsg on a connection we follow: one sendmsg/recvmsg per
// message through the wrappers (write.cc, read.cc: held, the kernel's own;
// upgraded, the ring), with the kernel's rules for TCP: at most UIO_MAXIOV
// messages; a message sent in part ends the batch; an error after the first
// message ends it and the count is returned; MSG_WAITFORONE makes every
// message after the first non-blocking; recvmmsg's timeout is looked at
// after each message and left holding what remains of it.
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

}  // extern "C"
