// Randomized transfer stress: 32 connections at once, data both ways, random
// write and read sizes (1 B .. 256 KiB) through every send/receive call
// family, partial writes and reads resumed. A third of the connections are
// blocking with a reader and a writer thread per end, a third non-blocking
// driven by one poll() loop, a third non-blocking driven by one
// edge-triggered epoll loop; half of them have small socket buffers so
// that writers hit back-pressure. Every received byte is compared with the
// expected stream and each direction's CRC-32C and count must match.
// Bounded: fails after 120 s (sockets are then shut down to unblock threads).
//
// VSOCKET_TEST_STRESS_MIB sets the total volume (default 64).
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "proto/control.h"
#include "tests/socket/test_util.h"

namespace vsocket::socktest {
namespace {

constexpr int kConnections = 32;
constexpr size_t kMaxIo = 256 * 1024;
constexpr int kTimeLimitSeconds = 120;

// One direction of one connection. The sender fields are touched only by
// the sending side, the receiver fields only by the receiving side; the
// test reads both after joining every thread.
struct Flow {
  uint64_t stream_seed = 0;
  size_t total = 0;
  size_t sent = 0;
  uint32_t sent_crc = 0;
  size_t received = 0;
  uint32_t received_crc = 0;
  bool eof = false;
  int64_t eof_ms = 0;           // MonotonicMs() when EOF arrived
  size_t first_bad = SIZE_MAX;  // offset of the first wrong byte
  std::string error;            // first failure on either side
};

enum class Mode { kBlockingThreads, kPollLoop, kEpollEdgeLoop };

const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kBlockingThreads: return "blocking";
    case Mode::kPollLoop: return "poll";
    case Mode::kEpollEdgeLoop: return "epoll-et";
  }
  return "?";
}

struct Conn {
  Mode mode;
  bool small_buffers;  // forces back-pressure: partial writes, EAGAIN, blocking
  Fd client, server;
  Flow up;    // client -> server
  Flow down;  // server -> client
};

// 1 .. 256 KiB, log-uniform so that tiny and huge calls are both common.
size_t RandomIoSize(std::mt19937_64& rng) {
  size_t limit = size_t{1} << (rng() % 19);  // 1 .. 2^18
  return 1 + rng() % limit;
}

uint32_t Crc(uint32_t crc, const uint8_t* p, size_t n) { return proto::Crc32c(std::span<const uint8_t>(p, n), crc); }

// One send call of buf[0, n) through a randomly chosen call family.
ssize_t SendOnce(int fd, const uint8_t* buf, size_t n, std::mt19937_64& rng) {
  size_t split = n / 2;
  iovec iov[2] = {{const_cast<uint8_t*>(buf), split}, {const_cast<uint8_t*>(buf) + split, n - split}};
  msghdr m{};
  m.msg_iov = iov;
  m.msg_iovlen = 2;
  switch (rng() % 4) {
    case 0: return write(fd, buf, n);
    case 1: return send(fd, buf, n, MSG_NOSIGNAL);
    case 2: return writev(fd, iov, 2);
    default: return sendmsg(fd, &m, MSG_NOSIGNAL);
  }
}

// One receive call into buf[0, n) through a randomly chosen call family.
ssize_t RecvOnce(int fd, uint8_t* buf, size_t n, std::mt19937_64& rng) {
  size_t split = n / 3;
  iovec iov[2] = {{buf, split}, {buf + split, n - split}};
  msghdr m{};
  m.msg_iov = iov;
  m.msg_iovlen = 2;
  switch (rng() % 4) {
    case 0: return read(fd, buf, n);
    case 1: return recv(fd, buf, n, 0);
    case 2: return readv(fd, iov, 2);
    default: return recvmsg(fd, &m, 0);
  }
}

enum class Step {
  kProgress,    // moved at least one byte
  kWouldBlock,  // EAGAIN or EINTR: try again later
  kFinished,    // this direction is complete (or failed; see Flow::error)
};

// Both directions of one socket; used by every mode. The send side and the
// receive side have separate state (RNG, buffers) because in blocking mode
// a writer thread and a reader thread share the endpoint.
class Endpoint {
 public:
  Endpoint(int fd, Flow* out, Flow* in, uint64_t rng_seed)
      : fd_(fd),
        out_(out),
        in_(in),
        send_rng_(rng_seed),
        send_buf_(kMaxIo),
        recv_rng_(~rng_seed),
        recv_buf_(kMaxIo),
        want_(kMaxIo) {}

  int fd() const { return fd_; }
  bool out_done() const { return out_done_; }
  bool in_done() const { return in_done_; }

  Step SendStep() {
    if (out_done_) return Step::kFinished;
    size_t n = std::min(RandomIoSize(send_rng_), out_->total - out_->sent);
    FillStream(out_->stream_seed, out_->sent, send_buf_.data(), n);
    ssize_t r = SendOnce(fd_, send_buf_.data(), n, send_rng_);
    if (r < 0) {
      if (errno == EAGAIN || errno == EINTR) return Step::kWouldBlock;
      Fail(out_, "send", errno);
      out_done_ = true;
      return Step::kFinished;
    }
    out_->sent_crc = Crc(out_->sent_crc, send_buf_.data(), static_cast<size_t>(r));
    out_->sent += static_cast<size_t>(r);
    if (static_cast<size_t>(r) < n) ++partial_writes_;
    if (out_->sent == out_->total) {
      // Half-close: the peer's reader sees EOF right after the last byte.
      out_done_ = true;
      if (shutdown(fd_, SHUT_WR) != 0) Fail(out_, "shutdown", errno);
      return Step::kFinished;
    }
    return Step::kProgress;
  }

  Step RecvStep() {
    if (in_done_) return Step::kFinished;
    size_t n = RandomIoSize(recv_rng_);
    ssize_t r = RecvOnce(fd_, recv_buf_.data(), n, recv_rng_);
    if (r < 0) {
      if (errno == EAGAIN || errno == EINTR) return Step::kWouldBlock;
      Fail(in_, "recv", errno);
      in_done_ = true;
      return Step::kFinished;
    }
    if (r == 0) {
      in_->eof = true;
      in_->eof_ms = MonotonicMs();
      in_done_ = true;
      return Step::kFinished;
    }
    size_t got = static_cast<size_t>(r);
    if (got < n) ++partial_reads_;
    if (in_->received + got > in_->total) {
      Fail(in_, "received more than was sent", 0);
      in_done_ = true;
      return Step::kFinished;
    }
    FillStream(in_->stream_seed, in_->received, want_.data(), got);
    if (in_->first_bad == SIZE_MAX && std::memcmp(recv_buf_.data(), want_.data(), got) != 0) {
      for (size_t i = 0; i < got; ++i) {
        if (recv_buf_[i] != want_[i]) {
          in_->first_bad = in_->received + i;
          break;
        }
      }
    }
    in_->received_crc = Crc(in_->received_crc, recv_buf_.data(), got);
    in_->received += got;
    return Step::kProgress;
  }

  size_t partial_writes() const { return partial_writes_; }
  size_t partial_reads() const { return partial_reads_; }

 private:
  static void Fail(Flow* f, const char* what, int err) {
    if (f->error.empty()) f->error = std::string(what) + (err ? ": " + ErrnoName(err) : "");
  }

  const int fd_;
  Flow* const out_;
  Flow* const in_;
  // Send side.
  std::mt19937_64 send_rng_;
  std::vector<uint8_t> send_buf_;
  bool out_done_ = false;
  size_t partial_writes_ = 0;
  // Receive side.
  std::mt19937_64 recv_rng_;
  std::vector<uint8_t> recv_buf_, want_;
  bool in_done_ = false;
  size_t partial_reads_ = 0;
};

// Drives non-blocking endpoints with level-triggered poll() (one call per
// readiness) or edge-triggered epoll (drain until EAGAIN per edge).
void RunEventLoop(std::vector<Endpoint*> eps, bool edge_triggered, const Deadline& deadline,
                  const std::atomic<bool>& abort, std::string* error) {
  auto done = [&] {
    for (auto* e : eps)
      if (!e->in_done() || !e->out_done()) return false;
    return true;
  };
  Fd ep;
  if (edge_triggered) {
    ep = Fd(epoll_create1(EPOLL_CLOEXEC));
    for (size_t i = 0; i < eps.size(); ++i) {
      epoll_event e{};
      e.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
      e.data.u64 = i;
      if (epoll_ctl(ep.get(), EPOLL_CTL_ADD, eps[i]->fd(), &e) != 0) {
        *error = "epoll_ctl: " + ErrnoName(errno);
        return;
      }
    }
  }
  constexpr long kMaxIterations = 10'000'000;
  for (long it = 0; it < kMaxIterations && !done(); ++it) {
    if (abort || deadline.Expired()) {
      *error = "time limit reached";
      return;
    }
    if (edge_triggered) {
      epoll_event ev[64];
      int n = epoll_wait(ep.get(), ev, 64, 100);
      if (n < 0 && errno != EINTR) {
        *error = "epoll_wait: " + ErrnoName(errno);
        return;
      }
      for (int i = 0; i < n; ++i) {
        Endpoint* e = eps[ev[i].data.u64];
        // An edge is reported once: keep going until the call would block.
        if (ev[i].events & EPOLLOUT)
          for (int k = 0; k < 100000 && e->SendStep() == Step::kProgress; ++k) {}
        if (ev[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
          for (int k = 0; k < 100000 && e->RecvStep() == Step::kProgress; ++k) {}
      }
    } else {
      std::vector<pollfd> p;
      std::vector<Endpoint*> polled;
      for (auto* e : eps) {
        short events = (e->in_done() ? 0 : POLLIN) | (e->out_done() ? 0 : POLLOUT);
        if (events == 0) continue;
        p.push_back({e->fd(), events, 0});
        polled.push_back(e);
      }
      int n = poll(p.data(), p.size(), 100);
      if (n < 0 && errno != EINTR) {
        *error = "poll: " + ErrnoName(errno);
        return;
      }
      for (size_t i = 0; n > 0 && i < p.size(); ++i) {
        if (p[i].revents & POLLOUT) polled[i]->SendStep();
        if (p[i].revents & (POLLIN | POLLHUP | POLLERR)) polled[i]->RecvStep();
      }
    }
  }
  if (!done()) *error = "event loop did not finish";
}

// Small, but not below ~2 MSS: loopback's MSS is ~64 KiB, and with a receive
// buffer smaller than that the receiver's silly-window avoidance keeps the
// window closed, leaving the sender to zero-window probes that back off to
// seconds (measured: 16 KiB buffers turned 0.3 s into 6 s).
void SetSmallBuffers(int fd) {
  const int size = 128 * 1024;
  EXPECT_EQ(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size), 0) << ErrnoName(errno);
  EXPECT_EQ(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size), 0) << ErrnoName(errno);
}

uint64_t StressBytesPerFlow() {
  const char* s = std::getenv("VSOCKET_TEST_STRESS_MIB");
  uint64_t mib = (s && *s) ? std::strtoull(s, nullptr, 10) : 64;
  if (mib == 0) mib = 1;
  return (mib << 20) / (2 * kConnections);
}

TEST(Stress, ThirtyTwoConnectionsRandomSizesBothWaysEveryByteChecked) {
  SetTestBudgetSeconds(kTimeLimitSeconds + 60);
  const uint64_t seed = TestSeed();
  const size_t per_flow = StressBytesPerFlow();
  const int64_t start_ms = MonotonicMs();

  // Connect everything through one listener; match accepted sockets to
  // clients by address, not by accept order.
  Fd listener = Listener(kConnections * 2);
  ASSERT_TRUE(listener.valid());
  std::vector<Conn> conns(kConnections);
  for (int i = 0; i < kConnections; ++i) {
    conns[i].mode = static_cast<Mode>(i % 3);
    conns[i].small_buffers = i % 2 == 1;
    conns[i].client = TcpSocket();
    ASSERT_TRUE(conns[i].client.valid());
    if (conns[i].small_buffers) SetSmallBuffers(conns[i].client.get());
    sockaddr_in addr = SockName(listener.get());
    ASSERT_EQ(connect(conns[i].client.get(), AsSockaddr(&addr), sizeof addr), 0) << ErrnoName(errno);
    conns[i].up.stream_seed = seed ^ (0x100000ull + 2 * i);
    conns[i].down.stream_seed = seed ^ (0x100001ull + 2 * i);
    conns[i].up.total = conns[i].down.total = per_flow;
  }
  for (int k = 0; k < kConnections; ++k) {
    Fd s = AcceptWithin(listener.get());
    ASSERT_TRUE(s.valid());
    sockaddr_in peer = PeerName(s.get());
    bool matched = false;
    for (auto& c : conns) {
      if (!c.server.valid() && SameEndpoint(SockName(c.client.get()), peer)) {
        c.server = std::move(s);
        if (c.small_buffers) SetSmallBuffers(c.server.get());
        matched = true;
        break;
      }
    }
    ASSERT_TRUE(matched) << "accepted a connection from unknown " << ToString(peer);
  }

  std::vector<std::unique_ptr<Endpoint>> endpoints;
  std::vector<Endpoint*> poll_eps, epoll_eps;
  std::vector<std::thread> threads;
  std::atomic<bool> abort{false};
  Deadline deadline(kTimeLimitSeconds * 1000);

  // Time limit: shutting every socket down unblocks the blocking threads.
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  std::thread limiter([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (cv.wait_for(lock, std::chrono::seconds(kTimeLimitSeconds), [&] { return finished; })) return;
    abort = true;
    for (auto& c : conns) {
      shutdown(c.client.get(), SHUT_RDWR);
      shutdown(c.server.get(), SHUT_RDWR);
    }
  });

  for (int i = 0; i < kConnections; ++i) {
    Conn& c = conns[i];
    auto client = std::make_unique<Endpoint>(c.client.get(), &c.up, &c.down, seed + 4 * i);
    auto server = std::make_unique<Endpoint>(c.server.get(), &c.down, &c.up, seed + 4 * i + 1);
    if (c.mode == Mode::kBlockingThreads) {
      // A reader and a writer thread per end: one socket, two threads.
      for (Endpoint* e : {client.get(), server.get()}) {
        threads.emplace_back([e, &abort] {
          while (!abort && e->SendStep() != Step::kFinished) {}
        });
        threads.emplace_back([e, &abort] {
          while (!abort && e->RecvStep() != Step::kFinished) {}
        });
      }
    } else {
      ASSERT_EQ(fcntl(c.client.get(), F_SETFL, O_NONBLOCK), 0);
      ASSERT_EQ(fcntl(c.server.get(), F_SETFL, O_NONBLOCK), 0);
      auto& group = c.mode == Mode::kPollLoop ? poll_eps : epoll_eps;
      group.push_back(client.get());
      group.push_back(server.get());
    }
    endpoints.push_back(std::move(client));
    endpoints.push_back(std::move(server));
  }
  std::string poll_error, epoll_error;
  threads.emplace_back([&] { RunEventLoop(poll_eps, false, deadline, abort, &poll_error); });
  threads.emplace_back([&] { RunEventLoop(epoll_eps, true, deadline, abort, &epoll_error); });
  for (auto& t : threads) t.join();
  {
    std::lock_guard<std::mutex> lock(mu);
    finished = true;
  }
  cv.notify_all();
  limiter.join();

  const double seconds = (MonotonicMs() - start_ms) / 1000.0;
  EXPECT_FALSE(abort) << "stress exceeded " << kTimeLimitSeconds << " s";
  EXPECT_EQ(poll_error, "");
  EXPECT_EQ(epoll_error, "");
  size_t moved = 0, partial_writes = 0, partial_reads = 0;
  for (auto& e : endpoints) {
    partial_writes += e->partial_writes();
    partial_reads += e->partial_reads();
  }
  for (int i = 0; i < kConnections; ++i) {
    for (const Flow* f : {&conns[i].up, &conns[i].down}) {
      const char* dir = f == &conns[i].up ? "client->server" : "server->client";
      SCOPED_TRACE(::testing::Message() << "connection " << i << " (" << ModeName(conns[i].mode) << ") " << dir
                                        << " seed " << seed);
      EXPECT_EQ(f->error, "");
      EXPECT_EQ(f->sent, f->total);
      EXPECT_EQ(f->received, f->total);
      EXPECT_EQ(f->first_bad, SIZE_MAX) << "first wrong byte at offset " << f->first_bad;
      EXPECT_EQ(f->received_crc, f->sent_crc);
      EXPECT_TRUE(f->eof) << "no EOF after the last byte";
      moved += f->received;
    }
  }
  // The slowest flow per mode shows where time goes when this gets slow.
  int64_t slowest_ms[3] = {0, 0, 0};
  for (auto& c : conns)
    for (const Flow* f : {&c.up, &c.down})
      if (f->eof)
        slowest_ms[static_cast<int>(c.mode)] = std::max(slowest_ms[static_cast<int>(c.mode)], f->eof_ms - start_ms);
  std::printf("[ stress   ] slowest flow: blocking %lld ms, poll %lld ms, epoll-et %lld ms\n",
              static_cast<long long>(slowest_ms[0]), static_cast<long long>(slowest_ms[1]),
              static_cast<long long>(slowest_ms[2]));
  std::printf("[ stress   ] %zu MiB in %.1f s (%.0f MiB/s), %zu partial writes, %zu short reads\n", moved >> 20,
              seconds, (moved >> 20) / (seconds > 0 ? seconds : 1), partial_writes, partial_reads);
}

}  // namespace
}  // namespace vsocket::socktest
