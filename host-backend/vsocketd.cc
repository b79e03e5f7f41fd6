// vsocketd: the per-hypervisor vSocket backend.
//
//   vsocketd --port PATH,VM,TENANT [--port ...] [--ctl PATH] [--poll-us N]
//            [--eal-mem MB] [--log-level error|warn|info|debug]
//
// Each --port is one VM's vhost-user socket with the VM's name and tenant ID
// (tenant IDs come from the operator, never from guests).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
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
               "vsocketd: %s\nusage: vsocketd --port PATH,VM,TENANT [--port ...] [--ctl PATH]\n"
               "                [--poll-us N] [--eal-mem MB] [--log-level LEVEL]\n",
               why);
  std::exit(2);
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
      std::string v = value();
      auto c1 = v.find(','), c2 = v.rfind(',');
      if (c1 == std::string::npos || c1 == c2) Usage("--port wants PATH,VM,TENANT");
      vhost::PortConfig p;
      p.path = v.substr(0, c1);
      p.vm_name = v.substr(c1 + 1, c2 - c1 - 1);
      char* end = nullptr;
      unsigned long tenant = std::strtoul(v.c_str() + c2 + 1, &end, 10);
      if (*end != '\0' || tenant == 0 || tenant > 0xffffffffu) Usage("tenant must be 1..2^32-1");
      p.tenant_id = static_cast<uint32_t>(tenant);
      f.ports.push_back(p);
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
