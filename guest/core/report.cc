#include "guest/core/report.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <unordered_set>

#include "base/clock.h"
#include "guest/core/direct_ring.h"
#include "guest/core/config.h"
#include "guest/core/conn_state.h"
#include "guest/core/fd_table.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {

using proto::Reason;

namespace {

// Never registered in this process's history: not looked at, held by the
// upgrade policy, or not connected yet (no backend loss, no RESYNC).
bool NeverRegistered(const Conn& c) {
  return c.state.phase() == Phase::kUnprobed && !c.lost_backend.load() && c.reupgrades.load() == 0 &&
         c.stream.withdrawals() == 0;
}

// s as the inside of a JSON string, cut to fit `cap` bytes.
std::string JsonText(const char* s, size_t cap) {
  std::string out;
  for (; *s != '\0' && out.size() + 6 < cap; ++s) {
    auto ch = static_cast<unsigned char>(*s);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\u%04x", ch);
      out += esc;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out;
}

// exec_program: the line of a connection passing to that program across
// exec (reason "inherited").
void WriteLine(const Conn& c, const char* event, const char* exec_program) {
  const std::string& path = Config().report_path;
  if (path.empty()) return;
  char local[INET6_ADDRSTRLEN] = "?", peer[INET6_ADDRSTRLEN] = "?";
  int af = c.local.family == proto::Family::kIpv6 ? AF_INET6 : AF_INET;
  inet_ntop(af, c.local.addr.data(), local, sizeof(local));
  inet_ntop(af, c.peer.addr.data(), peer, sizeof(peer));
  // Still pending at the end: the peer never registered (not preloaded,
  // NAT, no backend on its side).
  Reason reason = c.state.phase() == Phase::kPending ? Reason::kPeerNotRegistered : c.state.reason();
  // Held by the upgrade policy and never streamed: request/response.
  if (NeverRegistered(c) && c.held.load()) reason = Reason::kRequestResponse;
  if (c.urgent.load() && c.state.phase() != Phase::kUnprobed) reason = Reason::kUrgentData;  // (never registers)
  const char* mode = c.state.ReportedMode();
  std::string exec_field;
  if (exec_program != nullptr) {
    reason = Reason::kInherited;
    if (c.state.phase() == Phase::kUnprobed) mode = "kernel";
    exec_field = ",\"exec\":\"" + JsonText(exec_program, 256) + "\"";
  }
  // Why it registered (the policy's side of "why is it where it is"): at
  // its first I/O, because it streams, or because its process's loop is
  // busy (decision 83); "" if it never did.
  const char* registered_for = "";
  if (!NeverRegistered(c)) {
    switch (c.stream.cause()) {
      case StreamDetector::Cause::kNone: registered_for = c.held.load() ? "" : "first-io"; break;
      case StreamDetector::Cause::kStream: registered_for = "stream"; break;
      case StreamDetector::Cause::kBusyLoop: registered_for = "busy-loop"; break;
      case StreamDetector::Cause::kDirectPeer: registered_for = "direct-peer"; break;
    }
  }
  char line[1024];
  int n = std::snprintf(
      line, sizeof(line),
      "{\"pid\":%d,\"event\":\"%s\"%s,\"local\":\"%s:%u\",\"peer\":\"%s:%u\",\"mode\":\"%s\","
      "\"reason\":\"%s\",\"registered_for\":\"%s\",\"withdrawals\":%u,\"upgraded\":%s,\"kernel_tx\":%llu,\"kernel_rx\":%llu,"
      "\"accel_tx\":%llu,\"accel_rx\":%llu,\"kernel_tx_after_upgrade\":%llu,"
      "\"kernel_rx_after_upgrade\":%llu,\"resynced\":%s,\"reupgrades\":%u,\"downgrades\":%u,\"last_downgrade\":\"%s\","
      "\"kernel_ms_after_downgrade\":%lld,\"resent_bytes\":%llu,\"fin_deferred\":%s,\"lingered\":%s,\"late_"
      "wakeups\":%u,\"path\":\"%s\",\"direct_fences\":\"%s\"}\n",
      getpid(), event, exec_field.c_str(), local, c.local.port, peer, c.peer.port, mode, proto::ToString(reason),
      registered_for, c.stream.withdrawals(), c.state.upgraded() ? "true" : "false",
      // The application's bytes, each once: without RESYNC headers and
      // ring bytes the kernel stream carried again (resent_bytes says how
      // many were resent).
      static_cast<unsigned long long>(c.kernel_sent.load() - c.kernel_tx_repeat.load()),
      static_cast<unsigned long long>(c.kernel_received.load() - c.kernel_rx_repeat.load()),
      static_cast<unsigned long long>(c.accel_tx.load()),
      static_cast<unsigned long long>(c.accel_rx.load()),
      // 0 once switched, until a RESYNC or a drain puts bytes on the kernel
      // socket again (its header, a resend, later writes); reported so
      // tests can prove it from counters rather than assume it.
      static_cast<unsigned long long>(c.state.tx_on_ring() ? c.kernel_sent.load() - c.fence_sent.load() : 0),
      static_cast<unsigned long long>(c.state.rx_on_ring() ? c.kernel_received.load() - c.peer_fence.load() : 0),
      c.state.resynced() || c.reupgrades.load() ? "true" : "false", c.reupgrades.load(), c.state.downgrades(),
      c.state.downgrades() ? proto::ToString(c.state.last_downgrade()) : "",
      static_cast<long long>(c.state.kernel_ns_after_downgrades(MonotonicNs()) / 1000000),
      static_cast<unsigned long long>(c.resent_bytes.load()), c.fin_deferred.load() ? "true" : "false", c.state.lingered() ? "true" : "false", c.late_wakeups.load(),
      std::strcmp(mode, "accelerated") != 0 ? "kernel" : c.direct ? "direct" : "backend",
      // A direct pair's count stores: light at some time (the peer's asks
      // fenced for both, decision 114) or always full.
      c.direct ? (c.direct->went_light() ? "light" : "full") : "");
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  (void)!Libc().write(fd, line, static_cast<size_t>(n));
  Libc().close(fd);
}

}  // namespace

void Report(const Conn& c, const char* event) {
  // A connection never looked at says nothing; one waiting to register
  // again (its backend went away), or held on kernel TCP by the upgrade
  // policy, is on kernel TCP and says so.
  // (Held from birth and never connected, or never used: nothing to say.)
  if (NeverRegistered(c) && (!c.held.load() || !c.addressed.load())) return;
  WriteLine(c, event, nullptr);
}

void ReportExec(const Conn& c, const char* program) { WriteLine(c, "exec", program); }

void ReportAll(const char* event) {
  std::unordered_set<const Conn*> done;
  ForEachConn([&](int, Conn& c) {
    if (done.insert(&c).second) Report(c, event);
  });
}

namespace {

constexpr int kTerminating[] = {SIGTERM, SIGHUP};

void OnTerminatingSignal(int sig) {
  int saved = errno;
  signal(SIGALRM, SIG_DFL);
  alarm(2);
  ReportAll("signal");
  errno = saved;
  // (SA_RESETHAND: the default action is back; the signal, blocked while
  // this runs, is delivered on return.)
  raise(sig);
}

}  // namespace

void ReportOnTerminatingSignals() {
  if (Config().report_path.empty()) return;
  for (int sig : kTerminating) {
    struct sigaction old{};
    if (sigaction(sig, nullptr, &old) != 0 || (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) continue;
    struct sigaction sa{};
    sa.sa_handler = OnTerminatingSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigaction(sig, &sa, nullptr);
  }
}

}  // namespace vsocket::guest
