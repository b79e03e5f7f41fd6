// Built with -D_FORTIFY_SOURCE=2 -O2 (see BUILD): with a buffer of known size
// and a run-time length, glibc routes read/recv/recvfrom/pread to
// __read_chk/__recv_chk/__recvfrom_chk/__pread_chk, poll/ppoll to
// __poll_chk/__ppoll_chk, and FD_SET/FD_ISSET to __fdelt_chk. Applications
// built this way (most distribution packages) only ever call the _chk names,
// so an LD_PRELOAD library must intercept those too, keeping their checks.
#include <poll.h>
#include <signal.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#if !defined(__USE_FORTIFY_LEVEL) || __USE_FORTIFY_LEVEL < 2
#error "fortify_test.cc must be built with -D_FORTIFY_SOURCE=2 and optimization"
#endif

#include <string>

#include "tests/socket/test_util.h"

namespace vsocket::socktest {
namespace {

// Hides a value from the optimizer so a length stays a run-time value and
// the fortified wrapper must call the _chk function instead of the plain one.
[[gnu::noinline]] size_t Opaque(size_t v) {
  asm volatile("" : "+r"(v));
  return v;
}

TEST(Fortify, ReadRecvRecvfromWithKnownBufferSizeDeliverData) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  char buf[64];
  ASSERT_TRUE(SendAll(c.client.get(), "read_chk"));
  ASSERT_EQ(WaitForInq(c.server.get(), 8), 8);
  EXPECT_EQ(read(c.server.get(), buf, Opaque(sizeof buf)), 8) << ErrnoName(errno);  // __read_chk
  EXPECT_EQ(std::string(buf, 8), "read_chk");

  ASSERT_TRUE(SendAll(c.client.get(), "recv_chk"));
  ASSERT_EQ(WaitForInq(c.server.get(), 8), 8);
  EXPECT_EQ(recv(c.server.get(), buf, Opaque(sizeof buf), 0), 8);  // __recv_chk
  EXPECT_EQ(std::string(buf, 8), "recv_chk");

  ASSERT_TRUE(SendAll(c.client.get(), "recvfrom_chk"));
  ASSERT_EQ(WaitForInq(c.server.get(), 12), 12);
  EXPECT_EQ(recvfrom(c.server.get(), buf, Opaque(sizeof buf), 0, nullptr, nullptr),
            12);  // __recvfrom_chk
  EXPECT_EQ(std::string(buf, 12), "recvfrom_chk");

  VS_EXPECT_ERRNO(recv(c.server.get(), buf, Opaque(sizeof buf), MSG_DONTWAIT), EAGAIN);
  c.client.reset();
  ASSERT_TRUE(WaitFor(c.server.get(), POLLIN) & POLLIN);
  EXPECT_EQ(read(c.server.get(), buf, Opaque(sizeof buf)), 0) << "EOF through __read_chk";
}

TEST(Fortify, PreadOnSocketFailsEspipe) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  char buf[16];
  VS_EXPECT_ERRNO(pread(c.server.get(), buf, Opaque(sizeof buf), 0), ESPIPE);  // __pread_chk
}

TEST(Fortify, PollAndPpollOnFixedArraysReportReadiness) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  pollfd p[2] = {{c.server.get(), POLLIN, 0}, {c.client.get(), POLLOUT, 0}};
  EXPECT_EQ(poll(p, Opaque(2), 0), 1);  // __poll_chk
  EXPECT_EQ(p[0].revents, 0);
  EXPECT_EQ(p[1].revents, POLLOUT);
  ASSERT_TRUE(SendAll(c.client.get(), "x"));
  timespec ts{kIoTimeoutMs / 1000, 0};
  p[1].events = 0;
  EXPECT_EQ(ppoll(p, Opaque(2), &ts, nullptr), 1);  // __ppoll_chk
  EXPECT_EQ(p[0].revents, POLLIN);
}

TEST(Fortify, SelectWithFdSetThroughFdeltChkReportsReadable) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const int fd = static_cast<int>(Opaque(static_cast<size_t>(c.server.get())));
  ASSERT_TRUE(SendAll(c.client.get(), "sel"));
  fd_set r;
  FD_ZERO(&r);
  FD_SET(fd, &r);  // __fdelt_chk
  timeval tv{kIoTimeoutMs / 1000, 0};
  EXPECT_EQ(select(fd + 1, &r, nullptr, nullptr, &tv), 1) << ErrnoName(errno);
  EXPECT_TRUE(FD_ISSET(fd, &r));  // __fdelt_chk
}

// The check itself must survive interception: asking __recv_chk for more
// than the buffer holds aborts before any data is touched.
TEST(FortifyDeathTest, RecvLongerThanKnownBufferAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        Connection c = ConnectedPair();
        char buf[16];
        (void)!recv(c.server.get(), buf, Opaque(sizeof buf + 1), MSG_DONTWAIT);
        std::_Exit(0);  // not reached when the check works
      },
      ::testing::KilledBySignal(SIGABRT), "");
}

}  // namespace
}  // namespace vsocket::socktest
