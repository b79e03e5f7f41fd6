#include "bench/netload_common.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace vsocket::bench {

Options::Options(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string key = argv[i];
    if (key.rfind("--", 0) != 0) {
      std::fprintf(stderr, "netload: unexpected argument '%s'\n", argv[i]);
      std::exit(2);
    }
    // A key followed by another key (or nothing) is a flag.
    bool has_value = i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0;
    values_[key.substr(2)] = has_value ? argv[++i] : "";
  }
}

int64_t Options::Int(const std::string& key, int64_t fallback) const {
  auto it = values_.find(key);
  return it == values_.end() ? fallback : std::strtoll(it->second.c_str(), nullptr, 10);
}

double Options::Real(const std::string& key, double fallback) const {
  auto it = values_.find(key);
  return it == values_.end() ? fallback : std::strtod(it->second.c_str(), nullptr);
}

sockaddr_in ParseAddr(const char* ip, const char* port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::atoi(port)));
  if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
    std::fprintf(stderr, "netload: bad IPv4 address '%s'\n", ip);
    std::exit(2);
  }
  return a;
}

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

double CpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return s(ru.ru_utime) + s(ru.ru_stime);
}

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

namespace {

// Waits for `events` on fd until the deadline; false on timeout.
bool WaitFor(int fd, short events, int64_t deadline_ns) {
  for (;;) {
    int64_t left_ms = (deadline_ns - NowNs()) / 1000000;
    if (left_ms <= 0) return false;
    pollfd p{fd, events, 0};
    int r = poll(&p, 1, static_cast<int>(left_ms > 1000 ? 1000 : left_ms));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

}  // namespace

UniqueFd ConnectBefore(const sockaddr_in& addr, int64_t deadline_ns, bool nodelay) {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
  if (!fd) return fd;
  if (nodelay) SetNoDelay(fd.get());
  if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
  if (errno != EINPROGRESS || !WaitFor(fd.get(), POLLOUT, deadline_ns)) return UniqueFd();
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) return UniqueFd();
  return fd;
}

bool WriteFull(int fd, const uint8_t* p, size_t n, int64_t deadline_ns) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
    } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!WaitFor(fd, POLLOUT, deadline_ns)) return false;
    } else {
      return false;
    }
  }
  return true;
}

bool ReadFull(int fd, uint8_t* p, size_t n, int64_t deadline_ns) {
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!WaitFor(fd, POLLIN, deadline_ns)) return false;
    } else {
      return false;  // EOF or error
    }
  }
  return true;
}

uint8_t PatternByte(uint64_t seed, uint64_t i) {
  // splitmix64 of (seed, word index): cheap, and a shifted or swapped block
  // of another connection's message does not match.
  uint64_t z = seed + (i / 8 + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<uint8_t>(z >> (8 * (i % 8)));
}

uint64_t Fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

void Say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

bool WaitForLine(double timeout_s) {
  int64_t deadline = NowNs() + SecondsToNs(timeout_s);
  char c;
  for (;;) {
    if (!WaitFor(STDIN_FILENO, POLLIN, deadline)) return false;
    ssize_t r = read(STDIN_FILENO, &c, 1);
    if (r <= 0) return false;
    if (c == '\n') return true;
  }
}

}  // namespace vsocket::bench
