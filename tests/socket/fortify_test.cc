// The glibc fortify entry points. A program built with -D_FORTIFY_SOURCE=2
// (most distribution packages) never calls read/recv/recvfrom/pread/poll/
// ppoll on a buffer of known size: the compiler emits __read_chk,
// __recv_chk, __recvfrom_chk, __pread_chk, __poll_chk and __ppoll_chk, and
// FD_SET/FD_ISSET call __fdelt_chk. An LD_PRELOAD library must intercept
// those names as well, and keep their overflow checks.
//
// This unit is built with -D_FORTIFY_SOURCE=2 -O2 (BUILD), which is what
// makes FD_SET use __fdelt_chk and declares the _chk functions. GCC would
// also rewrite the plain calls, but clang 14 with glibc 2.36 does not: it
// ignores glibc's gnu_inline wrappers because they call themselves through
// an asm label. So the tests call the _chk functions directly, with the
// arguments a fortified caller passes (buflen = the buffer's size).
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

// Hides a value from the optimizer so that FD_SET cannot check it at
// compile time and must call __fdelt_chk.
[[gnu::noinline]] int Opaque(int v) {
  asm volatile("" : "+r"(v));
  return v;
}

TEST(Fortify, ReadChkRecvChkRecvfromChkDeliverDataAndEof) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  char buf[64];
  ASSERT_TRUE(SendAll(c.client.get(), "read_chk"));
  ASSERT_EQ(WaitForInq(c.server.get(), 8), 8);
  EXPECT_EQ(__read_chk(c.server.get(), buf, sizeof buf, sizeof buf), 8) << ErrnoName(errno);
  EXPECT_EQ(std::string(buf, 8), "read_chk");

  ASSERT_TRUE(SendAll(c.client.get(), "recv_chk"));
  ASSERT_EQ(WaitForInq(c.server.get(), 8), 8);
  EXPECT_EQ(__recv_chk(c.server.get(), buf, sizeof buf, sizeof buf, 0), 8) << ErrnoName(errno);
  EXPECT_EQ(std::string(buf, 8), "recv_chk");

  ASSERT_TRUE(SendAll(c.client.get(), "recvfrom_chk"));
  ASSERT_EQ(WaitForInq(c.server.get(), 12), 12);
  sockaddr_in from;
  socklen_t len = sizeof from;
  EXPECT_EQ(__recvfrom_chk(c.server.get(), buf, sizeof buf, sizeof buf, 0, AsSockaddr(&from), &len), 12)
      << ErrnoName(errno);
  EXPECT_EQ(std::string(buf, 12), "recvfrom_chk");

  // MSG_PEEK through __recv_chk leaves the data for the next call.
  ASSERT_TRUE(SendAll(c.client.get(), "peek"));
  ASSERT_EQ(WaitForInq(c.server.get(), 4), 4);
  EXPECT_EQ(__recv_chk(c.server.get(), buf, sizeof buf, sizeof buf, MSG_PEEK), 4);
  EXPECT_EQ(__read_chk(c.server.get(), buf, sizeof buf, sizeof buf), 4);
  EXPECT_EQ(std::string(buf, 4), "peek");

  VS_EXPECT_ERRNO(__recv_chk(c.server.get(), buf, sizeof buf, sizeof buf, MSG_DONTWAIT), EAGAIN);
  c.client.reset();
  ASSERT_TRUE(WaitFor(c.server.get(), POLLIN) & POLLIN);
  EXPECT_EQ(__read_chk(c.server.get(), buf, sizeof buf, sizeof buf), 0) << "EOF";
}

TEST(Fortify, PreadChkOnSocketFailsEspipe) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  char buf[16];
  VS_EXPECT_ERRNO(__pread_chk(c.server.get(), buf, sizeof buf, 0, sizeof buf), ESPIPE);
}

TEST(Fortify, PollChkAndPpollChkReportReadiness) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  pollfd p[2] = {{c.server.get(), POLLIN, 0}, {c.client.get(), POLLOUT, 0}};
  EXPECT_EQ(__poll_chk(p, 2, 0, sizeof p), 1) << ErrnoName(errno);
  EXPECT_EQ(p[0].revents, 0);
  EXPECT_EQ(p[1].revents, POLLOUT);
  ASSERT_TRUE(SendAll(c.client.get(), "x"));
  p[1].events = 0;
  EXPECT_EQ(__poll_chk(p, 2, kIoTimeoutMs, sizeof p), 1) << ErrnoName(errno);
  EXPECT_EQ(p[0].revents, POLLIN);
  timespec ts{0, 0};
  p[0].revents = 0;
  EXPECT_EQ(__ppoll_chk(p, 2, &ts, nullptr, sizeof p), 1) << ErrnoName(errno);
  EXPECT_EQ(p[0].revents, POLLIN);
}

TEST(Fortify, SelectWithFdSetThroughFdeltChkReportsReadable) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const int fd = Opaque(c.server.get());
  ASSERT_TRUE(SendAll(c.client.get(), "sel"));
  fd_set r;
  FD_ZERO(&r);
  FD_SET(fd, &r);  // __fdelt_chk
  timeval tv{kIoTimeoutMs / 1000, 0};
  EXPECT_EQ(select(fd + 1, &r, nullptr, nullptr, &tv), 1) << ErrnoName(errno);
  EXPECT_TRUE(FD_ISSET(fd, &r));  // __fdelt_chk
}

// The checks must survive interception: asking for more than the buffer
// holds aborts before any data is touched. Each of these runs in a death-test
// child and exits 0 only if the check did not fire.
void RecvChkPastBuffer() {
  Connection c = ConnectedPair();
  char buf[16];
  (void)!__recv_chk(c.server.get(), buf, sizeof buf + 1, sizeof buf, MSG_DONTWAIT);
  std::_Exit(0);
}

void ReadChkPastBuffer() {
  Connection c = ConnectedPair();
  char buf[16];
  (void)!__read_chk(c.server.get(), buf, sizeof buf + 1, sizeof buf);
  std::_Exit(0);
}

void PollChkPastArray() {
  pollfd p[1] = {{-1, 0, 0}};
  (void)!__poll_chk(p, 2, 0, sizeof p);
  std::_Exit(0);
}

TEST(FortifyDeathTest, RecvChkLongerThanBufferAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(RecvChkPastBuffer(), ::testing::KilledBySignal(SIGABRT), "");
}

TEST(FortifyDeathTest, ReadChkLongerThanBufferAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(ReadChkPastBuffer(), ::testing::KilledBySignal(SIGABRT), "");
}

TEST(FortifyDeathTest, PollChkWithMoreFdsThanArrayAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(PollChkPastArray(), ::testing::KilledBySignal(SIGABRT), "");
}

}  // namespace
}  // namespace vsocket::socktest
