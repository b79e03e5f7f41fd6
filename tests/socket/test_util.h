// Helpers for the black-box socket-semantics suite (tests/socket): the same
// binary runs with and without LD_PRELOAD=libvsocket.so, so everything here
// goes through the public libc socket API only.
//
// Environment:
//   VSOCKET_TEST_ADDR       IPv4 address servers bind and clients connect to
//                           (default 127.0.0.1); servers always bind port 0.
//   VSOCKET_TEST_PEER_ADDR  address of a remote socket_peer (optional).
//   VSOCKET_TEST_PEER_PORT  its port (default 7000).
//   VSOCKET_TEST_SEED       seed for randomized tests (default: time-based,
//                           always printed so a failure can be replayed).
//   VSOCKET_TEST_STRESS_MIB volume of the stress test (default 64).
//
// Every wait is bounded: I/O helpers take a timeout, child processes are
// killed when they overrun, and a watchdog (test_util.cc) ends the binary if
// a single test runs longer than its budget, naming the test.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/unique_fd.h"

namespace vsocket::socktest {

using Fd = ::vsocket::UniqueFd;

// Default bound for one wait in a helper; generous so a loaded 2-core machine
// never trips it, short enough that a hang fails in seconds, not minutes.
inline constexpr int kIoTimeoutMs = 10'000;

// ---------------------------------------------------------------------------
// errno checks. A libc call's errno must be read before any gtest machinery
// runs (it may allocate and clobber errno), hence these macros.

struct SysResult {
  long long ret;
  int err;  // errno right after the call (meaningful when ret == -1)
};

inline SysResult CaptureErrno(long long ret) { return {ret, errno}; }

// A system call that goes around the library even where it is preloaded
// (libc's own syscall(), not the library's, which follows the calls libc
// names): what a program's inline assembly or io_uring would do.
long RawSyscall(long number, long a = 0, long b = 0, long c = 0);

// Evaluates `expr` once with errno cleared and captures its result and errno.
#define VS_SYS(expr) ::vsocket::socktest::CaptureErrno((errno = 0, static_cast<long long>(expr)))

// "EPIPE (Broken pipe)".
std::string ErrnoName(int err);

// `expr` must fail with -1 and errno == `want_errno`.
#define VS_EXPECT_ERRNO(expr, want_errno)                                                                         \
  do {                                                                                                            \
    const ::vsocket::socktest::SysResult vs_r_ = VS_SYS(expr);                                                    \
    EXPECT_EQ(vs_r_.ret, -1) << #expr << " succeeded; want " << ::vsocket::socktest::ErrnoName(want_errno);       \
    if (vs_r_.ret == -1)                                                                                          \
      EXPECT_EQ(vs_r_.err, (want_errno)) << #expr << " failed with " << ::vsocket::socktest::ErrnoName(vs_r_.err) \
                                         << "; want " << ::vsocket::socktest::ErrnoName(want_errno);              \
  } while (0)

#define VS_ASSERT_ERRNO(expr, want_errno)                                                                       \
  do {                                                                                                          \
    const ::vsocket::socktest::SysResult vs_r_ = VS_SYS(expr);                                                  \
    ASSERT_EQ(vs_r_.ret, -1) << #expr << " succeeded; want " << ::vsocket::socktest::ErrnoName(want_errno);     \
    ASSERT_EQ(vs_r_.err, (want_errno)) << #expr << " failed with " << ::vsocket::socktest::ErrnoName(vs_r_.err) \
                                       << "; want " << ::vsocket::socktest::ErrnoName(want_errno);              \
  } while (0)

// `expr` must not return -1. Use an assignment to keep the value:
//   VS_ASSERT_OK(n = recv(fd, buf, sizeof buf, 0));
#define VS_ASSERT_OK(expr)                                                                             \
  do {                                                                                                 \
    const ::vsocket::socktest::SysResult vs_r_ = VS_SYS(expr);                                         \
    ASSERT_NE(vs_r_.ret, -1) << #expr << " failed with " << ::vsocket::socktest::ErrnoName(vs_r_.err); \
  } while (0)

#define VS_EXPECT_OK(expr)                                                                             \
  do {                                                                                                 \
    const ::vsocket::socktest::SysResult vs_r_ = VS_SYS(expr);                                         \
    EXPECT_NE(vs_r_.ret, -1) << #expr << " failed with " << ::vsocket::socktest::ErrnoName(vs_r_.err); \
  } while (0)

// ---------------------------------------------------------------------------
// Time.

class Deadline {
 public:
  explicit Deadline(int64_t ms) : end_ms_(MonotonicMs() + ms) {}
  bool Expired() const { return MonotonicMs() >= end_ms_; }
  // Milliseconds left, clamped to [0, INT_MAX] for poll().
  int RemainingMs() const;

 private:
  int64_t end_ms_;
};

void SleepMs(int ms);

// Lets the watchdog allow the running test `seconds` in total (default 60).
void SetTestBudgetSeconds(int seconds);

// ---------------------------------------------------------------------------
// Addresses.

// VSOCKET_TEST_ADDR, port 0.
sockaddr_in TestAddr();
// VSOCKET_TEST_PEER_ADDR:VSOCKET_TEST_PEER_PORT, or nullopt when unset.
std::optional<sockaddr_in> PeerServerAddr();
// Seed for randomized tests; printed once per test that asks for it.
uint64_t TestSeed();

sockaddr_in SockName(int fd);
sockaddr_in PeerName(int fd);
uint16_t Port(const sockaddr_in& a);
bool SameEndpoint(const sockaddr_in& a, const sockaddr_in& b);
std::string ToString(const sockaddr_in& a);

inline sockaddr* AsSockaddr(sockaddr_in* a) { return reinterpret_cast<sockaddr*>(a); }
inline const sockaddr* AsSockaddr(const sockaddr_in* a) { return reinterpret_cast<const sockaddr*>(a); }

// ---------------------------------------------------------------------------
// Sockets. On failure these record a gtest failure and return an invalid Fd.

// socket(AF_INET, SOCK_STREAM | type_flags, 0).
Fd TcpSocket(int type_flags = 0);
// A TCP listener on TestAddr() port 0.
Fd Listener(int backlog = 64, int type_flags = 0);
// Blocking connect to `addr`.
Fd ConnectTo(const sockaddr_in& addr);
// Waits for a pending connection (poll), then accept4(flags).
Fd AcceptWithin(int listener, int timeout_ms = kIoTimeoutMs, int flags = 0);

// A connected TCP pair over TestAddr(): `client` connect()ed, `server`
// accept()ed, both blocking, neither CLOEXEC.
struct Connection {
  Fd client;
  Fd server;
  bool ok() const { return client.valid() && server.valid(); }
};
Connection ConnectedPair();
// A connected pair that has carried `messages` messages of `size` bytes each
// way, every byte checked (preloaded: upgraded, at its first I/O, or under
// the default policy once that is a stream: 80 of 1 KiB are). Not ok() if
// any of it failed (the failure is recorded).
Connection ConnectedPairInUse(int messages = 1, size_t size = 4);

// A bound, never-listening socket holds a port nobody accepts on: connecting
// to it is refused, and no other test can take the port meanwhile.
struct ClosedPort {
  Fd holder;
  sockaddr_in addr;
};
ClosedPort ReserveClosedPort();

// A connection to an echo server in a forked child (another process: its
// own session, preloaded), in use both ways: 80 KiB in 1 KiB messages sent
// by a thread while their echo streams back (preloaded: upgraded, under the
// default policy too). The echo is awaited with poll, or with epoll_wait
// when `epoll` (each before its read). The child echoes until EOF, then
// exits 0. `conn` is invalid if any of it failed (the failure is recorded).
struct EchoPeer {
  pid_t pid = -1;
  Fd conn;
};
EchoPeer StartEchoPeer(bool epoll = false);

// Closes `fd` with SO_LINGER {1, 0}, which makes the kernel send RST.
void CloseWithReset(Fd& fd);

int GetIntOpt(int fd, int level, int name);
int FdFlags(int fd);      // fcntl(F_GETFD)
int StatusFlags(int fd);  // fcntl(F_GETFL)

// ---------------------------------------------------------------------------
// Bounded I/O. All of these poll() before each call so they never block past
// their timeout, and work on blocking and non-blocking sockets alike.

// poll() one fd; returns revents, 0 on timeout, -1 on error.
short WaitFor(int fd, short events, int timeout_ms = kIoTimeoutMs);
// Sends every byte (send with MSG_NOSIGNAL, partial sends resumed).
bool SendAll(int fd, const void* data, size_t len, int timeout_ms = kIoTimeoutMs);
bool SendAll(int fd, const std::string& s, int timeout_ms = kIoTimeoutMs);
// Receives exactly `len` bytes; false on EOF, error or timeout.
bool RecvExactly(int fd, void* data, size_t len, int timeout_ms = kIoTimeoutMs);
std::string RecvExactly(int fd, size_t len, int timeout_ms = kIoTimeoutMs);
// Receives until EOF (recv returns 0). `*eof` tells whether EOF was seen
// before the timeout, an error, or `max` bytes.
std::string RecvUntilEof(int fd, size_t max, bool* eof, int timeout_ms = kIoTimeoutMs);
// Polls until FIONREAD reports `expected` bytes; returns the last count.
int WaitForInq(int fd, int expected, int timeout_ms = kIoTimeoutMs);

// Deterministic test data: byte i is a hash of (seed, i), so a receiver can
// check any chunk of a stream knowing only its offset.
void FillStream(uint64_t seed, uint64_t offset, uint8_t* out, size_t len);
std::string StreamBytes(uint64_t seed, size_t len);

// ---------------------------------------------------------------------------
// Processes and signals.

// $TMPDIR, or /tmp.
std::string TempDir();

// Forks; the child runs `body` and _exit()s with its return value. The body
// must not use gtest assertions (report through the exit code instead).
pid_t ForkChild(const std::function<int()>& body);
// Waits for `pid`; SIGKILLs and reaps it if it overruns. Returns the wait
// status, or -1 if it had to be killed.
int WaitChild(pid_t pid, int timeout_ms = kIoTimeoutMs);
// True if `status` is a normal exit with `code`.
bool ExitedWith(int status, int code);
// Runs `body` in a forked child and expects it to exit 0 within timeout_ms
// (killed after it); a body returns which step failed as its exit code.
void ExpectChildSucceeds(const std::function<int()>& body, int timeout_ms = kIoTimeoutMs);

// Installs a handler for the scope of the object; restores the old one after.
class ScopedSignalHandler {
 public:
  ScopedSignalHandler(int sig, void (*handler)(int), int sa_flags);
  ~ScopedSignalHandler();
  ScopedSignalHandler(const ScopedSignalHandler&) = delete;
  ScopedSignalHandler& operator=(const ScopedSignalHandler&) = delete;

 private:
  int sig_;
  struct sigaction old_;
};

// SIGUSR1 handler that counts deliveries in Usr1Count().
void CountUsr1(int);
std::atomic<int>& Usr1Count();

// Runs `action` on a helper thread unless the scope ends within
// `timeout_ms`. Bounds a test whose subject is a blocking call: the action
// (typically a shutdown()) makes the call return, so a library that never
// wakes it fails that test instead of hanging the binary.
class Backstop {
 public:
  Backstop(int timeout_ms, std::function<void()> action);
  ~Backstop();  // cancels the action if it has not run, then joins
  Backstop(const Backstop&) = delete;
  Backstop& operator=(const Backstop&) = delete;
  bool fired() const { return fired_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;  // guarded by mu_
  std::atomic<bool> fired_{false};
  std::thread thread_;
};

// Sends SIGUSR1 to `target` every 20 ms (for at most ~5 s) until stopped. A
// signal sent before the target blocks is simply handled early, so repeating
// is what makes interrupting a blocked call certain.
class RepeatingSignaller {
 public:
  explicit RepeatingSignaller(pthread_t target);
  ~RepeatingSignaller() { Stop(); }
  // Joins the sender, then makes one syscall so that a signal still pending
  // on this thread is delivered before the caller restores its handler.
  void Stop();

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace vsocket::socktest
