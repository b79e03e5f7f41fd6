#include "tests/socket/test_util.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace vsocket::socktest {
namespace {

// Ends the binary when one test overruns its budget, naming the test: a hung
// socket call under LD_PRELOAD should fail in a minute with a clear message,
// not sit until the Bazel timeout. The thread is started lazily by the first
// test and only waits on a condition variable, so forked children (which
// inherit no threads) are unaffected.
class Watchdog {
 public:
  static Watchdog& Get() {
    static Watchdog* w = new Watchdog;  // never destroyed: the thread outlives main
    return *w;
  }

  void SetBudget(int seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    deadline_ = start_ + std::chrono::seconds(seconds);
    cv_.notify_all();
  }

  void OnTestStart(const ::testing::TestInfo& info) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_started_) {
      thread_started_ = true;
      std::thread([this] { Run(); }).detach();
    }
    name_ = std::string(info.test_suite_name()) + "." + info.name();
    start_ = std::chrono::steady_clock::now();
    deadline_ = start_ + std::chrono::seconds(kDefaultBudgetSeconds);
    armed_ = true;
    cv_.notify_all();
  }

  void OnTestEnd() {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = false;
    cv_.notify_all();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (!armed_) {
        cv_.wait(lock);
        continue;
      }
      if (cv_.wait_until(lock, deadline_) == std::cv_status::timeout && armed_ &&
          std::chrono::steady_clock::now() >= deadline_) {
        std::fprintf(stderr, "\n[watchdog] %s exceeded its time budget; aborting the binary\n", name_.c_str());
        std::fflush(stderr);
        std::_Exit(3);
      }
    }
  }

  static constexpr int kDefaultBudgetSeconds = 60;
  std::mutex mu_;
  std::condition_variable cv_;
  bool thread_started_ = false;
  bool armed_ = false;
  std::string name_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point deadline_;
};

// gtest owns (and deletes at exit) its listeners; the watchdog must outlive
// them, so this forwarder is what gets registered.
class WatchdogListener : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo& info) override { Watchdog::Get().OnTestStart(info); }
  void OnTestEnd(const ::testing::TestInfo&) override { Watchdog::Get().OnTestEnd(); }
};

// A peer that vanishes must surface as EPIPE, never kill the suite. Tests of
// SIGPIPE itself install their own handler and restore SIG_IGN after.
class IgnoreSigpipe : public ::testing::Environment {
 public:
  void SetUp() override { signal(SIGPIPE, SIG_IGN); }
};

const bool kRegistered = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new WatchdogListener);
  ::testing::AddGlobalTestEnvironment(new IgnoreSigpipe);
  return true;
}();

in_addr ParseIpv4Env(const char* var, const char* fallback) {
  const char* s = std::getenv(var);
  if (s == nullptr || *s == '\0') s = fallback;
  in_addr a{};
  if (s == nullptr || inet_pton(AF_INET, s, &a) != 1) {
    std::fprintf(stderr, "%s=%s is not an IPv4 address\n", var, s ? s : "(unset)");
    std::abort();
  }
  return a;
}

}  // namespace

std::string ErrnoName(int err) {
  const char* name = strerrorname_np(err);
  return std::string(name ? name : "E?") + " (" + std::strerror(err) + ")";
}

int Deadline::RemainingMs() const {
  int64_t left = end_ms_ - MonotonicMs();
  if (left < 0) return 0;
  return left > INT_MAX ? INT_MAX : static_cast<int>(left);
}

void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

void SetTestBudgetSeconds(int seconds) { Watchdog::Get().SetBudget(seconds); }

sockaddr_in TestAddr() {
  static const in_addr kAddr = ParseIpv4Env("VSOCKET_TEST_ADDR", "127.0.0.1");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr = kAddr;
  return a;
}

std::optional<sockaddr_in> PeerServerAddr() {
  const char* s = std::getenv("VSOCKET_TEST_PEER_ADDR");
  if (s == nullptr || *s == '\0') return std::nullopt;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr = ParseIpv4Env("VSOCKET_TEST_PEER_ADDR", nullptr);
  const char* p = std::getenv("VSOCKET_TEST_PEER_PORT");
  long port = (p && *p) ? std::strtol(p, nullptr, 10) : 7000;
  if (port <= 0 || port > 65535) {
    std::fprintf(stderr, "VSOCKET_TEST_PEER_PORT=%s is not a port\n", p);
    std::abort();
  }
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

uint64_t TestSeed() {
  static const uint64_t kSeed = []() -> uint64_t {
    const char* s = std::getenv("VSOCKET_TEST_SEED");
    if (s && *s) return std::strtoull(s, nullptr, 0);
    return static_cast<uint64_t>(MonotonicNs()) ^ (static_cast<uint64_t>(getpid()) << 32);
  }();
  std::printf("[ seed     ] VSOCKET_TEST_SEED=%llu\n", static_cast<unsigned long long>(kSeed));
  return kSeed;
}

sockaddr_in SockName(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (getsockname(fd, AsSockaddr(&a), &len) != 0) ADD_FAILURE() << "getsockname: " << ErrnoName(errno);
  return a;
}

sockaddr_in PeerName(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (getpeername(fd, AsSockaddr(&a), &len) != 0) ADD_FAILURE() << "getpeername: " << ErrnoName(errno);
  return a;
}

uint16_t Port(const sockaddr_in& a) { return ntohs(a.sin_port); }

bool SameEndpoint(const sockaddr_in& a, const sockaddr_in& b) {
  return a.sin_family == b.sin_family && a.sin_port == b.sin_port && a.sin_addr.s_addr == b.sin_addr.s_addr;
}

std::string ToString(const sockaddr_in& a) {
  char buf[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf);
  return std::string(buf) + ":" + std::to_string(Port(a));
}

Fd TcpSocket(int type_flags) {
  Fd fd(socket(AF_INET, SOCK_STREAM | type_flags, 0));
  if (!fd.valid()) ADD_FAILURE() << "socket: " << ErrnoName(errno);
  return fd;
}

Fd Listener(int backlog, int type_flags) {
  Fd fd = TcpSocket(type_flags);
  if (!fd.valid()) return fd;
  sockaddr_in a = TestAddr();
  if (bind(fd.get(), AsSockaddr(&a), sizeof a) != 0) {
    ADD_FAILURE() << "bind " << ToString(a) << ": " << ErrnoName(errno);
    return Fd();
  }
  if (listen(fd.get(), backlog) != 0) {
    ADD_FAILURE() << "listen: " << ErrnoName(errno);
    return Fd();
  }
  return fd;
}

Fd ConnectTo(const sockaddr_in& addr) {
  Fd fd = TcpSocket();
  if (!fd.valid()) return fd;
  if (connect(fd.get(), AsSockaddr(&addr), sizeof addr) != 0) {
    ADD_FAILURE() << "connect " << ToString(addr) << ": " << ErrnoName(errno);
    return Fd();
  }
  return fd;
}

Fd AcceptWithin(int listener, int timeout_ms, int flags) {
  Deadline deadline(timeout_ms);
  // A readable listener may still yield EAGAIN if another process (fork
  // tests) took the connection first; retry until the deadline.
  while (!deadline.Expired()) {
    short ev = WaitFor(listener, POLLIN, deadline.RemainingMs());
    if (ev <= 0) break;
    int fd = accept4(listener, nullptr, nullptr, flags);
    if (fd >= 0) return Fd(fd);
    if (errno != EAGAIN && errno != EINTR) {
      ADD_FAILURE() << "accept4: " << ErrnoName(errno);
      return Fd();
    }
  }
  ADD_FAILURE() << "no connection to accept within " << timeout_ms << " ms";
  return Fd();
}

Connection ConnectedPair() {
  Connection c;
  Fd listener = Listener(1);
  if (!listener.valid()) return c;
  c.client = ConnectTo(SockName(listener.get()));
  if (!c.client.valid()) return c;
  c.server = AcceptWithin(listener.get());
  return c;
}

Connection ConnectedPairInUse(int messages, size_t size) {
  Connection c = ConnectedPair();
  if (!c.ok()) return c;
  std::string msg = StreamBytes(TestSeed(), size);
  std::atomic<bool> ok{true};
  for (int dir = 0; dir < 2; ++dir) {
    int from = dir == 0 ? c.client.get() : c.server.get(), to = dir == 0 ? c.server.get() : c.client.get();
    std::thread reader([&] {
      for (int i = 0; i < messages; ++i) {
        std::string got = RecvExactly(to, size);
        EXPECT_EQ(got, msg) << "message " << i << " of direction " << dir;
        if (got != msg) ok = false;
      }
    });
    for (int i = 0; i < messages; ++i) {
      bool sent = SendAll(from, msg);
      EXPECT_TRUE(sent) << "message " << i << " of direction " << dir;
      if (!sent) ok = false;  // (the reader times out on what is missing)
    }
    reader.join();
  }
  return ok ? std::move(c) : Connection{};
}

EchoPeer StartEchoPeer(bool epoll) {
  EchoPeer p;
  Fd listener = Listener();
  if (!listener.valid()) return p;
  sockaddr_in addr = SockName(listener.get());
  p.pid = ForkChild([&] {
    Fd c = ConnectTo(addr);
    if (!c.valid()) return 2;
    char buf[65536];
    for (Deadline d(6 * kIoTimeoutMs); !d.Expired();) {
      if (WaitFor(c.get(), POLLIN, d.RemainingMs()) <= 0) return 3;
      ssize_t n = read(c.get(), buf, sizeof buf);
      if (n == 0) return 0;
      if (n < 0 || !SendAll(c.get(), buf, static_cast<size_t>(n))) return 4;
    }
    return 5;
  });
  if (p.pid <= 0) return p;
  p.conn = AcceptWithin(listener.get());
  if (!p.conn.valid()) return p;
  Fd ep(epoll ? epoll_create1(EPOLL_CLOEXEC) : -1);
  epoll_event ev{};
  ev.events = EPOLLIN;
  if (epoll && (!ep.valid() || epoll_ctl(ep.get(), EPOLL_CTL_ADD, p.conn.get(), &ev) != 0)) {
    ADD_FAILURE() << "epoll: " << ErrnoName(errno);
    p.conn.reset();
    return p;
  }
  const std::string msg = StreamBytes(7, 1024);
  std::thread writer([&] {
    for (int i = 0; i < 80; ++i) EXPECT_TRUE(SendAll(p.conn.get(), msg)) << "message " << i;
  });
  std::string echo;
  char buf[4096];
  for (Deadline d(kIoTimeoutMs); echo.size() < 80 * msg.size() && !d.Expired();) {
    int ready = epoll ? epoll_wait(ep.get(), &ev, 1, d.RemainingMs()) : WaitFor(p.conn.get(), POLLIN, d.RemainingMs());
    if (ready <= 0) break;
    ssize_t n = recv(p.conn.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) echo.append(buf, static_cast<size_t>(n));
    else if (n == 0 || errno != EAGAIN) break;
  }
  writer.join();
  bool ok = echo.size() == 80 * msg.size();
  for (size_t i = 0; ok && i < 80; ++i) ok = echo.compare(i * msg.size(), msg.size(), msg) == 0;
  if (!ok) {
    ADD_FAILURE() << "echo: " << echo.size() << " of " << 80 * msg.size() << " bytes came back in time, or changed";
    p.conn.reset();
  }
  return p;
}

ClosedPort ReserveClosedPort() {
  ClosedPort p;
  p.holder = TcpSocket();
  p.addr = TestAddr();
  if (bind(p.holder.get(), AsSockaddr(&p.addr), sizeof p.addr) != 0) {
    ADD_FAILURE() << "bind: " << ErrnoName(errno);
    return p;
  }
  p.addr = SockName(p.holder.get());
  return p;
}

void CloseWithReset(Fd& fd) {
  linger l{};
  l.l_onoff = 1;
  l.l_linger = 0;
  if (setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &l, sizeof l) != 0)
    ADD_FAILURE() << "SO_LINGER: " << ErrnoName(errno);
  fd.reset();
}

int GetIntOpt(int fd, int level, int name) {
  int v = -1;
  socklen_t len = sizeof v;
  if (getsockopt(fd, level, name, &v, &len) != 0) {
    ADD_FAILURE() << "getsockopt(" << level << ", " << name << "): " << ErrnoName(errno);
    return -1;
  }
  EXPECT_EQ(len, sizeof v);
  return v;
}

int FdFlags(int fd) { return fcntl(fd, F_GETFD); }
int StatusFlags(int fd) { return fcntl(fd, F_GETFL); }

short WaitFor(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  Deadline deadline(timeout_ms);
  for (;;) {
    int n = poll(&p, 1, deadline.RemainingMs());
    if (n > 0) return p.revents;
    if (n == 0) return 0;
    if (errno != EINTR || deadline.Expired()) return -1;
  }
}

bool SendAll(int fd, const void* data, size_t len, int timeout_ms) {
  const auto* p = static_cast<const uint8_t*>(data);
  Deadline deadline(timeout_ms);
  while (len > 0) {
    if (WaitFor(fd, POLLOUT, deadline.RemainingMs()) <= 0) {
      ADD_FAILURE() << "SendAll: not writable in time, " << len << " bytes left";
      return false;
    }
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      ADD_FAILURE() << "SendAll: send: " << ErrnoName(errno);
      return false;
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

bool SendAll(int fd, const std::string& s, int timeout_ms) { return SendAll(fd, s.data(), s.size(), timeout_ms); }

bool RecvExactly(int fd, void* data, size_t len, int timeout_ms) {
  auto* p = static_cast<uint8_t*>(data);
  Deadline deadline(timeout_ms);
  while (len > 0) {
    if (WaitFor(fd, POLLIN, deadline.RemainingMs()) <= 0) {
      ADD_FAILURE() << "RecvExactly: no data in time, " << len << " bytes missing";
      return false;
    }
    ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      ADD_FAILURE() << "RecvExactly: recv: " << ErrnoName(errno);
      return false;
    }
    if (n == 0) {
      ADD_FAILURE() << "RecvExactly: EOF with " << len << " bytes missing";
      return false;
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

std::string RecvExactly(int fd, size_t len, int timeout_ms) {
  std::string s(len, '\0');
  if (!RecvExactly(fd, s.data(), len, timeout_ms)) s.clear();
  return s;
}

std::string RecvUntilEof(int fd, size_t max, bool* eof, int timeout_ms) {
  std::string out;
  *eof = false;
  Deadline deadline(timeout_ms);
  char buf[65536];
  while (out.size() < max) {
    if (WaitFor(fd, POLLIN, deadline.RemainingMs()) <= 0) break;
    ssize_t n = recv(fd, buf, std::min(sizeof buf, max - out.size()), MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      break;
    }
    if (n == 0) {
      *eof = true;
      break;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

int WaitForInq(int fd, int expected, int timeout_ms) {
  Deadline deadline(timeout_ms);
  int inq = -1;
  WaitFor(fd, POLLIN, deadline.RemainingMs());
  // POLLIN means "some data"; the rest of a write may still be in flight
  // (loopback delivers in segments), so re-check briefly until it all landed.
  for (int i = 0; i < 10000; ++i) {
    if (ioctl(fd, FIONREAD, &inq) != 0) return -1;
    if (inq == expected || deadline.Expired()) break;
    SleepMs(1);
  }
  return inq;
}

void FillStream(uint64_t seed, uint64_t offset, uint8_t* out, size_t len) {
  // splitmix64 of the 8-byte word index: random access, cheap, no pattern
  // that a bug shifting data by a few bytes could reproduce.
  auto word = [seed](uint64_t index) {
    uint64_t z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  size_t i = 0;
  while (i < len) {
    uint64_t pos = offset + i;
    uint64_t w = word(pos >> 3);
    unsigned shift = static_cast<unsigned>(pos & 7);
    for (unsigned b = shift; b < 8 && i < len; ++b, ++i) out[i] = static_cast<uint8_t>(w >> (8 * b));
  }
}

std::string StreamBytes(uint64_t seed, size_t len) {
  std::string s(len, '\0');
  FillStream(seed, 0, reinterpret_cast<uint8_t*>(s.data()), len);
  return s;
}

std::string TempDir() {
  const char* t = std::getenv("TMPDIR");
  return (t && *t) ? t : "/tmp";
}

pid_t ForkChild(const std::function<int()>& body) {
  fflush(nullptr);  // no buffered gtest output duplicated by the child
  pid_t pid = fork();
  if (pid == 0) _exit(body());
  if (pid < 0) ADD_FAILURE() << "fork: " << ErrnoName(errno);
  return pid;
}

void ExpectChildSucceeds(const std::function<int()>& body, int timeout_ms) {
  pid_t pid = ForkChild(body);
  ASSERT_GT(pid, 0);
  int status = WaitChild(pid, timeout_ms);
  EXPECT_TRUE(ExitedWith(status, 0)) << "status " << status << " (the child's exit code says which step failed)";
}

int WaitChild(pid_t pid, int timeout_ms) {
  if (pid <= 0) return -1;
  Deadline deadline(timeout_ms);
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) {
      ADD_FAILURE() << "waitpid: " << ErrnoName(errno);
      return -1;
    }
    if (deadline.Expired()) break;
    SleepMs(2);
  }
  ADD_FAILURE() << "child " << pid << " did not exit within " << timeout_ms << " ms; killing it";
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

bool ExitedWith(int status, int code) { return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == code; }

ScopedSignalHandler::ScopedSignalHandler(int sig, void (*handler)(int), int sa_flags) : sig_(sig) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sa.sa_flags = sa_flags;
  sigemptyset(&sa.sa_mask);
  if (sigaction(sig, &sa, &old_) != 0) ADD_FAILURE() << "sigaction: " << ErrnoName(errno);
}

ScopedSignalHandler::~ScopedSignalHandler() { sigaction(sig_, &old_, nullptr); }

Backstop::Backstop(int timeout_ms, std::function<void()> action)
    : thread_([this, timeout_ms, action = std::move(action)] {
        std::unique_lock<std::mutex> lock(mu_);
        if (cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [this] { return done_; })) return;
        fired_ = true;
        action();
      }) {}

Backstop::~Backstop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::atomic<int>& Usr1Count() {
  static std::atomic<int> count{0};
  return count;
}

void CountUsr1(int) { ++Usr1Count(); }

RepeatingSignaller::RepeatingSignaller(pthread_t target)
    : thread_([this, target] {
        for (int i = 0; i < 250 && !stop_; ++i) {
          pthread_kill(target, SIGUSR1);
          SleepMs(20);
        }
      }) {}

void RepeatingSignaller::Stop() {
  stop_ = true;
  if (!thread_.joinable()) return;
  thread_.join();
  // pthread_kill returned before join did, so any signal it sent is pending
  // here; returning from this syscall delivers it.
  SleepMs(1);
}

long RawSyscall(long number, long a, long b, long c) {
  using Fn = long (*)(long, ...);
  static Fn libc_syscall = [] {
    void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    return reinterpret_cast<Fn>(libc != nullptr ? dlsym(libc, "syscall") : nullptr);
  }();
  return libc_syscall(number, a, b, c);
}

}  // namespace vsocket::socktest
