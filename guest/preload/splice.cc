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
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "guest/core/held_io.h"
#include "guest/preload/wrap.h"
#include "guest/sys/libc.h"

using namespace vsocket::guest;
using namespace vsocket::guest::preload;

namespace {

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

}  // namespace

extern "C" {

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

}  // extern "C"
