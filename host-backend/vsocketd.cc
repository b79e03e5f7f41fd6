// vsocketd: the per-hypervisor vSocket backend.
//
//   vsocketd --port PATH,VM,TENANT[,ADDR[;ADDR...]] [--port ...] [--ctl PATH] [--poll-us N]
//            [--eal-mem MB] [--log-level error|warn|info|debug]
//
// Each --port is one VM's vhost-user socket with the VM's name and tenant ID
// (tenant IDs come from the operator, never from guests).
#include <arpa/inet.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "base/log.h"
#include "host-backend/control_service.h"
#include "host-backend/ctl_server.h"
#include "host-backend/stats.h"
#include "host-backend/worker.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {
namespace {

struct Flags {
  std::vector<vhost::PortConfig> ports;
  std::string ctl_path = "/run/vsocket/vsocketd.sock";
  int poll_us = 50;
  int eal_mem = 64;
  std::string log_level = "warn";
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "vsocketd: %s\nusage: vsocketd --port PATH,VM,TENANT[,ADDR[;ADDR...]] [--port ...] [--ctl PATH]\n"
               "                [--poll-us N] [--eal-mem MB] [--log-level LEVEL]\n",
               why);
  std::exit(2);
}

// PATH,VM,TENANT[,ADDR[;ADDR...]]: ADDRs are the VM's own IPv4/IPv6 addresses,
// the only local addresses its guests may register (anti-spoofing).
std::optional<vhost::PortConfig> ParsePort(const std::string& v) {
  std::vector<std::string> f;
  size_t start = 0;
  for (size_t i = 0; i <= v.size(); ++i) {
    if (i == v.size() || v[i] == ',') {
      f.push_back(v.substr(start, i - start));
      start = i + 1;
    }
  }
  if (f.size() < 3 || f.size() > 4 || f[0].empty() || f[1].empty()) return std::nullopt;
  vhost::PortConfig p;
  p.path = f[0];
  p.vm_name = f[1];
  char* end = nullptr;
  unsigned long tenant = std::strtoul(f[2].c_str(), &end, 10);
  if (*end != '\0' || tenant == 0 || tenant > 0xffffffffu) return std::nullopt;
  p.tenant_id = static_cast<uint32_t>(tenant);
  if (f.size() == 4) {
    size_t s = 0;
    const std::string& list = f[3];
    for (size_t i = 0; i <= list.size(); ++i) {
      if (i != list.size() && list[i] != ';') continue;
      std::string text = list.substr(s, i - s);
      s = i + 1;
      if (text.empty()) continue;
      vhost::VmAddress a;
      if (inet_pton(AF_INET, text.c_str(), a.addr.data()) == 1) {
        a.family = 4;
      } else if (inet_pton(AF_INET6, text.c_str(), a.addr.data()) == 1) {
        a.family = 6;
      } else {
        return std::nullopt;
      }
      p.addresses.push_back(a);
    }
  }
  return p;
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--port") {
      auto p = ParsePort(value());
      if (!p) Usage("--port wants PATH,VM,TENANT[,ADDR[;ADDR...]] with a tenant of 1..2^32-1");
      p->index = static_cast<uint32_t>(f.ports.size());
      f.ports.push_back(*p);
    } else if (a == "--ctl") {
      f.ctl_path = value();
    } else if (a == "--poll-us") {
      f.poll_us = std::atoi(value().c_str());
      if (f.poll_us < 0 || f.poll_us > 1000000) Usage("--poll-us must be 0..1000000");
    } else if (a == "--eal-mem") {
      f.eal_mem = std::atoi(value().c_str());
      if (f.eal_mem < 8) Usage("--eal-mem must be >= 8");
    } else if (a == "--log-level") {
      f.log_level = value();
      LogLevel l;
      if (!ParseLogLevel(f.log_level.c_str(), &l)) Usage("unknown log level");
    } else {
      Usage(("unknown argument " + a).c_str());
    }
  }
  if (f.ports.empty()) Usage("at least one --port is required");
  return f;
}

int Main(int argc, char** argv) {
  Flags flags = ParseFlags(argc, argv);
  SetLogTag("vsocketd");
  LogLevel level;
  ParseLogLevel(flags.log_level.c_str(), &level);
  SetLogLevel(level);

  // Signals are taken synchronously by the main thread; block them before
  // any thread (EAL's, vhost's, ours) is created so they inherit the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  const char* dpdk_level = level >= LogLevel::kDebug ? "debug" : level >= LogLevel::kInfo ? "notice" : "warning";
  Status st = vhost::InitEal({flags.eal_mem, dpdk_level});
  if (!st.ok()) {
    VS_LOG(kError, "%s", st.ToString().c_str());
    return 1;
  }
  ControlService service;
  Worker worker(&service, WorkerOptions{flags.poll_us, 64});
  st = worker.Start();
  if (!st.ok()) {
    VS_LOG(kError, "%s", st.ToString().c_str());
    return 1;
  }
  CtlServer ctl;
  st = ctl.Start(flags.ctl_path, [&](const std::string& cmd) {
    return HandleCtlCommand(cmd, service, worker);
  });
  if (!st.ok()) {
    VS_LOG(kError, "control socket: %s", st.ToString().c_str());
    return 1;
  }
  for (const vhost::PortConfig& p : flags.ports) {
    st = vhost::VhostBackend::Instance().AddPort(p, &worker);
    if (!st.ok()) {
      VS_LOG(kError, "%s", st.ToString().c_str());
      return 1;
    }
  }
  VS_LOG(kInfo, "ready: %zu port(s), control socket %s", flags.ports.size(), flags.ctl_path.c_str());
  std::fprintf(stderr, "vsocketd: ready\n");

  int sig = 0;
  sigwait(&sigs, &sig);
  VS_LOG(kInfo, "signal %d: shutting down", sig);
  for (const vhost::PortConfig& p : flags.ports) (void)vhost::VhostBackend::Instance().RemovePort(p.path);
  ctl.Stop();
  worker.Stop();
  return 0;
}

}  // namespace
}  // namespace vsocket::backend

int main(int argc, char** argv) { return vsocket::backend::Main(argc, argv); }
