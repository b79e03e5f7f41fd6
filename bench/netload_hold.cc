// netload hold: many concurrent idle connections for the scale run
// (bench/conn_scale.py), stepped through its phases by lines on stdin so that
// the driver can measure memory between them:
//
//   "ready"            -> (line) open N connections, one hello round trip each
//   "opened OK FAILED" -> (line) one checksummed message round trip on each
//   "verified OK BAD"  -> (line) close them all
//   "closed"
//
// The hello makes both ends register with their backend (libvsocket does
// that at a connection's first I/O) while the data still flows over kernel
// TCP; the driver then waits for the cross-host pairings, so the checksummed
// message travels on the accelerated path.
#include <sys/socket.h>
#include <unistd.h>

#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench/netload_common.h"

namespace vsocket::bench {
namespace {

constexpr size_t kHelloBytes = 8;
constexpr size_t kHeaderBytes = 16;  // connection index, seed
constexpr size_t kTrailerBytes = 8;  // FNV-1a of everything before it

// Message for connection `index`: header, pattern, checksum trailer.
std::vector<uint8_t> MakeMessage(uint64_t index, uint64_t seed, size_t bytes) {
  std::vector<uint8_t> m(bytes);
  std::memcpy(m.data(), &index, 8);
  std::memcpy(m.data() + 8, &seed, 8);
  const size_t body_end = bytes - kTrailerBytes;
  for (size_t i = kHeaderBytes; i < body_end; ++i) m[i] = PatternByte(seed, i);
  uint64_t sum = Fnv1a(m.data(), body_end);
  std::memcpy(m.data() + body_end, &sum, 8);
  return m;
}

// The echo must be the message we sent, and carry a valid checksum: a
// message of another connection (same length) fails the index and seed.
bool CheckEcho(const std::vector<uint8_t>& sent, const std::vector<uint8_t>& got) {
  const size_t body_end = got.size() - kTrailerBytes;
  uint64_t sum;
  std::memcpy(&sum, got.data() + body_end, 8);
  return got == sent && sum == Fnv1a(got.data(), body_end);
}

}  // namespace

// --conns N --msg-bytes L --seed S --phase-timeout T (seconds per stdin wait)
// --io-timeout T (seconds for each phase's connection I/O)
int RunHold(const sockaddr_in& addr, const Options& o) {
  const size_t conns = static_cast<size_t>(o.Int("conns", 100));
  const size_t msg_bytes = std::max<size_t>(kHeaderBytes + kTrailerBytes + 1, o.Int("msg-bytes", 256));
  const uint64_t seed = static_cast<uint64_t>(o.Int("seed", 1));
  const double phase_timeout = o.Real("phase-timeout", 120);
  const int64_t io_timeout_ns = SecondsToNs(o.Real("io-timeout", 60));
  std::signal(SIGPIPE, SIG_IGN);
  Say("ready");
  if (!WaitForLine(phase_timeout)) return 1;

  // Phase 1: open and say hello on every connection.
  std::vector<UniqueFd> fds;
  fds.reserve(conns);
  int64_t deadline = NowNs() + io_timeout_ns;
  size_t failed = 0;
  for (size_t i = 0; i < conns; ++i) {
    UniqueFd fd = ConnectBefore(addr, deadline);
    if (!fd) {
      ++failed;
      continue;
    }
    fds.push_back(std::move(fd));
  }
  uint8_t hello[kHelloBytes] = {'h', 'e', 'l', 'l', 'o', '!', '\r', '\n'};
  std::vector<bool> ok(fds.size(), true);
  for (size_t i = 0; i < fds.size(); ++i) ok[i] = WriteFull(fds[i].get(), hello, kHelloBytes, deadline);
  for (size_t i = 0; i < fds.size(); ++i) {
    uint8_t back[kHelloBytes];
    ok[i] = ok[i] && ReadFull(fds[i].get(), back, kHelloBytes, deadline) && !std::memcmp(back, hello, kHelloBytes);
  }
  size_t open_ok = 0;
  for (bool b : ok) open_ok += b;
  failed += fds.size() - open_ok;
  Say("opened %zu %zu", open_ok, failed);
  if (!WaitForLine(phase_timeout)) return 1;

  // Phase 2: every message out first (each fits a ring, so none blocks for
  // long), then every echo back, so all connections carry traffic at once.
  deadline = NowNs() + io_timeout_ns;
  std::vector<std::vector<uint8_t>> sent(fds.size());
  size_t good = 0, bad = 0;
  for (size_t i = 0; i < fds.size(); ++i) {
    sent[i] = MakeMessage(i, seed * 1000003 + i, msg_bytes);
    if (!ok[i] || !WriteFull(fds[i].get(), sent[i].data(), msg_bytes, deadline)) ok[i] = false;
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    std::vector<uint8_t> got(msg_bytes);
    if (ok[i] && ReadFull(fds[i].get(), got.data(), msg_bytes, deadline) && CheckEcho(sent[i], got)) {
      ++good;
    } else {
      ++bad;
      if (bad <= 5) std::fprintf(stderr, "netload hold: connection %zu failed its checksummed echo\n", i);
    }
  }
  Say("verified %zu %zu", good, bad + failed);
  if (!WaitForLine(phase_timeout)) return 1;

  fds.clear();  // closes every connection (libvsocket writes its reports)
  Say("closed");
  return bad == 0 && failed == 0 ? 0 : 1;
}

}  // namespace vsocket::bench
