// How connections end: shutdown(SHUT_RD/SHUT_WR/SHUT_RDWR), close, EOF
// ordering, RST (ECONNRESET, then EOF/EPIPE), SIGPIPE and MSG_NOSIGNAL.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "tests/socket/test_util.h"

namespace vsocket::socktest {
namespace {

// Waits until `fd` reports that the connection ended (peer FIN or RST).
void WaitForPeerGone(int fd) {
  short ev = WaitFor(fd, POLLRDHUP);
  ASSERT_GT(ev, 0) << "peer end not reported in time";
}

// Waits until the RST sent by the peer has been processed here.
void WaitForReset(int fd) {
  Deadline deadline(kIoTimeoutMs);
  while (!deadline.Expired()) {
    short ev = WaitFor(fd, POLLIN, deadline.RemainingMs());
    if (ev < 0 || (ev & POLLERR)) return;
    SleepMs(1);  // POLLIN alone: FIN seen, RST still in flight
  }
  ADD_FAILURE() << "no POLLERR after peer reset";
}

// ---------------------------------------------------------------------------
// shutdown

TEST(Shutdown, ShutWrGivesPeerEofWhileOtherDirectionKeepsWorking) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(SendAll(c.client.get(), "last words"));
  VS_ASSERT_OK(shutdown(c.client.get(), SHUT_WR));
  bool eof = false;
  EXPECT_EQ(RecvUntilEof(c.server.get(), 1000, &eof), "last words");
  EXPECT_TRUE(eof);
  char b;
  EXPECT_EQ(read(c.server.get(), &b, 1), 0) << "EOF repeats";
  // The other direction is untouched.
  ASSERT_TRUE(SendAll(c.server.get(), "reply after eof"));
  EXPECT_EQ(RecvExactly(c.client.get(), 15), "reply after eof");
  EXPECT_TRUE(SameEndpoint(PeerName(c.client.get()), SockName(c.server.get())));
  EXPECT_TRUE(SameEndpoint(PeerName(c.server.get()), SockName(c.client.get())));
  VS_EXPECT_ERRNO(send(c.client.get(), "x", 1, MSG_NOSIGNAL), EPIPE);
}

// Linux keeps data that arrived before SHUT_RD readable, then reports EOF
// without blocking. (What happens to data arriving after SHUT_RD differs
// between systems and is not checked.)
TEST(Shutdown, ShutRdReturnsQueuedDataThenEofWithoutBlockingAndSendingStillWorks) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(SendAll(c.client.get(), "queued"));
  ASSERT_EQ(WaitForInq(c.server.get(), 6), 6);
  VS_ASSERT_OK(shutdown(c.server.get(), SHUT_RD));
  short ev = WaitFor(c.server.get(), POLLIN | POLLRDHUP, 0);
  EXPECT_TRUE(ev & POLLIN) << "revents " << ev;
  EXPECT_TRUE(ev & POLLRDHUP) << "revents " << ev;
  char buf[16];
  EXPECT_EQ(recv(c.server.get(), buf, sizeof buf, 0), 6) << ErrnoName(errno);
  EXPECT_EQ(std::string(buf, 6), "queued");
  EXPECT_EQ(recv(c.server.get(), buf, sizeof buf, MSG_DONTWAIT), 0) << ErrnoName(errno);
  {
    Backstop backstop(kIoTimeoutMs, [&] { send(c.client.get(), "!", 1, MSG_NOSIGNAL); });
    EXPECT_EQ(recv(c.server.get(), buf, sizeof buf, 0), 0) << "blocking recv after SHUT_RD";
  }
  ASSERT_TRUE(SendAll(c.server.get(), "still sending"));
  EXPECT_EQ(RecvExactly(c.client.get(), 13), "still sending");
}

TEST(Shutdown, ShutRdwrGivesPeerEofAndLocalPollhupButKeepsTheDescriptor) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  VS_ASSERT_OK(shutdown(c.client.get(), SHUT_RDWR));
  short ev = WaitFor(c.client.get(), POLLIN, 0);
  EXPECT_TRUE(ev & POLLHUP) << "revents " << ev;
  ASSERT_TRUE(WaitFor(c.server.get(), POLLIN) & POLLIN);
  char b;
  EXPECT_EQ(read(c.server.get(), &b, 1), 0);
  EXPECT_EQ(read(c.client.get(), &b, 1), 0);
  // Still a valid descriptor until close().
  EXPECT_EQ(GetIntOpt(c.client.get(), SOL_SOCKET, SO_TYPE), SOCK_STREAM);
  VS_EXPECT_OK(shutdown(c.client.get(), SHUT_RDWR));  // repeating is harmless
  VS_EXPECT_OK(close(c.client.release()));
}

TEST(Shutdown, OnUnconnectedSocketFailsEnotconnAndBadHowFailsEinval) {
  Fd s = TcpSocket();
  VS_EXPECT_ERRNO(shutdown(s.get(), SHUT_WR), ENOTCONN);
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  VS_EXPECT_ERRNO(shutdown(c.client.get(), 7), EINVAL);
  ASSERT_TRUE(SendAll(c.client.get(), "ok"));
  EXPECT_EQ(RecvExactly(c.server.get(), 2), "ok");
}

TEST(Shutdown, WakesThreadBlockedInRecvWithEof) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  ssize_t n = -2;
  int err = 0;
  std::thread reader([&] {
    char b;
    n = recv(c.server.get(), &b, 1, 0);
    err = errno;
  });
  SleepMs(50);  // usually lets the reader block first; either order must give EOF
  VS_EXPECT_OK(shutdown(c.server.get(), SHUT_RDWR));
  {
    Backstop backstop(kIoTimeoutMs, [&] { send(c.client.get(), "!", 1, MSG_NOSIGNAL); });
    reader.join();
  }
  EXPECT_EQ(n, 0) << ErrnoName(err);
}

// ---------------------------------------------------------------------------
// close, EOF

// A client that sends its request and shuts down writing, then reads a large
// answer; the server reads the request (not to its end), streams the answer
// and only then reads on, to EOF. Under the default upgrade policy both
// ends register once the answer streams, the client after its shutdown: the
// server must still see the EOF (the client's whole stream was on the
// kernel), not wait for bytes that never come.
TEST(Shutdown, ShutWrBeforeTheAnswerStreamsStillGivesTheServerEof) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const size_t kAnswer = 8u << 20;
  const std::string request = StreamBytes(TestSeed() ^ 0x5157, 100);
  const std::string answer = StreamBytes(TestSeed() ^ 0xa45, kAnswer);
  std::atomic<bool> server_ok{false};
  std::string server_error;
  std::thread server([&] {
    const int fd = c.server.get();
    if (RecvExactly(fd, request.size()) != request) {
      server_error = "request";
      return;
    }
    for (size_t off = 0; off < answer.size(); off += 16384) {
      if (!SendAll(fd, answer.data() + off, std::min<size_t>(16384, answer.size() - off))) {
        server_error = "answer at " + std::to_string(off) + ": " + ErrnoName(errno);
        return;
      }
    }
    bool eof = false;
    std::string rest = RecvUntilEof(fd, 16, &eof);
    if (!eof || !rest.empty()) {
      server_error = "no EOF after the request (" + std::to_string(rest.size()) + " more bytes)";
      return;
    }
    server_ok = true;
  });
  const int fd = c.client.get();
  ASSERT_TRUE(SendAll(fd, request));
  VS_ASSERT_OK(shutdown(fd, SHUT_WR));
  bool eof = false;
  std::string got;
  // Many reads in a row: the answer streams on our side too.
  while (got.size() < kAnswer) {
    std::string part = RecvUntilEof(fd, std::min<size_t>(65536, kAnswer - got.size()), &eof);
    if (part.empty()) break;
    got += part;
  }
  server.join();
  EXPECT_TRUE(server_ok) << server_error;
  ASSERT_EQ(got.size(), kAnswer);
  EXPECT_TRUE(got == answer) << "the answer differs";
}

TEST(Close, PeerSeesEofAndClosedNumberFailsEbadf) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  int fd = c.client.release();
  VS_ASSERT_OK(close(fd));
  ASSERT_TRUE(WaitFor(c.server.get(), POLLIN) & POLLIN);
  char b;
  EXPECT_EQ(read(c.server.get(), &b, 1), 0);
  VS_EXPECT_ERRNO(send(fd, "x", 1, MSG_NOSIGNAL), EBADF);
  VS_EXPECT_ERRNO(close(fd), EBADF);
}

std::string NumberServesAPipe(int fd);

// Apache prefork's request without keep-alive: the client's request goes
// before the connection is accelerated (on the kernel socket), the answer
// after it (on the ring); the server shuts down its side and lingers,
// polling and reading (non-blocking) until the client's FIN, and the client
// reads the answer to its EOF and closes. Under --upgrade always the
// workers spun for good: poll said readable, read said EAGAIN (the client,
// which never wrote since the upgrade, had sent no FENCE, and its library
// held its kernel FIN until the server's, deferred until its close).
TEST(Close, ALingeringCloseAfterAnAnswerOnTheRingEndsAtTheClientsClose) {
  SetTestBudgetSeconds(60);
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const std::string request = "GET /f4095 HTTP/1.0\r\n\r\n";
  ASSERT_TRUE(SendAll(c.client.get(), request));
  ASSERT_EQ(RecvExactly(c.server.get(), request.size()), request);
  SleepMs(300);  // (the pairing completes: the answer goes by the ring)
  const std::string answer = StreamBytes(TestSeed(), 4095);
  std::thread client([&] {
    std::string got;
    char buf[8192];
    for (;;) {
      ssize_t n = recv(c.client.get(), buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    EXPECT_EQ(got, answer);
    close(c.client.release());
  });
  ASSERT_TRUE(SendAll(c.server.get(), answer));
  ASSERT_EQ(shutdown(c.server.get(), SHUT_WR), 0);
  ASSERT_EQ(fcntl(c.server.get(), F_SETFL, O_NONBLOCK), 0);
  // The lingering close: poll 100 ms at a time, read until EOF, at most 10 s.
  int readable_but_nothing = 0;
  bool eof = false;
  Deadline deadline(10000);
  while (!eof && !deadline.Expired()) {
    pollfd p{c.server.get(), POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[512];
    ssize_t n = recv(c.server.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) eof = true;
    else if (n < 0 && errno == EAGAIN) ++readable_but_nothing;
  }
  client.join();
  EXPECT_TRUE(eof) << "no EOF within 10 s";
  EXPECT_LT(readable_but_nothing, 10) << "poll said readable and read said EAGAIN " << readable_but_nothing << " times";
}


// A process ended by SIGTERM (a supervisor's stop; Node.js servers have no
// handler for it) with a connection open: its report line is written all
// the same (event "signal"), and it dies of the signal as without the
// library. Before, the line was lost (only exit() wrote them).
TEST(Report, AProcessEndedBySigtermWritesItsLinesAndDiesOfIt) {
  const char* report = getenv("VSOCKET_REPORT");
  if (report == nullptr || *report == '\0') GTEST_SKIP() << "no report (runs with the library)";
  Connection c = ConnectedPairInUse();
  ASSERT_TRUE(c.ok());
  pid_t pid = ForkChild([&] {
    Connection mine = ConnectedPairInUse();  // the child's own, in use
    if (!mine.ok()) return 2;
    raise(SIGTERM);
    return 3;  // (not reached)
  });
  ASSERT_GT(pid, 0);
  int status = WaitChild(pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "status " << status;
  FILE* f = fopen(report, "r");
  ASSERT_NE(f, nullptr);
  char line[2048];
  std::string want = "{\"pid\":" + std::to_string(pid) + ",\"event\":\"signal\"";
  int lines = 0;
  while (fgets(line, sizeof line, f) != nullptr)
    if (std::string(line).rfind(want, 0) == 0) ++lines;
  fclose(f);
  EXPECT_GE(lines, 2) << "the child's connection (both ends) has no line with event signal";
}

// The library leaves SIGINT's action alone (programs test it: CPython
// raises KeyboardInterrupt only where it was the default).
TEST(Report, SigintKeepsTheActionTheProgramStartedWith) {
  struct sigaction sa{};
  ASSERT_EQ(sigaction(SIGINT, nullptr, &sa), 0);
  EXPECT_TRUE(sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN) << "SIGINT has a handler";
}


// libuv (Node.js) closes with syscall(SYS_close, fd): that is a close too.
// Before, the library never saw it: the peer of an accelerated connection
// never got its EOF (it reads the ring), and the rings stayed taken until
// the region was full (127 connections, then every new one on kernel TCP).
TEST(Close, ACloseThroughSyscallIsAClose) {
  Connection c = ConnectedPairInUse();
  ASSERT_TRUE(c.ok());
  int fd = c.client.release();
  ASSERT_EQ(syscall(SYS_close, fd), 0) << ErrnoName(errno);
  ASSERT_TRUE(WaitFor(c.server.get(), POLLIN, 5000) & POLLIN) << "no EOF within 5 s";
  char b;
  EXPECT_EQ(read(c.server.get(), &b, 1), 0);
  EXPECT_EQ(NumberServesAPipe(fd), "");
}

TEST(Close, ConnectionsClosedThroughSyscallGiveTheirRingsBack) {
  SetTestBudgetSeconds(120);
  // Twice as many as a 64 MiB region holds rings for at once.
  for (int i = 0; i < 300; ++i) {
    Connection c = ConnectedPairInUse(2, 1024);
    ASSERT_TRUE(c.ok()) << "connection " << i;
    ASSERT_EQ(syscall(SYS_close, c.client.release()), 0);
    ASSERT_EQ(syscall(SYS_close, c.server.release()), 0);
  }
}

// close_range(2) and closefrom(3) close connections without close(): the
// numbers, once other files take them, are those files' (read and write
// reach a pipe put there, not a connection that is gone). The pipe is put
// on the numbers with the raw dup3 system call, as any call the library
// does not wrap would (pipe(), open(), eventfd() take the lowest free
// number). Returns "" or what went wrong.
// A pipe (pipe2 flags) whose ends are numbered from 4000 up, out of the
// way of the numbers a test puts files on (pipe2 takes the lowest free
// ones, maybe those). Returns "" or what went wrong (then nothing is left
// open).
std::string HighPipe(int p[2], int flags) {
  if (pipe2(p, flags) != 0) return "pipe: " + ErrnoName(errno);
  for (int i = 0; i < 2; ++i) {
    long high = RawSyscall(SYS_fcntl, p[i], F_DUPFD_CLOEXEC, 4000);
    RawSyscall(SYS_close, p[i]);
    p[i] = static_cast<int>(high);
  }
  if (p[0] >= 0 && p[1] >= 0) return "";
  std::string err = "F_DUPFD: " + ErrnoName(errno);
  RawSyscall(SYS_close, p[0]);
  RawSyscall(SYS_close, p[1]);
  return err;
}

std::string PipeOnNumbers(int a, int b) {
  int p[2];
  std::string err = HighPipe(p, 0);
  if (!err.empty()) return err;
  if (RawSyscall(SYS_dup3, p[0], a, O_CLOEXEC) != a || RawSyscall(SYS_dup3, p[1], b, O_CLOEXEC) != b) {
    err = "dup3: " + ErrnoName(errno);
  } else if (write(b, "pipe", 4) != 4) {
    err = "write to the pipe on fd " + std::to_string(b) + ": " + ErrnoName(errno);
  } else {
    char buf[8] = {};
    ssize_t n = read(a, buf, sizeof buf);
    if (n != 4 || std::string(buf, 4) != "pipe")
      err = "read from the pipe on fd " + std::to_string(a) + ": " + std::to_string(n) + " " + ErrnoName(errno);
  }
  RawSyscall(SYS_close, p[0]);
  RawSyscall(SYS_close, p[1]);
  return err;
}

TEST(Close, CloseRangeReleasesConnectionsAndTheirNumbersServeTheNextFile) {
  Connection c = ConnectedPairInUse();
  ASSERT_TRUE(c.ok());
  int a = c.client.release(), b = c.server.release();
  ASSERT_EQ(close_range(static_cast<unsigned>(a), static_cast<unsigned>(a), 0), 0) << ErrnoName(errno);
  ASSERT_EQ(close_range(static_cast<unsigned>(b), static_cast<unsigned>(b), 0), 0) << ErrnoName(errno);
  VS_EXPECT_ERRNO(send(a, "x", 1, MSG_NOSIGNAL), EBADF);
  EXPECT_EQ(PipeOnNumbers(a, b), "");
  close(a);
  close(b);
}

TEST(Close, ClosefromInAChildReleasesConnectionsAndTheirNumbersServeTheNextFile) {
  Connection c = ConnectedPairInUse();
  ASSERT_TRUE(c.ok());
  Connection d = ConnectedPairInUse();  // the child closes from here up
  ASSERT_TRUE(d.ok());
  int a = d.client.get(), b = d.server.get();
  int from = std::min(a, b);
  if (std::min(c.client.get(), c.server.get()) > from) GTEST_SKIP() << "fd numbers not in creation order";
  pid_t pid = ForkChild([&] {
    closefrom(from);
    std::string err = PipeOnNumbers(a, b);
    if (!err.empty()) {
      std::fprintf(stderr, "child: %s\n", err.c_str());
      return 1;
    }
    return 0;
  });
  ASSERT_GT(pid, 0);
  int status = WaitChild(pid);
  EXPECT_TRUE(ExitedWith(status, 0)) << "status " << status;
  // The parent's connections go on, also the ones the child closed.
  ASSERT_TRUE(SendAll(c.client.get(), "still"));
  EXPECT_EQ(RecvExactly(c.server.get(), 5), "still");
  ASSERT_TRUE(SendAll(d.server.get(), "still"));
  EXPECT_EQ(RecvExactly(d.client.get(), 5), "still");
}

// Programs that close every fd they did not open (a daemon setting itself
// up, a close-all loop before its own work) must not take the library's fds
// (its vsocketd socket, eventfds, shared memory) with them: the
// connections they keep go on. Each body runs in a child with a pair of its
// own (under the default policy upgraded: 80 KiB in 1 KiB messages), closes
// everything else its way, then makes round trips, every byte checked.
// Returns "" or what went wrong.
std::string RoundTrips(int a, int b, int count) {
  for (int i = 0; i < count; ++i) {
    const std::string ask = StreamBytes(static_cast<uint64_t>(i), 16 << 10);
    if (!SendAll(a, ask)) return "send " + std::to_string(i) + ": " + ErrnoName(errno);
    if (RecvExactly(b, ask.size()) != ask) return "request " + std::to_string(i) + " lost or changed";
    const std::string answer = StreamBytes(static_cast<uint64_t>(i) + 1000, 4 << 10);
    if (!SendAll(b, answer)) return "answer " + std::to_string(i) + ": " + ErrnoName(errno);
    if (RecvExactly(a, answer.size()) != answer) return "answer " + std::to_string(i) + " lost or changed";
  }
  return "";
}

// The highest fd number a close-all loop visits (the soft limit, at most 65536).
int CloseAllLimit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > 65536) return 65536;
  return static_cast<int>(rl.rlim_cur);
}

// close_all closes everything but the pair's fds a and b and answers the
// numbers the pair has then.
using CloseAllFn = std::function<std::pair<int, int>(int a, int b)>;

int CloseEverythingElseThen(const CloseAllFn& close_all) {
  Connection c = ConnectedPairInUse(80, 1024);
  if (!c.ok()) return 2;
  auto [a, b] = close_all(c.client.release(), c.server.release());
  std::string err = RoundTrips(a, b, 50);
  if (!err.empty()) {
    std::fprintf(stderr, "child: %s\n", err.c_str());
    return 1;
  }
  return 0;
}

void ExpectChildKeepsItsConnection(const CloseAllFn& close_all) {
  SetTestBudgetSeconds(90);
  ExpectChildSucceeds([&] { return CloseEverythingElseThen(close_all); }, 4 * kIoTimeoutMs);
}

TEST(CloseAll, ALoopClosingEveryOtherFdLeavesTheConnectionWorking) {
  ExpectChildKeepsItsConnection([](int a, int b) {
    for (int fd = 3, limit = CloseAllLimit(); fd < limit; ++fd)
      if (fd != a && fd != b) close(fd);
    return std::pair(a, b);
  });
}

TEST(CloseAll, CloseRangeAroundTheConnectionLeavesItWorking) {
  ExpectChildKeepsItsConnection([](int a, int b) {
    unsigned lo = static_cast<unsigned>(std::min(a, b)), hi = static_cast<unsigned>(std::max(a, b));
    if (lo > 3) close_range(3, lo - 1, 0);
    if (hi > lo + 1) close_range(lo + 1, hi - 1, 0);
    close_range(hi + 1, ~0u, 0);
    return std::pair(a, b);
  });
}

// dup2 onto a number replaces what it named: onto the library's own fds
// it is refused (EBUSY) rather than cutting the library off (or letting its
// eventfd writes reach the program's pipe).
TEST(CloseAll, Dup2OntoEveryOtherOpenFdLeavesTheConnectionWorking) {
  ExpectChildKeepsItsConnection([](int a, int b) {
    int p[2];
    if (pipe(p) != 0) _exit(3);
    for (int fd = 3, limit = CloseAllLimit(); fd < limit; ++fd) {
      if (fd == a || fd == b || fd == p[0] || fd == p[1] || fcntl(fd, F_GETFD) < 0) continue;
      if (dup2(p[0], fd) < 0 && errno != EBUSY) {
        std::fprintf(stderr, "child: dup2 onto %d: %s\n", fd, ErrnoName(errno).c_str());
        _exit(4);
      }
    }
    return std::pair(a, b);
  });
}

TEST(CloseAll, ClosefromAfterMovingTheConnectionToThreeAndFourLeavesItWorking) {
  ExpectChildKeepsItsConnection([](int a, int b) {
    // Out of the way first (a or b may be 3 or 4), then onto 3 and 4;
    // closefrom(5) closes every other number of the pair.
    int ta = fcntl(a, F_DUPFD, 200), tb = fcntl(b, F_DUPFD, 200);
    if (ta < 0 || tb < 0 || dup2(ta, 3) != 3 || dup2(tb, 4) != 4) {
      std::fprintf(stderr, "child: moving the pair: %s\n", ErrnoName(errno).c_str());
      _exit(3);
    }
    closefrom(5);
    return std::pair(3, 4);
  });
}

// A vfork child runs in its parent's memory until it execs or exits
// (python's subprocess does: vfork, then close_range over every fd it does
// not pass on, dup2 for the child's stdio, exec). What it closes or dups is
// its own fd table's: the library's tables are the parent's memory and must
// not change. The peer is another process (StartEchoPeer): a connection
// the library lost track of in the parent cannot go on there.
// Round trips through the echo peer, then its end: EOF both ways, exit 0.
void ExpectEchoPeerStillServes(EchoPeer& p) {
  for (int i = 0; i < 20; ++i) {
    const std::string ask = StreamBytes(static_cast<uint64_t>(i) + 50, 16 << 10);
    ASSERT_TRUE(SendAll(p.conn.get(), ask)) << "round trip " << i << ": " << ErrnoName(errno);
    ASSERT_TRUE(RecvExactly(p.conn.get(), ask.size()) == ask) << "round trip " << i << ": echo lost or changed";
  }
  VS_ASSERT_OK(shutdown(p.conn.get(), SHUT_WR));
  ASSERT_TRUE(WaitFor(p.conn.get(), POLLIN) & POLLIN);
  char b;
  EXPECT_EQ(read(p.conn.get(), &b, 1), 0);
  EXPECT_TRUE(ExitedWith(WaitChild(p.pid), 0));
  p.pid = -1;
}

TEST(Vfork, AChildClosingEveryFdBeforeItExitsLeavesTheParentsConnectionWorking) {
  SetTestBudgetSeconds(90);
  EchoPeer p = StartEchoPeer();
  ASSERT_TRUE(p.conn.valid());
  pid_t pid = vfork();
  if (pid == 0) {
    close_range(3, ~0u, 0);  // (python: close_range(5, INT_MAX, 0), its own pipes kept)
    _exit(0);
  }
  ASSERT_GT(pid, 0) << ErrnoName(errno);
  EXPECT_TRUE(ExitedWith(WaitChild(pid), 0));
  ExpectEchoPeerStillServes(p);
  if (p.pid > 0) WaitChild(p.pid);
}

TEST(Vfork, AChildsDupsAndClosesOfTheConnectionAreNotTheParents) {
  SetTestBudgetSeconds(90);
  EchoPeer p = StartEchoPeer();
  ASSERT_TRUE(p.conn.valid());
  int fd = p.conn.get();
  // Two numbers free in the parent, for the child's dups.
  int n1 = fcntl(0, F_DUPFD, 3000), n2 = fcntl(0, F_DUPFD, 3000);
  ASSERT_GE(n1, 0);
  ASSERT_GE(n2, 0);
  close(n1);
  close(n2);
  pid_t pid = vfork();
  if (pid == 0) {
    // (the child's stdio onto the connection, as Popen(stdin=sock) does)
    if (dup2(fd, n1) != n1 || dup3(fd, n2, 0) != n2) _exit(1);
    close(fd);
    closefrom(n1 + 1);
    _exit(0);
  }
  ASSERT_GT(pid, 0) << ErrnoName(errno);
  EXPECT_TRUE(ExitedWith(WaitChild(pid), 0));
  // The child's numbers are free in the parent: a pipe put there is a pipe.
  EXPECT_EQ(PipeOnNumbers(n1, n2), "");
  RawSyscall(SYS_close, n1);
  RawSyscall(SYS_close, n2);
  ExpectEchoPeerStillServes(p);
  if (p.pid > 0) WaitChild(p.pid);
}

// stdio on a connection: glibc's FILE reads, writes and closes through its
// internal calls, and dprintf writes through them. A FILE made by fdopen()
// on a connection in use, and dprintf on one, must carry the bytes in
// order with the other calls, and fclose() must close the connection as
// close() does. In a forked child: with the library before, fgets blocked
// for good on the kernel socket.

// Whether `fd`, once a closed number, serves the next file: a pipe's write
// end put there (raw dup3) takes a write(), and the pipe gives it back.
std::string NumberServesAPipe(int fd) {
  int p[2];
  std::string err = HighPipe(p, O_NONBLOCK);  // (pipe2 may take fd itself)
  if (!err.empty()) return err;
  if (RawSyscall(SYS_dup3, p[1], fd, O_CLOEXEC) != fd) {
    err = "dup3: " + ErrnoName(errno);
  } else if (write(fd, "pipe", 4) != 4) {
    err = "write to the pipe on fd " + std::to_string(fd) + ": " + ErrnoName(errno);
  } else {
    char buf[8] = {};
    ssize_t n = RawSyscall(SYS_read, p[0], reinterpret_cast<long>(buf), sizeof buf);
    if (n != 4 || std::string(buf, 4) != "pipe")
      err = "the pipe on fd " + std::to_string(fd) + " got " + std::to_string(n) + " bytes " + ErrnoName(errno);
  }
  RawSyscall(SYS_close, p[0]);
  RawSyscall(SYS_close, p[1]);
  RawSyscall(SYS_close, fd);
  return err;
}

int FdopenedConnectionBody() {
  Connection c = ConnectedPairInUse(80, 1024);
  if (!c.ok()) return 2;
  int a = c.client.release(), b = c.server.release();
  FILE* fa = fdopen(a, "r+");
  FILE* fb = fdopen(b, "r+");
  if (fa == nullptr || fb == nullptr) return 3;
  if (fileno(fa) != a || fileno(fb) != b) return 4;
  char line[512];
  const std::string pad(300, 'p');
  for (int i = 0; i < 200; ++i) {
    // Lines read with fgets, written by stdio or by send() in turn (a
    // program may read lines with stdio and write with send).
    std::string ask = "ask " + std::to_string(i) + " " + pad + "\n";
    std::string answer = "answer " + std::to_string(i) + "\n";
    if (i % 2 == 0 ? fputs(ask.c_str(), fa) < 0 || fflush(fa) != 0 : !SendAll(a, ask)) return 5;
    if (fgets(line, sizeof line, fb) == nullptr || ask != line) return 6;
    if (i % 3 == 0 ? !SendAll(b, answer) : fprintf(fb, "answer %d\n", i) < 0 || fflush(fb) != 0) return 7;
    if (fgets(line, sizeof line, fa) == nullptr || answer != line) return 8;
  }
  if (fclose(fa) != 0) return 9;
  if (fgets(line, sizeof line, fb) != nullptr || !feof(fb)) return 10;  // EOF after every line
  if (fclose(fb) != 0) return 11;
  for (int fd : {a, b}) {
    std::string err = NumberServesAPipe(fd);  // fclose closed the connection
    if (!err.empty()) {
      std::fprintf(stderr, "child: %s\n", err.c_str());
      return 12;
    }
  }
  return 0;
}

TEST(Stdio, AnFdopenedConnectionInUseCarriesLinesBothWaysAndFcloseClosesIt) {
  SetTestBudgetSeconds(60);
  ExpectChildSucceeds(FdopenedConnectionBody, 3 * kIoTimeoutMs);
}

TEST(Stdio, DprintfOnAConnectionInUseArrivesInOrderWithSends) {
  Connection c = ConnectedPairInUse(80, 1024);
  ASSERT_TRUE(c.ok());
  std::string want;
  for (int i = 0; i < 100; ++i) {
    ASSERT_GT(dprintf(c.client.get(), "<%04d>", i), 0) << ErrnoName(errno);
    ASSERT_TRUE(SendAll(c.client.get(), "|"));
    char item[8];
    std::snprintf(item, sizeof item, "<%04d>", i);
    want += item;
    want += "|";
  }
  EXPECT_EQ(RecvExactly(c.server.get(), want.size()), want);
}

TEST(Close, EofArrivesOnlyAfterAllDataWhenPeerWritesOneMebibyteThenCloses) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const std::string data = StreamBytes(71, 1 << 20);
  std::thread writer([&] {
    // A blocking write queues everything; close right after it must not
    // lose what the reader has not consumed yet.
    ssize_t n = write(c.client.get(), data.data(), data.size());
    EXPECT_EQ(n, static_cast<ssize_t>(data.size())) << ErrnoName(errno);
    c.client.reset();
  });
  std::string got;
  bool eof = false;
  char buf[1000];  // small reads so EOF cannot overtake queued data
  Deadline deadline(kIoTimeoutMs);
  while (!deadline.Expired() && got.size() <= data.size()) {
    if (WaitFor(c.server.get(), POLLIN, deadline.RemainingMs()) <= 0) break;
    ssize_t n = read(c.server.get(), buf, sizeof buf);
    if (n < 0) {
      ADD_FAILURE() << "read: " << ErrnoName(errno);
      break;
    }
    if (n == 0) {
      eof = true;
      break;
    }
    got.append(buf, static_cast<size_t>(n));
  }
  if (!eof) c.server.reset();  // gave up: closing with data unread sends RST, freeing the writer
  writer.join();
  ASSERT_TRUE(eof);
  EXPECT_EQ(got.size(), data.size());
  EXPECT_TRUE(got == data);
  EXPECT_EQ(read(c.server.get(), buf, sizeof buf), 0) << "EOF repeats";
}

// RFC 2525 behaviour: closing with unread received data aborts the
// connection (RST) instead of a graceful FIN.
TEST(Close, WithUnreadReceivedDataResetsConnection) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(SendAll(c.client.get(), "never read"));
  ASSERT_EQ(WaitForInq(c.server.get(), 10), 10);
  c.server.reset();
  WaitForReset(c.client.get());
  char b;
  VS_EXPECT_ERRNO(recv(c.client.get(), &b, 1, 0), ECONNRESET);
}

// Data sent to a socket that was closed (here while its own bytes were not
// yet read, which vSocket answers with a lingering close) resets the
// connection: the sender's sends fail (EPIPE or ECONNRESET) instead of
// blocking forever on a peer that will never read.
TEST(Close, SendingToAClosedPeerEventuallyFails) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  // A few round trips first (preloaded: the connection pairs and switches).
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(SendAll(c.client.get(), "?"));
    ASSERT_EQ(RecvExactly(c.server.get(), 1), "?");
    ASSERT_TRUE(SendAll(c.server.get(), "!"));
    ASSERT_EQ(RecvExactly(c.client.get(), 1), "!");
    SleepMs(20);
  }
  ASSERT_TRUE(SendAll(c.client.get(), StreamBytes(5, 4096)));  // not read by the server yet
  ASSERT_TRUE(WaitFor(c.server.get(), POLLIN) & POLLIN);
  c.client.reset();
  const std::string chunk = StreamBytes(6, 64 << 10);
  int err = 0;
  Deadline deadline(kIoTimeoutMs);
  while (err == 0 && !deadline.Expired()) {
    if (!(WaitFor(c.server.get(), POLLOUT, deadline.RemainingMs()) & (POLLOUT | POLLERR | POLLHUP))) break;
    ssize_t n = send(c.server.get(), chunk.data(), chunk.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) err = errno;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) SleepMs(5);
  }
  EXPECT_TRUE(err == EPIPE || err == ECONNRESET) << "last send: " << ErrnoName(err);
}

// ---------------------------------------------------------------------------
// RST from the peer

TEST(Reset, ReadAfterPeerResetFailsEconnresetOnceThenReturnsEof) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  CloseWithReset(c.server);
  WaitForReset(c.client.get());
  short ev = WaitFor(c.client.get(), POLLIN | POLLOUT | POLLRDHUP, 0);
  EXPECT_TRUE(ev & POLLERR) << "revents " << ev;
  EXPECT_TRUE(ev & POLLHUP) << "revents " << ev;
  char b;
  VS_EXPECT_ERRNO(read(c.client.get(), &b, 1), ECONNRESET);
  EXPECT_EQ(read(c.client.get(), &b, 1), 0) << ErrnoName(errno);
  sockaddr_in a{};
  socklen_t len = sizeof a;
  VS_EXPECT_ERRNO(getpeername(c.client.get(), AsSockaddr(&a), &len), ENOTCONN);
}

TEST(Reset, SoErrorReportsEconnresetOnceAndConsumesIt) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  CloseWithReset(c.server);
  WaitForReset(c.client.get());
  EXPECT_EQ(GetIntOpt(c.client.get(), SOL_SOCKET, SO_ERROR), ECONNRESET);
  EXPECT_EQ(GetIntOpt(c.client.get(), SOL_SOCKET, SO_ERROR), 0);
  char b;
  EXPECT_EQ(recv(c.client.get(), &b, 1, 0), 0) << "error already consumed";
}

TEST(Reset, SendAfterPeerResetFailsEconnresetThenEpipe) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  CloseWithReset(c.server);
  WaitForReset(c.client.get());
  VS_EXPECT_ERRNO(send(c.client.get(), "x", 1, MSG_NOSIGNAL), ECONNRESET);
  VS_EXPECT_ERRNO(send(c.client.get(), "x", 1, MSG_NOSIGNAL), EPIPE);
}

// ---------------------------------------------------------------------------
// SIGPIPE and MSG_NOSIGNAL

std::atomic<int> g_sigpipe_count{0};
void CountSigpipe(int) { ++g_sigpipe_count; }

// Writes with `send_once` to a connection whose peer has gone until EPIPE,
// tolerating the one ECONNRESET (or successful sends) that may come first
// depending on when the peer's RST lands. Returns true once EPIPE is seen.
bool SendUntilEpipe(int fd, const std::function<ssize_t()>& send_once) {
  for (int i = 0; i < 100; ++i) {
    ssize_t n = send_once();
    if (n >= 0 || errno == ECONNRESET) {
      WaitFor(fd, POLLIN, 20);  // give the RST time to arrive
      continue;
    }
    if (errno == EPIPE) return true;
    ADD_FAILURE() << "unexpected " << ErrnoName(errno);
    return false;
  }
  ADD_FAILURE() << "no EPIPE after 100 sends";
  return false;
}

TEST(MsgNosignal, SendAfterPeerCloseAndResetFailsEpipeWithoutSigpipe) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  ScopedSignalHandler handler(SIGPIPE, CountSigpipe, 0);
  g_sigpipe_count = 0;
  CloseWithReset(c.server);
  WaitForPeerGone(c.client.get());
  int fd = c.client.get();
  EXPECT_TRUE(SendUntilEpipe(fd, [fd] { return send(fd, "x", 1, MSG_NOSIGNAL); }));
  EXPECT_EQ(g_sigpipe_count.load(), 0);
}

TEST(MsgNosignal, EverySendVariantAfterShutWrFailsEpipeWithoutSigpipe) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  ScopedSignalHandler handler(SIGPIPE, CountSigpipe, 0);
  g_sigpipe_count = 0;
  int fd = c.client.get();
  VS_ASSERT_OK(shutdown(fd, SHUT_WR));
  char b = 'x';
  iovec iov = {&b, 1};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  VS_EXPECT_ERRNO(send(fd, &b, 1, MSG_NOSIGNAL), EPIPE);
  VS_EXPECT_ERRNO(sendto(fd, &b, 1, MSG_NOSIGNAL, nullptr, 0), EPIPE);
  VS_EXPECT_ERRNO(sendmsg(fd, &m, MSG_NOSIGNAL), EPIPE);
  EXPECT_EQ(g_sigpipe_count.load(), 0);
}

TEST(Sigpipe, WriteAfterPeerCloseAndResetRaisesSigpipeWithEpipe) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  ScopedSignalHandler handler(SIGPIPE, CountSigpipe, 0);
  g_sigpipe_count = 0;
  CloseWithReset(c.server);
  WaitForPeerGone(c.client.get());
  int fd = c.client.get();
  EXPECT_TRUE(SendUntilEpipe(fd, [fd] { return write(fd, "x", 1); }));
  // SIGPIPE is raised synchronously in the failing call, once per EPIPE.
  EXPECT_EQ(g_sigpipe_count.load(), 1);
}

TEST(Sigpipe, EverySendVariantAfterShutWrRaisesOneSigpipe) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  ScopedSignalHandler handler(SIGPIPE, CountSigpipe, 0);
  g_sigpipe_count = 0;
  int fd = c.client.get();
  VS_ASSERT_OK(shutdown(fd, SHUT_WR));
  char b = 'x';
  iovec iov = {&b, 1};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  VS_EXPECT_ERRNO(write(fd, &b, 1), EPIPE);
  EXPECT_EQ(g_sigpipe_count.load(), 1);
  VS_EXPECT_ERRNO(writev(fd, &iov, 1), EPIPE);
  EXPECT_EQ(g_sigpipe_count.load(), 2);
  VS_EXPECT_ERRNO(send(fd, &b, 1, 0), EPIPE);
  EXPECT_EQ(g_sigpipe_count.load(), 3);
  VS_EXPECT_ERRNO(sendto(fd, &b, 1, 0, nullptr, 0), EPIPE);
  EXPECT_EQ(g_sigpipe_count.load(), 4);
  VS_EXPECT_ERRNO(sendmsg(fd, &m, 0), EPIPE);
  EXPECT_EQ(g_sigpipe_count.load(), 5);
}

}  // namespace
}  // namespace vsocket::socktest

namespace vsocket::socktest {
namespace {

// Cancelling a stuck send from another thread, a common idiom: the blocked
// send must return (EPIPE, or the bytes it managed to send), not hang.
TEST(Shutdown, ShutWrFromAnotherThreadEndsABlockedSend) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  // Both directions carry data first (so a preloaded pair has upgraded).
  ASSERT_TRUE(SendAll(c.client.get(), "hello"));
  EXPECT_EQ(RecvExactly(c.server.get(), 5), "hello");
  ASSERT_TRUE(SendAll(c.server.get(), "there"));
  EXPECT_EQ(RecvExactly(c.client.get(), 5), "there");
  std::atomic<bool> done{false};
  std::atomic<ssize_t> result{0};
  std::atomic<int> err{0};
  std::thread sender([&] {
    std::string big(64 << 20, 'x');  // far more than any buffer or ring
    ssize_t n = send(c.client.get(), big.data(), big.size(), MSG_NOSIGNAL);
    err = errno;
    result = n;
    done = true;
  });
  SleepMs(200);  // let it block (nobody reads)
  ASSERT_FALSE(done.load()) << "send of 64 MiB should block while the peer does not read";
  ASSERT_EQ(shutdown(c.client.get(), SHUT_WR), 0) << ErrnoName(errno);
  for (int i = 0; i < 500 && !done.load(); ++i) SleepMs(10);
  bool returned = done.load();
  if (!returned) c.server.reset();  // unblock it anyway so the test ends
  sender.join();
  EXPECT_TRUE(returned) << "send still blocked 5 s after shutdown(SHUT_WR)";
  EXPECT_TRUE(result.load() > 0 || (result.load() == -1 && err.load() == EPIPE))
      << "result " << result.load() << " " << ErrnoName(err.load());
}

}  // namespace
}  // namespace vsocket::socktest
