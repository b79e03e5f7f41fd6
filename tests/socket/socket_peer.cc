// socket_peer ADDR PORT: the remote end for the socket-semantics suite, run
// in another network namespace (or on another host) so the suite can talk to
// a peer that is not in its own process. Plain POSIX; no test framework.
//
// Per accepted connection (one thread each) the client sends a 1-byte
// command, then its arguments:
//   'E'             echo every byte back until EOF, then close
//   'S' <u64 LE N>  send N bytes, byte i = (i*131+7) & 0xff, then close
//   'R'             read until EOF, reply <u64 LE count><u32 LE CRC-32C>, close
//   'X'             read 1 byte, then close with RST (SO_LINGER {1, 0})
// Anything else closes the connection. Connections idle for 30 s are closed.
// PORT may be 0; the chosen port is printed as "listening on ADDR PORT".
// SIGTERM or SIGINT stops the server.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <thread>

#include "base/unique_fd.h"
#include "proto/control.h"

namespace vsocket::socktest {
namespace {

constexpr int kIdleTimeoutMs = 30'000;
constexpr int kMaxConnections = 256;

std::atomic<int> g_connections{0};
int g_stop_pipe_write = -1;

void OnStopSignal(int) {
  const char c = 's';
  // Async-signal-safe wakeup of the accept loop; nothing to do on failure.
  (void)!write(g_stop_pipe_write, &c, 1);
}

inline uint8_t PatternByte(uint64_t i) { return static_cast<uint8_t>((i * 131 + 7) & 0xff); }

// One client connection. The socket is non-blocking and every wait is a
// poll() bounded by the idle timeout, so a silent client cannot pin a thread.
class Session {
 public:
  explicit Session(int fd) : fd_(fd) {}

  void Run() {
    uint8_t cmd = 0;
    if (!ReadExactly(&cmd, 1)) return;
    switch (cmd) {
      case 'E': Echo(); break;
      case 'S': {
        uint8_t le[8];
        if (ReadExactly(le, sizeof le)) SendPattern(DecodeLe64(le));
        break;
      }
      case 'R': CountAndChecksum(); break;
      case 'X': {
        uint8_t b;
        if (ReadExactly(&b, 1)) Reset();
        break;
      }
      default: break;
    }
  }

 private:
  static uint64_t DecodeLe64(const uint8_t* p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
  }

  bool Wait(short events) {
    pollfd p{fd_.get(), events, 0};
    for (;;) {
      int n = poll(&p, 1, kIdleTimeoutMs);
      if (n > 0) return true;
      if (n == 0) return false;  // idle: give up on this client
      if (errno != EINTR) return false;
    }
  }

  // >0 bytes read, 0 on EOF, -1 on error or idle timeout.
  ssize_t ReadSome(void* buf, size_t len) {
    for (;;) {
      ssize_t n = recv(fd_.get(), buf, len, 0);
      if (n >= 0) return n;
      if (errno == EINTR) continue;
      if (errno != EAGAIN || !Wait(POLLIN)) return -1;
    }
  }

  bool ReadExactly(void* buf, size_t len) {
    auto* p = static_cast<uint8_t*>(buf);
    while (len > 0) {
      ssize_t n = ReadSome(p, len);
      if (n <= 0) return false;
      p += n;
      len -= static_cast<size_t>(n);
    }
    return true;
  }

  bool WriteAll(const void* buf, size_t len) {
    const auto* p = static_cast<const uint8_t*>(buf);
    while (len > 0) {
      ssize_t n = send(fd_.get(), p, len, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN || !Wait(POLLOUT)) return false;
        continue;
      }
      p += n;
      len -= static_cast<size_t>(n);
    }
    return true;
  }

  void Echo() {
    uint8_t buf[64 * 1024];
    for (;;) {
      ssize_t n = ReadSome(buf, sizeof buf);
      if (n <= 0 || !WriteAll(buf, static_cast<size_t>(n))) return;
    }
  }

  void SendPattern(uint64_t total) {
    uint8_t buf[64 * 1024];
    for (uint64_t off = 0; off < total;) {
      size_t chunk = static_cast<size_t>(std::min<uint64_t>(sizeof buf, total - off));
      for (size_t i = 0; i < chunk; ++i) buf[i] = PatternByte(off + i);
      if (!WriteAll(buf, chunk)) return;
      off += chunk;
    }
    // Half-close, then drain: closing with unread input would send RST and
    // could destroy data the client has not read yet.
    shutdown(fd_.get(), SHUT_WR);
    while (ReadSome(buf, sizeof buf) > 0) {}
  }

  void CountAndChecksum() {
    uint8_t buf[64 * 1024];
    uint64_t count = 0;
    uint32_t crc = 0;
    for (;;) {
      ssize_t n = ReadSome(buf, sizeof buf);
      if (n < 0) return;
      if (n == 0) break;
      crc = proto::Crc32c(std::span<const uint8_t>(buf, static_cast<size_t>(n)), crc);
      count += static_cast<uint64_t>(n);
    }
    uint8_t reply[12];
    for (int i = 0; i < 8; ++i) reply[i] = static_cast<uint8_t>(count >> (8 * i));
    for (int i = 0; i < 4; ++i) reply[8 + i] = static_cast<uint8_t>(crc >> (8 * i));
    WriteAll(reply, sizeof reply);
  }

  void Reset() {
    linger l{};
    l.l_onoff = 1;
    l.l_linger = 0;
    setsockopt(fd_.get(), SOL_SOCKET, SO_LINGER, &l, sizeof l);
    fd_.reset();
  }

  UniqueFd fd_;
};

UniqueFd ListenOn(const char* addr, const char* port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(addr, port, &hints, &res);
  if (rc != 0) {
    std::fprintf(stderr, "socket_peer: %s %s: %s\n", addr, port, gai_strerror(rc));
    return UniqueFd();
  }
  UniqueFd fd(socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  int one = 1;
  if (!fd.valid() || setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(fd.get(), res->ai_addr, res->ai_addrlen) != 0 || listen(fd.get(), 128) != 0) {
    std::fprintf(stderr, "socket_peer: listen on %s %s: %s\n", addr, port, std::strerror(errno));
    fd.reset();
  }
  freeaddrinfo(res);
  return fd;
}

uint16_t BoundPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

int Main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s ADDR PORT\n", argv[0]);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  int stop_pipe[2];
  if (pipe2(stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return 1;
  g_stop_pipe_write = stop_pipe[1];
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  UniqueFd listener = ListenOn(argv[1], argv[2]);
  if (!listener.valid()) return 1;
  std::printf("listening on %s %u\n", argv[1], BoundPort(listener.get()));
  std::fflush(stdout);

  for (;;) {
    pollfd p[2] = {{listener.get(), POLLIN, 0}, {stop_pipe[0], POLLIN, 0}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      std::perror("socket_peer: poll");
      return 1;
    }
    if (p[1].revents != 0) break;
    if ((p[0].revents & POLLIN) == 0) continue;
    int fd = accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;  // EAGAIN, ECONNABORTED, EMFILE...: keep serving
    if (g_connections.load() >= kMaxConnections) {
      close(fd);
      continue;
    }
    ++g_connections;
    std::thread([fd] {
      Session(fd).Run();
      --g_connections;
    }).detach();
  }
  return 0;  // exiting ends the detached sessions with the process
}

}  // namespace
}  // namespace vsocket::socktest

int main(int argc, char** argv) { return vsocket::socktest::Main(argc, argv); }
