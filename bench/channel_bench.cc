// Channel benchmark: the virtio channel (our frontend <-> vsocketd on
// rte_vhost) against a raw shared-memory SPSC ring between two processes,
// measured in the same run on the same machine.
//
//   channel_bench VSOCKETD_BINARY [--iters N] [--out FILE]
//
// Reports round-trip time (p50/p99/p99.9) for 8-byte messages, message rate
// (one at a time and batched), the ratio channel/raw, and the daemon's CPU
// time while idle.
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "tests/integration/control_channel.h"
#include "tests/integration/daemon_fixture.h"

using namespace vsocket;

namespace {

struct Percentiles {
  double p50, p99, p999;
};

Percentiles Summarize(std::vector<int64_t>& ns) {
  std::sort(ns.begin(), ns.end());
  auto at = [&](double q) { return ns[std::min(ns.size() - 1, size_t(q * ns.size()))] / 1000.0; };
  return {at(0.50), at(0.99), at(0.999)};
}

// ---- raw SPSC ring over a memfd, two processes ---------------------------

constexpr uint32_t kRawSlots = 1024;

struct alignas(64) RawRing {
  alignas(64) std::atomic<uint32_t> head{0};  // producer
  alignas(64) std::atomic<uint32_t> tail{0};  // consumer
  alignas(64) uint64_t slot[kRawSlots];

  void Push(uint64_t v) {
    uint32_t h = head.load(std::memory_order_relaxed);
    while (h - tail.load(std::memory_order_acquire) == kRawSlots) __builtin_ia32_pause();
    slot[h % kRawSlots] = v;
    head.store(h + 1, std::memory_order_release);
  }
  uint64_t Pop() {
    uint32_t t = tail.load(std::memory_order_relaxed);
    while (head.load(std::memory_order_acquire) == t) __builtin_ia32_pause();
    uint64_t v = slot[t % kRawSlots];
    tail.store(t + 1, std::memory_order_release);
    return v;
  }
};

struct RawShared {
  RawRing to_server;
  RawRing to_client;
};

struct RawResult {
  Percentiles rtt;
  double stream_mps;
};

RawResult RunRaw(int iters) {
  int fd = memfd_create("raw-ring", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, sizeof(RawShared)) != 0) std::abort();
  auto* sh = static_cast<RawShared*>(mmap(nullptr, sizeof(RawShared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  new (sh) RawShared();
  const int stream = iters * 10;
  pid_t child = fork();
  if (child == 0) {
    for (int i = 0; i < iters + 1000; ++i) sh->to_client.Push(sh->to_server.Pop());
    uint64_t sum = 0;
    for (int i = 0; i < stream; ++i) sum += sh->to_server.Pop();
    sh->to_client.Push(sum);
    _exit(0);
  }
  std::vector<int64_t> rtt;
  rtt.reserve(iters);
  for (int i = 0; i < iters + 1000; ++i) {
    int64_t t0 = MonotonicNs();
    sh->to_server.Push(uint64_t(i));
    if (sh->to_client.Pop() != uint64_t(i)) std::abort();
    if (i >= 1000) rtt.push_back(MonotonicNs() - t0);  // first 1000: warm-up
  }
  int64_t t0 = MonotonicNs();
  uint64_t want = 0;
  for (int i = 0; i < stream; ++i) {
    sh->to_server.Push(uint64_t(i));
    want += uint64_t(i);
  }
  if (sh->to_client.Pop() != want) std::abort();
  double secs = (MonotonicNs() - t0) / 1e9;
  waitpid(child, nullptr, 0);
  munmap(sh, sizeof(RawShared));
  close(fd);
  return {Summarize(rtt), stream / secs};
}

// ---- virtio channel -------------------------------------------------------

struct ChannelResult {
  Percentiles rtt;
  double single_mps;   // one call in flight
  double batched_mps;  // queue-full batches
};

std::unique_ptr<guest::ControlChannel> OpenChannel(const std::string& sock, guest::WaitMode mode) {
  guest::ChannelOptions o;
  o.frontend.socket_path = sock;
  o.frontend.queue_size = 256;
  o.wait = mode;
  auto ch = guest::ControlChannel::Open(o);
  if (!ch.ok()) {
    std::fprintf(stderr, "open channel: %s\n", ch.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(ch).value();
}

ChannelResult RunChannel(const std::string& sock, guest::WaitMode mode, int iters) {
  auto ch = OpenChannel(sock, mode);
  uint8_t payload[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  uint32_t crc = proto::Crc32c(payload);
  std::vector<uint8_t> scratch(proto::kMaxMessageSize);
  proto::Message resp;
  std::vector<int64_t> rtt;
  rtt.reserve(iters);
  int64_t single_start = 0;
  for (int i = 0; i < iters + 1000; ++i) {
    if (i == 1000) single_start = MonotonicNs();
    int64_t t0 = MonotonicNs();
    Status st = ch->Call({proto::MsgType::kEcho, uint64_t(i), proto::Echo{crc, payload}}, &resp, scratch);
    int64_t t1 = MonotonicNs();
    const auto* e = std::get_if<proto::Echo>(&resp.body);
    if (!st.ok() || !e || e->checksum != crc) {
      std::fprintf(stderr, "echo failed: %s\n", st.ToString().c_str());
      std::exit(1);
    }
    if (i >= 1000) rtt.push_back(t1 - t0);
  }
  double single_mps = iters / ((MonotonicNs() - single_start) / 1e9);

  // Batched: fill the queue, publish once, reap everything.
  std::vector<guest::ControlChannel::Completion> done;
  int64_t total = 0;
  int64_t t0 = MonotonicNs();
  while (total < int64_t(iters) * 4) {
    for (size_t i = ch->in_flight(); i < ch->capacity(); ++i)
      if (!ch->Submit({proto::MsgType::kEcho, i, proto::Echo{crc, payload}}, i).ok()) std::abort();
    ch->Flush();
    if (!ch->Reap(&done, 5000).ok()) std::abort();
    for (auto& c : done) {
      if (c.response.size() != proto::kHeaderSize + 8 + 8) std::abort();
      ++total;
    }
  }
  while (ch->in_flight() > 0 && ch->Reap(&done, 5000).ok()) total += done.size();
  double batched_mps = total / ((MonotonicNs() - t0) / 1e9);
  return {Summarize(rtt), single_mps, batched_mps};
}

double CpuSeconds(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return -1;
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* p = std::strrchr(buf, ')');
  unsigned long utime = 0, stime = 0;
  // Fields after ')': state(3) ... utime(14) stime(15).
  std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime);
  return double(utime + stime) / sysconf(_SC_CLK_TCK);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s VSOCKETD [--iters N] [--out FILE]\n", argv[0]);
    return 2;
  }
  setenv("VSOCKETD", argv[1], 1);
  int iters = 100000;
  std::string out_path;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--iters") iters = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--out") out_path = argv[i + 1];
  }

  RawResult raw = RunRaw(iters);

  ChannelResult poll, event;
  double idle_cpu;
  {
    testing::Daemon polling({"vm1"}, {"--poll-us", "200"});
    if (!polling.Start()) return 1;
    poll = RunChannel(polling.socket_path("vm1"), guest::WaitMode::kPoll, iters);
    // Idle cost: the worker must be asleep, not spinning.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    double c0 = CpuSeconds(polling.pid());
    std::this_thread::sleep_for(std::chrono::seconds(3));
    idle_cpu = CpuSeconds(polling.pid()) - c0;
  }
  {
    testing::Daemon sleeping({"vm1"}, {"--poll-us", "0"});
    if (!sleeping.Start()) return 1;
    event = RunChannel(sleeping.socket_path("vm1"), guest::WaitMode::kEvent, iters / 10);
  }

  char buf[4096];
  int n = std::snprintf(buf, sizeof(buf),
                        "# vSocket channel benchmark (%d round trips, 8-byte payloads, %ld CPUs)\n"
                        "| measurement                     | raw SPSC ring | channel, polling | channel, eventfd |\n"
                        "|---------------------------------|--------------:|-----------------:|-----------------:|\n"
                        "| RTT p50 (us)                    | %13.2f | %16.2f | %16.2f |\n"
                        "| RTT p99 (us)                    | %13.2f | %16.2f | %16.2f |\n"
                        "| RTT p99.9 (us)                  | %13.2f | %16.2f | %16.2f |\n"
                        "| msgs/s, one in flight           | %13.0f | %16.0f | %16.0f |\n"
                        "| msgs/s, batched / streaming     | %13.0f | %16.0f | %16.0f |\n"
                        "\n"
                        "channel/raw RTT p50 ratio (polling): %.2fx  (goal: <= 2x)\n"
                        "vsocketd CPU while idle for 3 s: %.3f s (%.1f%% of one core)\n",
                        iters, sysconf(_SC_NPROCESSORS_ONLN), raw.rtt.p50, poll.rtt.p50, event.rtt.p50, raw.rtt.p99,
                        poll.rtt.p99, event.rtt.p99, raw.rtt.p999, poll.rtt.p999, event.rtt.p999, 1e6 / raw.rtt.p50,
                        poll.single_mps, event.single_mps, raw.stream_mps, poll.batched_mps, event.batched_mps,
                        poll.rtt.p50 / raw.rtt.p50, idle_cpu, idle_cpu / 3 * 100);
  std::fwrite(buf, 1, n, stdout);
  if (!out_path.empty()) {
    FILE* f = std::fopen(out_path.c_str(), "w");
    if (f) {
      std::fwrite(buf, 1, n, f);
      std::fclose(f);
    }
  }
  return 0;
}
