// The data path: read/write, readv/writev, send/recv, sendto/recvfrom,
// sendmsg/recvmsg, MSG_PEEK/MSG_DONTWAIT/MSG_WAITALL, sendfile, EAGAIN on
// non-blocking sockets, blocking calls that wait, socket timeouts, and
// signals interrupting a blocked call.
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/socket/test_util.h"

namespace vsocket::socktest {
namespace {

// Reads `n` bytes with `op` (a wrapper around one receive call), polling
// before each call so the loop is bounded; stops early on EOF or error.
std::string ReadWith(int fd, size_t n, const std::function<ssize_t(char*, size_t)>& op) {
  std::string out(n, '\0');
  size_t got = 0;
  Deadline deadline(kIoTimeoutMs);
  while (got < n && !deadline.Expired()) {
    if (WaitFor(fd, POLLIN, deadline.RemainingMs()) <= 0) break;
    ssize_t r = op(out.data() + got, n - got);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (r <= 0) {
      ADD_FAILURE() << "receive returned " << r << (r < 0 ? " " + ErrnoName(errno) : "");
      break;
    }
    got += static_cast<size_t>(r);
  }
  out.resize(got);
  return out;
}

// Writes all of `data` with `op` (a wrapper around one send call).
void WriteWith(int fd, const std::string& data, const std::function<ssize_t(const char*, size_t)>& op) {
  size_t done = 0;
  Deadline deadline(kIoTimeoutMs);
  while (done < data.size() && !deadline.Expired()) {
    if (WaitFor(fd, POLLOUT, deadline.RemainingMs()) <= 0) break;
    ssize_t r = op(data.data() + done, data.size() - done);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    ASSERT_GT(r, 0) << ErrnoName(errno);
    done += static_cast<size_t>(r);
  }
  ASSERT_EQ(done, data.size());
}

// An unlinked temporary file holding `content`.
Fd TempFileWith(const std::string& content) {
  std::string path = TempDir() + "/vsocket-sendfile-XXXXXX";
  Fd fd(mkstemp(path.data()));
  if (!fd.valid()) {
    ADD_FAILURE() << "mkstemp " << path << ": " << ErrnoName(errno);
    return fd;
  }
  unlink(path.c_str());
  if (pwrite(fd.get(), content.data(), content.size(), 0) != static_cast<ssize_t>(content.size()))
    ADD_FAILURE() << "pwrite: " << ErrnoName(errno);
  return fd;
}

// ---------------------------------------------------------------------------
// read, write

TEST(ReadWrite, WriteAndReadTransferBytesBothDirections) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const std::string up = StreamBytes(11, 200'000), down = StreamBytes(12, 150'000);
  std::thread writer(
      [&] { WriteWith(c.client.get(), up, [&](const char* p, size_t n) { return write(c.client.get(), p, n); }); });
  EXPECT_EQ(ReadWith(c.server.get(), up.size(), [&](char* p, size_t n) { return read(c.server.get(), p, n); }), up);
  writer.join();
  std::thread writer2(
      [&] { WriteWith(c.server.get(), down, [&](const char* p, size_t n) { return write(c.server.get(), p, n); }); });
  EXPECT_EQ(ReadWith(c.client.get(), down.size(), [&](char* p, size_t n) { return read(c.client.get(), p, n); }), down);
  writer2.join();
}

// read() of 0 bytes returns 0 at once (the VFS answers it), but recv() of 0
// bytes goes to TCP, which wants data first: on an empty socket it blocks,
// or fails EAGAIN with MSG_DONTWAIT; once data is queued it returns 0 and
// consumes nothing.
TEST(ReadWrite, ZeroLengthCallsReturnZeroButZeroLengthRecvWaitsForData) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  char b;
  EXPECT_EQ(write(c.client.get(), &b, 0), 0) << ErrnoName(errno);
  EXPECT_EQ(send(c.client.get(), &b, 0, 0), 0) << ErrnoName(errno);
  EXPECT_EQ(read(c.server.get(), &b, 0), 0) << ErrnoName(errno);
  VS_EXPECT_ERRNO(recv(c.server.get(), &b, 0, MSG_DONTWAIT), EAGAIN);
  // Nothing was sent: the reader still has nothing.
  EXPECT_EQ(WaitFor(c.server.get(), POLLIN, 50), 0);
  ASSERT_TRUE(SendAll(c.client.get(), "z"));
  ASSERT_EQ(WaitForInq(c.server.get(), 1), 1);
  EXPECT_EQ(recv(c.server.get(), &b, 0, 0), 0) << ErrnoName(errno);
  EXPECT_EQ(read(c.server.get(), &b, 0), 0) << ErrnoName(errno);
  EXPECT_EQ(WaitForInq(c.server.get(), 1), 1) << "zero-length reads consume nothing";
}

TEST(ReadWrite, ReadReturnsAvailableBytesWithoutWaitingToFillBuffer) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(SendAll(c.client.get(), "ten bytes!"));
  ASSERT_EQ(WaitForInq(c.server.get(), 10), 10);
  char buf[1000];
  EXPECT_EQ(read(c.server.get(), buf, sizeof buf), 10);
  EXPECT_EQ(std::string(buf, 10), "ten bytes!");
}

// ---------------------------------------------------------------------------
// readv, writev

TEST(Vectored, WritevGathersAndReadvScattersInOrder) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  std::string a = "abc", b = StreamBytes(3, 1000), d = "tail";
  iovec out[4] = {{a.data(), a.size()}, {nullptr, 0}, {b.data(), b.size()}, {d.data(), d.size()}};
  const size_t total = a.size() + b.size() + d.size();
  ssize_t n;
  VS_ASSERT_OK(n = writev(c.client.get(), out, 4));
  ASSERT_EQ(n, static_cast<ssize_t>(total));
  ASSERT_EQ(WaitForInq(c.server.get(), static_cast<int>(total)), static_cast<int>(total));

  char p1[10], p2[500], p3[1000];
  iovec in[3] = {{p1, sizeof p1}, {p2, sizeof p2}, {p3, sizeof p3}};
  VS_ASSERT_OK(n = readv(c.server.get(), in, 3));
  ASSERT_EQ(n, static_cast<ssize_t>(total));
  std::string got = std::string(p1, 10) + std::string(p2, 500) + std::string(p3, total - 510);
  EXPECT_EQ(got, a + b + d);
}

TEST(Vectored, IovcntAboveIovMaxOrNegativeFailsEinval) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  std::vector<iovec> iov(IOV_MAX + 1);
  char b = 'x';
  for (auto& v : iov) v = {&b, 1};
  VS_EXPECT_ERRNO(writev(c.client.get(), iov.data(), IOV_MAX + 1), EINVAL);
  VS_EXPECT_ERRNO(readv(c.server.get(), iov.data(), IOV_MAX + 1), EINVAL);
  VS_EXPECT_ERRNO(writev(c.client.get(), iov.data(), -1), EINVAL);
  // Nothing leaked through: the peer has no data.
  EXPECT_EQ(WaitFor(c.server.get(), POLLIN, 50), 0);
}

// preadv2/pwritev2 with offset -1 read and write a socket as readv/writev
// do, RWF_NOWAIT as MSG_DONTWAIT; an offset is the kernel's ESPIPE.
TEST(Vectored, Preadv2AndPwritev2AtOffsetMinusOneCarryTheStream) {
  Connection c = ConnectedPairInUse(80, 1024);
  ASSERT_TRUE(c.ok());
  const std::string up = StreamBytes(41, 60'000);
  std::thread writer([&] {
    WriteWith(c.client.get(), up, [&](const char* p, size_t n) {
      iovec v[2] = {{const_cast<char*>(p), n / 2}, {const_cast<char*>(p) + n / 2, n - n / 2}};
      return pwritev2(c.client.get(), v, 2, -1, 0);
    });
  });
  EXPECT_EQ(ReadWith(c.server.get(), up.size(), [&](char* p, size_t n) {
              iovec v{p, n};
              return preadv2(c.server.get(), &v, 1, -1, RWF_NOWAIT);
            }),
            up);
  writer.join();
  char b = 'x';
  iovec v{&b, 1};
  VS_EXPECT_ERRNO(preadv2(c.server.get(), &v, 1, -1, RWF_NOWAIT), EAGAIN);
  VS_EXPECT_ERRNO(preadv2(c.server.get(), &v, 1, 0, 0), ESPIPE);
  VS_EXPECT_ERRNO(pwritev2(c.client.get(), &v, 1, 5, 0), ESPIPE);
  // Nothing moved by the refused calls; the stream goes on.
  ASSERT_EQ(pwritev2(c.client.get(), &v, 1, -1, RWF_DSYNC), 1);
  EXPECT_EQ(ReadWith(c.server.get(), 1, [&](char* p, size_t n) { return recv(c.server.get(), p, n, 0); }), "x");
}

// ---------------------------------------------------------------------------
// send/recv, sendto/recvfrom, sendmsg/recvmsg

TEST(SendRecv, SendAndRecvTransferBytesBothDirections) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const std::string up = StreamBytes(21, 100'000), down = StreamBytes(22, 70'000);
  std::thread writer([&] {
    WriteWith(c.client.get(), up, [&](const char* p, size_t n) { return send(c.client.get(), p, n, 0); });
    WriteWith(c.server.get(), down, [&](const char* p, size_t n) { return send(c.server.get(), p, n, 0); });
  });
  EXPECT_EQ(ReadWith(c.server.get(), up.size(), [&](char* p, size_t n) { return recv(c.server.get(), p, n, 0); }), up);
  EXPECT_EQ(ReadWith(c.client.get(), down.size(), [&](char* p, size_t n) { return recv(c.client.get(), p, n, 0); }),
            down);
  writer.join();
}

TEST(SendRecv, SendtoWithNullAddressAndRecvfromWorkOnConnectedStream) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const std::string data = StreamBytes(23, 50'000);
  WriteWith(c.client.get(), data, [&](const char* p, size_t n) { return sendto(c.client.get(), p, n, 0, nullptr, 0); });
  EXPECT_EQ(ReadWith(c.server.get(), data.size(),
                     [&](char* p, size_t n) { return recvfrom(c.server.get(), p, n, 0, nullptr, nullptr); }),
            data);
}

// Linux fills no source address for a connected stream socket: the returned
// address length is 0 and the buffer is untouched.
TEST(SendRecv, RecvfromOnStreamReportsZeroLengthSourceAddress) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(SendAll(c.client.get(), "hello"));
  ASSERT_EQ(WaitForInq(c.server.get(), 5), 5);
  char buf[16];
  sockaddr_in from;
  std::memset(&from, 0xee, sizeof from);
  socklen_t len = sizeof from;
  EXPECT_EQ(recvfrom(c.server.get(), buf, sizeof buf, 0, AsSockaddr(&from), &len), 5);
  EXPECT_EQ(len, 0u);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(&from)[0], 0xee);
}

TEST(SendRecv, SendmsgGathersAndRecvmsgScattersWithNoFlagsSet) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  std::string a = "head-", b = StreamBytes(24, 3000), d = "-end";
  iovec out[3] = {{a.data(), a.size()}, {b.data(), b.size()}, {d.data(), d.size()}};
  msghdr m{};
  m.msg_iov = out;
  m.msg_iovlen = 3;
  const size_t total = a.size() + b.size() + d.size();
  ssize_t n;
  VS_ASSERT_OK(n = sendmsg(c.client.get(), &m, 0));
  ASSERT_EQ(n, static_cast<ssize_t>(total));
  ASSERT_EQ(WaitForInq(c.server.get(), static_cast<int>(total)), static_cast<int>(total));

  char p1[7], p2[5000];
  iovec in[2] = {{p1, sizeof p1}, {p2, sizeof p2}};
  sockaddr_in name;
  char control[64];
  msghdr r{};
  r.msg_name = &name;
  r.msg_namelen = sizeof name;
  r.msg_iov = in;
  r.msg_iovlen = 2;
  r.msg_control = control;
  r.msg_controllen = sizeof control;
  r.msg_flags = -1;
  VS_ASSERT_OK(n = recvmsg(c.server.get(), &r, 0));
  ASSERT_EQ(n, static_cast<ssize_t>(total));
  EXPECT_EQ(std::string(p1, 7) + std::string(p2, total - 7), a + b + d);
  EXPECT_EQ(r.msg_flags, 0);
  EXPECT_EQ(r.msg_namelen, 0u);
  EXPECT_EQ(r.msg_controllen, 0u);
}

TEST(SendRecv, RecvOnUnconnectedSocketFailsEnotconn) {
  Fd s = TcpSocket();
  char b;
  VS_EXPECT_ERRNO(recv(s.get(), &b, 1, 0), ENOTCONN);
  VS_EXPECT_ERRNO(read(s.get(), &b, 1), ENOTCONN);
}

// Linux says EPIPE here (POSIX would allow ENOTCONN).
TEST(SendRecv, SendOnUnconnectedSocketFailsEpipe) {
  Fd s = TcpSocket();
  VS_EXPECT_ERRNO(send(s.get(), "x", 1, MSG_NOSIGNAL), EPIPE);
}

TEST(SendRecv, SendAndRecvOnNonSocketFailEnotsock) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  Fd r(p[0]), w(p[1]);
  char b;
  VS_EXPECT_ERRNO(send(w.get(), "x", 1, 0), ENOTSOCK);
  VS_EXPECT_ERRNO(recv(r.get(), &b, 1, MSG_DONTWAIT), ENOTSOCK);
}

TEST(SendRecv, CallsOnClosedFdFailEbadf) {
  Fd s = TcpSocket();
  int closed = s.release();
  close(closed);
  char b;
  VS_EXPECT_ERRNO(read(closed, &b, 1), EBADF);
  VS_EXPECT_ERRNO(write(closed, "x", 1), EBADF);
  VS_EXPECT_ERRNO(recv(closed, &b, 1, 0), EBADF);
  VS_EXPECT_ERRNO(send(closed, "x", 1, 0), EBADF);
  VS_EXPECT_ERRNO(close(closed), EBADF);
}

// ---------------------------------------------------------------------------
// MSG_PEEK, MSG_DONTWAIT, MSG_WAITALL

// The error queue (timestamps, zerocopy completions) is the kernel
// socket's: reading it on a connection in use answers EAGAIN (it is empty)
// and never takes stream bytes.
TEST(ErrQueue, ReadingTheErrorQueueNeverTakesStreamBytes) {
  Connection c = ConnectedPairInUse(80, 1024);
  ASSERT_TRUE(c.ok());
  const std::string data = StreamBytes(31, 5000);
  WriteWith(c.client.get(), data, [&](const char* p, size_t n) { return send(c.client.get(), p, n, 0); });
  ASSERT_EQ(WaitForInq(c.server.get(), static_cast<int>(data.size())), static_cast<int>(data.size()));
  char buf[8192], ctl[512];
  iovec v{buf, sizeof buf};
  msghdr m{};
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  m.msg_control = ctl;
  m.msg_controllen = sizeof ctl;
  VS_EXPECT_ERRNO(recvmsg(c.server.get(), &m, MSG_ERRQUEUE), EAGAIN);
  VS_EXPECT_ERRNO(recvmsg(c.server.get(), &m, MSG_ERRQUEUE | MSG_DONTWAIT), EAGAIN);
  VS_EXPECT_ERRNO(recv(c.server.get(), buf, sizeof buf, MSG_ERRQUEUE), EAGAIN);
  VS_EXPECT_ERRNO(recvfrom(c.server.get(), buf, sizeof buf, MSG_ERRQUEUE, nullptr, nullptr), EAGAIN);
  mmsghdr mm{};
  mm.msg_hdr = m;
  VS_EXPECT_ERRNO(recvmmsg(c.server.get(), &mm, 1, MSG_ERRQUEUE, nullptr), EAGAIN);
  EXPECT_EQ(ReadWith(c.server.get(), data.size(), [&](char* p, size_t n) { return recv(c.server.get(), p, n, 0); }),
            data);
}

// Urgent data (MSG_OOB) is the kernel's: where the library carries a
// connection by the ring it fails with EOPNOTSUPP and sends nothing; the
// byte never lands in the stream as an ordinary one.
TEST(MsgOob, UrgentByteNeverLandsInTheStream) {
  Connection c = ConnectedPairInUse(80, 1024);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(SendAll(c.client.get(), "ab"));
  ssize_t r = send(c.client.get(), "!", 1, MSG_OOB);
  int err = errno;
  ASSERT_TRUE(SendAll(c.client.get(), "cd"));
  if (r < 0) {
    EXPECT_EQ(err, EOPNOTSUPP) << ErrnoName(err);
  } else {
    EXPECT_EQ(r, 1);
  }
  EXPECT_EQ(RecvExactly(c.server.get(), 4), "abcd");
}

// Urgent data sent before the connection is used much: it stays the
// kernel's (the urgent byte out of band), and the stream that follows,
// however long, arrives whole.
TEST(MsgOob, UrgentByteFirstThenAStreamArrivesWhole) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(send(c.client.get(), "!", 1, MSG_OOB), 1) << ErrnoName(errno);
  const std::string data = StreamBytes(51, 1 << 20);
  std::thread writer([&] {  // (in 4 KiB writes: a stream the upgrade policy would accelerate)
    WriteWith(c.client.get(), data,
              [&](const char* p, size_t n) { return send(c.client.get(), p, std::min<size_t>(n, 4096), 0); });
  });
  EXPECT_EQ(ReadWith(c.server.get(), data.size(), [&](char* p, size_t n) { return recv(c.server.get(), p, n, 0); }),
            data);
  writer.join();
}

TEST(MsgPeek, PeekDoesNotConsumeAndReadReturnsTheSameBytes) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(SendAll(c.client.get(), "hello world"));
  ASSERT_EQ(WaitForInq(c.server.get(), 11), 11);
  char buf[64];
  ASSERT_EQ(recv(c.server.get(), buf, sizeof buf, MSG_PEEK), 11);
  EXPECT_EQ(std::string(buf, 11), "hello world");
  ASSERT_EQ(recv(c.server.get(), buf, 5, MSG_PEEK), 5);
  EXPECT_EQ(std::string(buf, 5), "hello");
  int inq = -1;
  VS_ASSERT_OK(ioctl(c.server.get(), FIONREAD, &inq));
  EXPECT_EQ(inq, 11);
  ASSERT_EQ(read(c.server.get(), buf, sizeof buf), 11);
  EXPECT_EQ(std::string(buf, 11), "hello world");
  VS_EXPECT_ERRNO(recv(c.server.get(), buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT), EAGAIN);
}

TEST(MsgDontwait, RecvOnEmptyBlockingSocketFailsEagainAndSocketStaysBlocking) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  char b;
  VS_EXPECT_ERRNO(recv(c.server.get(), &b, 1, MSG_DONTWAIT), EAGAIN);
  EXPECT_EQ(StatusFlags(c.server.get()) & O_NONBLOCK, 0);
  ASSERT_TRUE(SendAll(c.client.get(), "x"));
  ASSERT_TRUE(WaitFor(c.server.get(), POLLIN) & POLLIN);
  EXPECT_EQ(recv(c.server.get(), &b, 1, MSG_DONTWAIT), 1);
}

TEST(MsgWaitall, RecvReturnsFullCountWhenSenderWritesInDelayedPieces) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  constexpr size_t kPiece = 4096, kPieces = 8;
  const std::string data = StreamBytes(31, kPiece * kPieces);
  std::thread writer([&] {
    for (size_t i = 0; i < kPieces; ++i) {
      SleepMs(20);
      SendAll(c.client.get(), data.data() + i * kPiece, kPiece);
    }
  });
  std::string buf(data.size(), '\0');
  ssize_t n;
  VS_EXPECT_OK(n = recv(c.server.get(), buf.data(), buf.size(), MSG_WAITALL));
  writer.join();
  EXPECT_EQ(n, static_cast<ssize_t>(data.size()));
  EXPECT_EQ(buf, data);
}

TEST(MsgWaitall, RecvReturnsShortCountWhenPeerClosesFirst) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  std::thread writer([&] {
    SendAll(c.client.get(), std::string(100, 'w'));
    SleepMs(20);
    c.client.reset();
  });
  char buf[200];
  ssize_t n;
  VS_EXPECT_OK(n = recv(c.server.get(), buf, sizeof buf, MSG_WAITALL));
  writer.join();
  EXPECT_EQ(n, 100);
  EXPECT_EQ(recv(c.server.get(), buf, sizeof buf, MSG_WAITALL), 0);
}

// ---------------------------------------------------------------------------
// sendfile

TEST(Sendfile, SendsFileBytesExactlyAndAdvancesOffsetButNotFilePosition) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const std::string content = StreamBytes(41, (1 << 20) + 123);
  Fd file = TempFileWith(content);
  ASSERT_TRUE(file.valid());
  std::string received;
  std::thread reader([&] {
    received = RecvExactly(c.server.get(), content.size());
    if (received.size() != content.size()) c.server.reset();  // RST wakes the sender
  });
  off_t off = 0;
  Deadline deadline(kIoTimeoutMs);
  while (off < static_cast<off_t>(content.size()) && !deadline.Expired()) {
    ssize_t n = sendfile(c.client.get(), file.get(), &off, content.size() - off);
    if (n < 0 && errno == EINTR) continue;
    ASSERT_GT(n, 0) << ErrnoName(errno);
  }
  reader.join();
  EXPECT_EQ(off, static_cast<off_t>(content.size()));
  EXPECT_EQ(lseek(file.get(), 0, SEEK_CUR), 0);
  EXPECT_TRUE(received == content) << "received " << received.size() << " bytes";
}

TEST(Sendfile, NullOffsetReadsFromAndAdvancesFilePosition) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const std::string content = StreamBytes(42, 5000);
  Fd file = TempFileWith(content);
  ASSERT_TRUE(file.valid());
  ASSERT_EQ(lseek(file.get(), 1000, SEEK_SET), 1000);
  ssize_t n;
  VS_ASSERT_OK(n = sendfile(c.client.get(), file.get(), nullptr, 1500));
  ASSERT_EQ(n, 1500);
  EXPECT_EQ(lseek(file.get(), 0, SEEK_CUR), 2500);
  EXPECT_EQ(RecvExactly(c.server.get(), 1500), content.substr(1000, 1500));
}

// ---------------------------------------------------------------------------
// Non-blocking: EAGAIN both ways

TEST(NonBlocking, ReceiveCallsWithNoDataFailEagain) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  int fd = c.server.get();
  VS_ASSERT_OK(fcntl(fd, F_SETFL, O_NONBLOCK));
  char b[8];
  iovec iov = {b, sizeof b};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  VS_EXPECT_ERRNO(read(fd, b, sizeof b), EAGAIN);
  VS_EXPECT_ERRNO(recv(fd, b, sizeof b, 0), EAGAIN);
  VS_EXPECT_ERRNO(recvfrom(fd, b, sizeof b, 0, nullptr, nullptr), EAGAIN);
  VS_EXPECT_ERRNO(readv(fd, &iov, 1), EAGAIN);
  VS_EXPECT_ERRNO(recvmsg(fd, &m, 0), EAGAIN);
}

// Fills the send side of `fd` with `send_once` (one non-blocking send of up
// to `chunk` bytes of the stream) until EAGAIN; returns the bytes accepted.
size_t FillUntilEagain(int fd, uint64_t seed, const std::function<ssize_t(const char*, size_t)>& send_once) {
  constexpr size_t kChunk = 64 * 1024;
  constexpr int kMaxChunks = 4096;  // 256 MiB: far beyond any socket buffer
  std::string buf(kChunk, '\0');
  size_t total = 0;
  for (int i = 0; i < kMaxChunks; ++i) {
    FillStream(seed, total, reinterpret_cast<uint8_t*>(buf.data()), kChunk);
    ssize_t n = send_once(buf.data(), kChunk);
    if (n < 0) {
      EXPECT_EQ(errno, EAGAIN) << ErrnoName(errno);
      return total;
    }
    total += static_cast<size_t>(n);
  }
  ADD_FAILURE() << "no EAGAIN after " << total << " bytes";
  return total;
}

// Drains exactly `total` bytes of stream `seed` from `fd` and checks them.
void DrainAndCheck(int fd, uint64_t seed, size_t total) {
  std::string want(64 * 1024, '\0');
  std::string got(want.size(), '\0');
  for (size_t off = 0; off < total;) {
    size_t n = std::min(want.size(), total - off);
    ASSERT_TRUE(RecvExactly(fd, got.data(), n)) << "at offset " << off;
    FillStream(seed, off, reinterpret_cast<uint8_t*>(want.data()), n);
    ASSERT_EQ(std::memcmp(got.data(), want.data(), n), 0) << "mismatch in chunk at " << off;
    off += n;
  }
}

TEST(NonBlocking, WriteFillsSendSideThenFailsEagainAndRecoversAfterPeerDrains) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  int fd = c.client.get();
  VS_ASSERT_OK(fcntl(fd, F_SETFL, O_NONBLOCK));
  size_t total = FillUntilEagain(fd, 51, [fd](const char* p, size_t n) { return write(fd, p, n); });
  ASSERT_GT(total, 0u);
  VS_EXPECT_ERRNO(write(fd, "x", 1), EAGAIN);
  DrainAndCheck(c.server.get(), 51, total);
  EXPECT_TRUE(WaitFor(fd, POLLOUT) & POLLOUT);
  EXPECT_EQ(write(fd, "more", 4), 4) << ErrnoName(errno);
  EXPECT_EQ(RecvExactly(c.server.get(), 4), "more");
}

TEST(NonBlocking, SendWithMsgDontwaitFillsBlockingSocketThenFailsEagain) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  int fd = c.client.get();
  size_t total = FillUntilEagain(fd, 52, [fd](const char* p, size_t n) { return send(fd, p, n, MSG_DONTWAIT); });
  ASSERT_GT(total, 0u);
  EXPECT_EQ(StatusFlags(fd) & O_NONBLOCK, 0);
  DrainAndCheck(c.server.get(), 52, total);
}

// ---------------------------------------------------------------------------
// Blocking calls wait

TEST(Blocking, RecvWaitsForDataSentLater) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  std::thread sender([&] {
    SleepMs(100);
    SendAll(c.client.get(), "late data");
  });
  char buf[64];
  ssize_t n;
  VS_EXPECT_OK(n = recv(c.server.get(), buf, sizeof buf, 0));
  sender.join();
  ASSERT_GT(n, 0);
  // A segment boundary may split it; collect the rest.
  std::string got(buf, static_cast<size_t>(n));
  if (got.size() < 9) got += RecvExactly(c.server.get(), 9 - got.size());
  EXPECT_EQ(got, "late data");
}

// A blocking write larger than both socket buffers returns only when all of
// it is queued, not with a short count.
TEST(Blocking, WriteOfManyMegabytesReturnsFullCountWhilePeerReads) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const std::string data = StreamBytes(61, 16 << 20);
  std::string received;
  std::thread reader([&] {
    received = RecvExactly(c.server.get(), data.size());
    if (received.size() != data.size()) c.server.reset();  // RST wakes the writer
  });
  ssize_t n;
  VS_EXPECT_OK(n = write(c.client.get(), data.data(), data.size()));
  reader.join();
  EXPECT_EQ(n, static_cast<ssize_t>(data.size()));
  EXPECT_TRUE(received == data) << "received " << received.size() << " bytes";
}

TEST(Timeouts, SoRcvtimeoExpiresWithEagain) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  timeval tv{0, 100'000};
  VS_ASSERT_OK(setsockopt(c.server.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
  timeval got{};
  socklen_t len = sizeof got;
  VS_ASSERT_OK(getsockopt(c.server.get(), SOL_SOCKET, SO_RCVTIMEO, &got, &len));
  EXPECT_EQ(got.tv_sec, 0);
  EXPECT_GT(got.tv_usec, 0);
  char b;
  Backstop backstop(kIoTimeoutMs, [&] { send(c.client.get(), "!", 1, MSG_NOSIGNAL); });
  VS_EXPECT_ERRNO(recv(c.server.get(), &b, 1, 0), EAGAIN);
  ASSERT_TRUE(SendAll(c.client.get(), "y"));
  EXPECT_EQ(recv(c.server.get(), &b, 1, 0), 1) << ErrnoName(errno);
}

// With SO_SNDTIMEO a blocking write into a full pipe gives up: a short
// count if it queued something, EAGAIN if it queued nothing.
TEST(Timeouts, SoSndtimeoOnFullSendSideReturnsShortCountOrEagain) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  int fd = c.client.get();
  timeval tv{0, 100'000};
  VS_ASSERT_OK(setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv));
  constexpr size_t kChunk = 1 << 20;
  std::string buf(kChunk, 's');
  bool timed_out = false;
  Backstop backstop(kIoTimeoutMs, [&] { shutdown(fd, SHUT_WR); });
  for (int i = 0; i < 256 && !timed_out; ++i) {  // at most 256 MiB
    ssize_t n = write(fd, buf.data(), kChunk);
    if (n < 0) {
      EXPECT_EQ(errno, EAGAIN) << ErrnoName(errno);
      timed_out = true;
    } else if (static_cast<size_t>(n) < kChunk) {
      timed_out = true;
    }
  }
  EXPECT_TRUE(timed_out);
}

// ---------------------------------------------------------------------------
// Signals interrupting a blocked call

TEST(Signals, BlockingRecvInterruptedBySignalWithoutSaRestartFailsEintr) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  ScopedSignalHandler handler(SIGUSR1, CountUsr1, 0);
  Usr1Count() = 0;
  RepeatingSignaller signaller(pthread_self());
  char b;
  Backstop backstop(kIoTimeoutMs, [&] { shutdown(c.server.get(), SHUT_RDWR); });
  VS_EXPECT_ERRNO(recv(c.server.get(), &b, 1, 0), EINTR);
  signaller.Stop();
  EXPECT_GE(Usr1Count().load(), 1);
}

TEST(Signals, BlockingRecvResumesAfterSignalWithSaRestart) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  ScopedSignalHandler handler(SIGUSR1, CountUsr1, SA_RESTART);
  Usr1Count() = 0;
  std::thread sender([&] {
    // Let a few signals land while the receiver is blocked, then send.
    for (int i = 0; i < 100 && Usr1Count().load() < 3; ++i) SleepMs(10);
    SendAll(c.client.get(), "z");
  });
  RepeatingSignaller signaller(pthread_self());
  char b = 0;
  ssize_t n;
  VS_EXPECT_OK(n = recv(c.server.get(), &b, 1, 0));
  signaller.Stop();
  sender.join();
  EXPECT_EQ(n, 1);
  EXPECT_EQ(b, 'z');
  EXPECT_GE(Usr1Count().load(), 1);
}


// ---------------------------------------------------------------------------
// splice, sendmmsg, recvmmsg on a connection in use: a stream of sends first
// (preloaded, it is upgraded: at first I/O, or, under the default policy,
// because it streams), then the call, then ordinary sends and receives.
// Every byte must arrive once and in order whichever way it went.

// A connection that has carried a stream of 80 KiB each way.
Connection WarmConnection() { return ConnectedPairInUse(80, 1024); }

struct Pipe {
  Fd r, w;
  bool ok() const { return r.valid() && w.valid(); }
};
Pipe MakePipe() {
  int p[2];
  Pipe out;
  if (pipe2(p, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe2: " << ErrnoName(errno);
    return out;
  }
  out.r = Fd(p[0]);
  out.w = Fd(p[1]);
  return out;
}

TEST(Splice, FromAPipeIntoAConnectionInUseArrivesInOrderWithTheSendsAround) {
  Connection c = WarmConnection();
  ASSERT_TRUE(c.ok());
  const size_t kBytes = 256 * 1024;
  std::string body = StreamBytes(TestSeed() + 1, kBytes);
  Pipe p = MakePipe();
  ASSERT_TRUE(p.ok());
  // (From here on threads run: failures are EXPECTs, every wait bounded.)
  ASSERT_EQ(fcntl(p.w.get(), F_SETFL, O_NONBLOCK), 0);  // (the filler's end only)
  std::string got;
  std::thread reader([&] { got = RecvExactly(c.server.get(), 4 + kBytes + 4); });
  EXPECT_TRUE(SendAll(c.client.get(), "head"));
  std::thread filler([&] {
    size_t off = 0;
    Deadline fill(kIoTimeoutMs);
    while (off < kBytes && !fill.Expired()) {
      if (!(WaitFor(p.w.get(), POLLOUT, 100) & POLLOUT)) continue;
      ssize_t w = write(p.w.get(), body.data() + off, std::min<size_t>(kBytes - off, 16384));
      if (w < 0 && errno == EAGAIN) continue;
      if (w <= 0) break;
      off += static_cast<size_t>(w);
    }
  });
  size_t spliced = 0;
  Deadline deadline(kIoTimeoutMs);
  while (spliced < kBytes && !deadline.Expired()) {
    ssize_t n = splice(p.r.get(), nullptr, c.client.get(), nullptr, kBytes - spliced, SPLICE_F_MOVE);
    EXPECT_GT(n, 0) << ErrnoName(errno);  // (not ASSERT: the threads must be joined)
    if (n <= 0) break;
    spliced += static_cast<size_t>(n);
  }
  filler.join();
  EXPECT_EQ(spliced, kBytes);
  EXPECT_TRUE(SendAll(c.client.get(), "tail"));
  reader.join();
  ASSERT_EQ(got.size(), 4 + kBytes + 4) << "the receiver timed out: spliced bytes did not arrive";
  EXPECT_EQ(got.substr(0, 4), "head");
  EXPECT_TRUE(got.substr(4, kBytes) == body) << "spliced bytes differ";
  EXPECT_EQ(got.substr(4 + kBytes), "tail");
}

TEST(Splice, FromAConnectionInUseIntoAPipeTakesTheBytesInOrder) {
  Connection c = WarmConnection();
  ASSERT_TRUE(c.ok());
  const size_t kBytes = 256 * 1024;
  std::string body = StreamBytes(TestSeed() + 2, kBytes);
  Pipe p = MakePipe();
  ASSERT_TRUE(p.ok());
  std::thread sender([&] {
    EXPECT_TRUE(SendAll(c.client.get(), body));
    EXPECT_TRUE(SendAll(c.client.get(), "tail"));
  });
  std::string piped;
  std::thread drain([&] {
    std::vector<char> buf(65536);
    while (piped.size() < kBytes) {
      ssize_t r = read(p.r.get(), buf.data(), buf.size());
      if (r <= 0) break;
      piped.append(buf.data(), static_cast<size_t>(r));
    }
  });
  size_t spliced = 0;
  Deadline deadline(kIoTimeoutMs);
  while (spliced < kBytes && !deadline.Expired()) {
    if (!(WaitFor(c.server.get(), POLLIN, 1000) & POLLIN)) continue;
    ssize_t n = splice(c.server.get(), nullptr, p.w.get(), nullptr, kBytes - spliced, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (n < 0 && errno == EAGAIN) continue;
    EXPECT_GT(n, 0) << ErrnoName(errno);  // (not ASSERT: the threads must be joined)
    if (n <= 0) break;
    spliced += static_cast<size_t>(n);
  }
  sender.join();
  p.w.reset();
  drain.join();
  EXPECT_EQ(spliced, kBytes) << "spliced bytes did not come (timed out)";
  EXPECT_TRUE(piped == body) << "piped " << piped.size() << " bytes, not the ones sent";
  EXPECT_EQ(RecvExactly(c.server.get(), 4), "tail");
  // EOF: splice returns 0.
  c.client.reset();
  Pipe q = MakePipe();
  ASSERT_TRUE(WaitFor(c.server.get(), POLLIN) & POLLIN);
  EXPECT_EQ(splice(c.server.get(), nullptr, q.w.get(), nullptr, 100, 0), 0) << ErrnoName(errno);
}

TEST(Splice, OffsetOnTheSocketSideIsEinval) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  Pipe p = MakePipe();
  ASSERT_TRUE(p.ok());
  loff_t off = 0;
  VS_EXPECT_ERRNO(splice(p.r.get(), nullptr, c.client.get(), &off, 10, SPLICE_F_NONBLOCK), EINVAL);
}

TEST(Mmsg, SendmmsgAndRecvmmsgOnAConnectionInUseCarryEveryMessageInOrder) {
  Connection c = WarmConnection();
  ASSERT_TRUE(c.ok());
  constexpr int kMsgs = 6;
  std::string parts[kMsgs];
  iovec iov[kMsgs];
  mmsghdr out[kMsgs]{};
  std::string all;
  for (int i = 0; i < kMsgs; ++i) {
    parts[i] = StreamBytes(TestSeed() + 10 + i, 100u + 3000u * i);
    all += parts[i];
    iov[i] = {parts[i].data(), parts[i].size()};
    out[i].msg_hdr.msg_iov = &iov[i];
    out[i].msg_hdr.msg_iovlen = 1;
  }
  ASSERT_EQ(sendmmsg(c.client.get(), out, kMsgs, 0), kMsgs) << ErrnoName(errno);
  for (int i = 0; i < kMsgs; ++i) EXPECT_EQ(out[i].msg_len, parts[i].size()) << "message " << i;
  ASSERT_TRUE(SendAll(c.client.get(), "tail"));
  // recvmmsg: the first waits, the rest take what is there (MSG_WAITFORONE).
  std::string got;
  std::vector<char> bufs(4 * 8192);
  Deadline deadline(kIoTimeoutMs);
  while (got.size() < all.size() + 4 && !deadline.Expired()) {
    iovec in_iov[4];
    mmsghdr in[4]{};
    for (int i = 0; i < 4; ++i) {
      in_iov[i] = {bufs.data() + 8192 * i, 8192};
      in[i].msg_hdr.msg_iov = &in_iov[i];
      in[i].msg_hdr.msg_iovlen = 1;
    }
    if (!(WaitFor(c.server.get(), POLLIN, 1000) & POLLIN)) continue;
    int n = recvmmsg(c.server.get(), in, 4, MSG_WAITFORONE, nullptr);
    ASSERT_GT(n, 0) << ErrnoName(errno);
    for (int i = 0; i < n; ++i) got.append(bufs.data() + 8192 * i, in[i].msg_len);
  }
  ASSERT_EQ(got.size(), all.size() + 4) << "recvmmsg timed out: the messages did not arrive";
  EXPECT_TRUE(got.substr(0, all.size()) == all) << "bytes differ";
  EXPECT_EQ(got.substr(all.size()), "tail");
}

}  // namespace
}  // namespace vsocket::socktest
