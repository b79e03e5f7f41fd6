// netload clients for the benchmark: message rate over N connections, and
// connection setup time.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <vector>

#include "bench/netload_common.h"

namespace vsocket::bench {
namespace {

// Messages written to one connection before moving to the next: long enough
// to keep the per-connection switch cheap, short enough that 64 connections
// all stay busy.
constexpr int kBurst = 32;

struct Sender {
  UniqueFd fd;
  size_t partial = 0;    // bytes of the current message already written
  bool blocked = false;  // waiting for EPOLLOUT (one-shot)
};

double Percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  return v[i];
}

}  // namespace

// --conns N --size B --seconds T --warmup W [--nodelay]: one write() per
// B-byte message, round robin over N connections, as fast as the sockets
// take them. Nagle stays on unless --nodelay (as in sockperf's throughput
// mode: the kernel may coalesce small writes, its best case). Counts
// the messages written in the T-second window that starts after W seconds
// (cross-host connections are upgraded a moment after their first byte).
// Prints "window start" / "window end" as they happen so that the driver
// samples the processes' CPU over the same window; with --linger S it then
// waits (at most S seconds) for a line on stdin before it closes anything,
// so that no process has exited when the driver samples.
int RunRate(const sockaddr_in& addr, const Options& o) {
  const int conns = static_cast<int>(o.Int("conns", 1));
  const size_t size = static_cast<size_t>(std::max<int64_t>(1, o.Int("size", 16)));
  const double seconds = o.Real("seconds", 2), warmup = o.Real("warmup", 0.5);
  const bool nodelay = o.Flag("nodelay");
  const double linger = o.Real("linger", 0);
  std::signal(SIGPIPE, SIG_IGN);
  int64_t deadline = NowNs() + SecondsToNs(10);
  std::vector<Sender> senders(static_cast<size_t>(conns));
  UniqueFd ep(epoll_create1(EPOLL_CLOEXEC));
  for (int i = 0; i < conns; ++i) {
    senders[i].fd = ConnectBefore(addr, deadline, nodelay);
    if (!senders[i].fd) {
      std::fprintf(stderr, "netload rate: connect %d of %d failed\n", i + 1, conns);
      return 1;
    }
    epoll_event ev{0, {.u32 = static_cast<uint32_t>(i)}};
    epoll_ctl(ep.get(), EPOLL_CTL_ADD, senders[i].fd.get(), &ev);
  }
  std::vector<uint8_t> msg(size);
  for (size_t i = 0; i < size; ++i) msg[i] = PatternByte(size, i);
  std::vector<epoll_event> ready(static_cast<size_t>(conns));
  uint64_t messages = 0, window_messages = 0;
  const int64_t start = NowNs(), window_start = start + SecondsToNs(warmup), end = window_start + SecondsToNs(seconds);
  int64_t now = start, window_t0 = 0;
  double cpu0 = 0;
  bool in_window = false;
  while (now < end) {
    bool any_ready = false;
    for (Sender& s : senders) {
      if (s.blocked) continue;
      any_ready = true;
      for (int k = 0; k < kBurst; ++k) {
        ssize_t w = write(s.fd.get(), msg.data() + s.partial, size - s.partial);
        if (w > 0) {
          s.partial += static_cast<size_t>(w);
          if (s.partial == size) {
            s.partial = 0;
            ++messages;
          }
          continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
          s.blocked = true;
          epoll_event ev{EPOLLOUT | EPOLLONESHOT, {.u32 = static_cast<uint32_t>(&s - senders.data())}};
          epoll_ctl(ep.get(), EPOLL_CTL_MOD, s.fd.get(), &ev);
          break;
        }
        std::perror("netload rate: write");
        return 1;
      }
    }
    if (!any_ready) {
      int n = epoll_wait(ep.get(), ready.data(), conns, 100);
      for (int i = 0; i < n; ++i) senders[ready[i].data.u32].blocked = false;
    }
    now = NowNs();
    if (!in_window && now >= window_start) {
      in_window = true;
      window_messages = messages;
      window_t0 = now;
      cpu0 = CpuSeconds();
      Say("window start");
    }
  }
  window_messages = messages - window_messages;
  const double window_s = static_cast<double>(now - window_t0) / 1e9, cpu_s = CpuSeconds() - cpu0;
  Say("window end");
  if (linger > 0) (void)WaitForLine(linger);
  // Finish messages cut in half, so the server's byte count is exact.
  deadline = NowNs() + SecondsToNs(10);
  for (Sender& s : senders) {
    if (s.partial != 0 && !WriteFull(s.fd.get(), msg.data() + s.partial, size - s.partial, deadline)) return 1;
    if (s.partial != 0) ++messages;
    shutdown(s.fd.get(), SHUT_WR);
  }
  Say("{\"role\":\"rate\",\"conns\":%d,\"size\":%zu,\"window_s\":%.4f,\"window_messages\":%llu,"
      "\"msg_per_s\":%.0f,\"messages_total\":%llu,\"bytes_total\":%llu,\"cpu_s_window\":%.3f}",
      conns, size, window_s, static_cast<unsigned long long>(window_messages),
      window_s > 0 ? static_cast<double>(window_messages) / window_s : 0.0, static_cast<unsigned long long>(messages),
      static_cast<unsigned long long>(messages * size), cpu_s);
  return 0;
}

// --count N --max-seconds S: N times, one after the other: connect, write
// one byte, wait for its echo (timed), close (not timed).
int RunConnect(const sockaddr_in& addr, const Options& o) {
  const int count = static_cast<int>(o.Int("count", 200));
  const int64_t deadline = NowNs() + SecondsToNs(o.Real("max-seconds", 20));
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<double> us, connect_us, write_us, echo_us;  // total and its three parts
  int failed = 0;
  for (int i = 0; i < count && NowNs() < deadline; ++i) {
    const int64_t t0 = NowNs();
    UniqueFd fd = ConnectBefore(addr, deadline);
    const int64_t t1 = NowNs();
    uint8_t b = static_cast<uint8_t>(i);
    uint8_t echo = 0;
    if (!fd || !WriteFull(fd.get(), &b, 1, deadline)) {
      ++failed;
      continue;
    }
    const int64_t t2 = NowNs();
    if (!ReadFull(fd.get(), &echo, 1, deadline) || echo != b) {
      ++failed;
      continue;
    }
    const int64_t t3 = NowNs();
    us.push_back(static_cast<double>(t3 - t0) / 1e3);
    connect_us.push_back(static_cast<double>(t1 - t0) / 1e3);
    write_us.push_back(static_cast<double>(t2 - t1) / 1e3);
    echo_us.push_back(static_cast<double>(t3 - t2) / 1e3);
  }
  const size_t done = us.size();
  const double p50 = Percentile(us, 0.5), p90 = Percentile(us, 0.9), p99 = Percentile(us, 0.99);
  Say("{\"role\":\"connect\",\"count\":%zu,\"failed\":%d,\"p50_us\":%.1f,\"p90_us\":%.1f,\"p99_us\":%.1f,"
      "\"max_us\":%.1f,\"connect_p50_us\":%.1f,\"connect_p99_us\":%.1f,\"write_p50_us\":%.1f,"
      "\"write_p99_us\":%.1f,\"echo_p50_us\":%.1f,\"echo_p99_us\":%.1f}",
      done, failed, p50, p90, p99, us.empty() ? 0.0 : us.back(), Percentile(connect_us, 0.5),
      Percentile(connect_us, 0.99), Percentile(write_us, 0.5), Percentile(write_us, 0.99), Percentile(echo_us, 0.5),
      Percentile(echo_us, 0.99));
  return failed == 0 && done == static_cast<size_t>(count) ? 0 : 1;
}

}  // namespace vsocket::bench
