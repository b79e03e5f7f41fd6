// vsocketd: the per-hypervisor vSocket backend.
//
//   vsocketd [--config FILE] [--port PATH,VM,TENANT[,ADDR[;ADDR...]]]... [--ctl PATH]
//            [--poll-us N] [--eal-mem MB] [--log-level LEVEL] [--metrics-port N] | --help
//
// Each VM ([vm NAME] in the file, or --port) is one vhost-user socket with
// the VM's tenant ID and addresses (from the operator, never from guests).
#include <arpa/inet.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/log.h"
#include "host-backend/config.h"
#include "host-backend/daemon.h"
#include "host-backend/vms_dir.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {
namespace {

constexpr char kUsage[] =
    "usage: vsocketd [--config FILE] [--port PATH,VM,TENANT[,ADDR[;ADDR...]]]... [--ctl PATH]\n"
    "                [--poll-us N] [--eal-mem MB] [--cpus LIST] [--log-level LEVEL] [--metrics-port N]\n"
    "The per-hypervisor vSocket backend: one vhost-user socket per VM.\n"
    "  --config FILE        configuration file (default /etc/vsocket/vsocketd.conf,\n"
    "                       read when neither --config nor --port is given)\n"
    "  --port PATH,VM,TENANT[,ADDR[;ADDR...]]\n"
    "                       add a VM: its vhost-user socket, name, tenant (1..2^32-1)\n"
    "                       and own addresses (repeatable)\n"
    "  --ctl PATH           vsocketctl's control socket (ctl_socket)\n"
    "  --poll-us N          busy-poll window before the worker sleeps (poll_us)\n"
    "  --eal-mem MB         DPDK heap (eal_mem_mb)\n"
    "  --cpus LIST          run every thread on these CPUs, e.g. 1 or 2-3 (cpus; a CPU\n"
    "                       of its own: guests then accelerate every connection at once)\n"
    "  --log-level LEVEL    error|warn|info|debug (log_level)\n"
    "  --metrics-port N     Prometheus endpoint port, 0 = off (metrics_port)\n"
    "  -h, --help           this text\n"
    "Every file key can be overridden by VSOCKET_<KEY> (daemon keys) or\n"
    "VSOCKET_VM_<NAME>_<KEY> (VM keys) environment variables, then by flags.\n"
    "See /usr/share/doc/vsocketd/operator-guide.md (docs/operator-guide.md).\n";

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr, "vsocketd: %s\n%s", why, kUsage);
  std::exit(2);
}

[[noreturn]] void ConfigError(const Status& st) {
  std::fprintf(stderr, "vsocketd: configuration error: %s\n", st.message().c_str());
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
  if (f.size() == 4 && !ParseAddresses(f[3], &p.addresses).ok()) return std::nullopt;
  return p;
}

std::string ReadFile(const std::string& path, bool* exists) {
  std::FILE* f = std::fopen(path.c_str(), "re");
  *exists = f != nullptr;
  if (!f) return "";
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  std::fclose(f);
  return text;
}

DaemonConfig LoadConfig(int argc, char** argv) {
  std::string config_path;
  bool have_ports = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (std::string(argv[i]) == "--config" && i + 1 < argc) config_path = argv[i + 1];
    if (std::string(argv[i]) == "--port") have_ports = true;
  }
  DaemonConfig c;
  bool explicit_file = !config_path.empty();
  if (!explicit_file && !have_ports) config_path = "/etc/vsocket/vsocketd.conf";
  if (!config_path.empty()) {
    bool exists = false;
    std::string text = ReadFile(config_path, &exists);
    if (!exists && explicit_file) ConfigError(Status::FromErrno("cannot read " + config_path));
    if (exists) {
      auto parsed = ParseConfig(text, config_path);
      if (!parsed.ok()) ConfigError(parsed.status());
      c = std::move(parsed).value();
    }
  }
  Status st = ApplyEnv(environ, &c);
  if (!st.ok()) ConfigError(st);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--config") {
      value();
    } else if (a == "--port") {
      auto p = ParsePort(value());
      if (!p) Usage("--port wants PATH,VM,TENANT[,ADDR[;ADDR...]] with a tenant of 1..2^32-1");
      // VSOCKET_VM_<NAME>_<KEY> applies to a --port VM too (its group, say);
      // what the flag says wins, as flags do over the environment.
      DaemonConfig one;
      one.vms.push_back(*p);
      Status env = ApplyEnv(environ, &one);
      if (!env.ok()) ConfigError(env);
      vhost::PortConfig vm = one.vms[0];
      vm.path = p->path;
      vm.tenant_id = p->tenant_id;
      if (!p->addresses.empty()) vm.addresses = p->addresses;
      c.vms.push_back(vm);
    } else if (a == "--ctl") {
      c.ctl_socket = value();
    } else if (a == "--poll-us" || a == "--eal-mem" || a == "--cpus" || a == "--log-level" ||
               a == "--metrics-port") {
      static const std::pair<const char*, const char*> kKeys[] = {{"--poll-us", "poll_us"},
                                                                  {"--eal-mem", "eal_mem_mb"},
                                                                  {"--cpus", "cpus"},
                                                                  {"--log-level", "log_level"},
                                                                  {"--metrics-port", "metrics_port"}};
      std::string key;
      for (const auto& [flag, k] : kKeys)
        if (a == flag) key = k;
      auto parsed = ParseConfig(key + " = " + value(), "command line " + a);
      if (!parsed.ok()) ConfigError(parsed.status());
      if (key == "poll_us") c.poll_us = parsed->poll_us;
      if (key == "eal_mem_mb") c.eal_mem_mb = parsed->eal_mem_mb;
      if (key == "cpus") c.cpus = parsed->cpus;
      if (key == "log_level") c.log_level = parsed->log_level;
      if (key == "metrics_port") c.metrics_port = parsed->metrics_port;
    } else {
      Usage(("unknown argument " + a).c_str());
    }
  }
  // The VMs vsocketctl vm add added (decision 105), after the configuration's.
  const std::string vms_dir = VmsDir(c);
  st = LoadVmsDir(vms_dir, &c);
  if (!st.ok()) ConfigError(st);
  // VMs that left by a live migration and have not run here since: incoming
  // (published when a device of theirs starts here), not published from
  // the configuration while they run elsewhere (decision 139).
  for (const std::string& vm : ApplyVmsLeft(vms_dir, &c))
    VS_LOG(kWarn, "vm %s left this host by a live migration (%s/%s.left): incoming until a device of it starts here "
                  "(take it out of this host's configuration if it is not coming back)",
           vm.c_str(), vms_dir.c_str(), vm.c_str());
  st = Validate(&c);
  if (!st.ok()) ConfigError(st);
  return c;
}

int Main(int argc, char** argv) {
  SetLogTag("vsocketd");
  DaemonConfig flags = LoadConfig(argc, argv);
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

  // Every thread (EAL's, vhost's, ours) is created after this and inherits
  // it; EAL's lcore 0 takes this set too (vhost::InitEal).
  if (!flags.cpus.empty()) {
    std::vector<int> list;
    std::string error;
    ParseCpuList(flags.cpus, &list, &error);  // (validated when read)
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : list) CPU_SET(c, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
      VS_LOG(kError, "cpus = %s: %s (CPUs this machine has: 0-%ld)", flags.cpus.c_str(), std::strerror(errno),
             sysconf(_SC_NPROCESSORS_CONF) - 1);
      return 2;
    }
    VS_LOG(kInfo, "running on CPUs %s", flags.cpus.c_str());
  }
  const char* dpdk_level = level >= LogLevel::kDebug ? "debug" : level >= LogLevel::kInfo ? "notice" : "warning";
  Status st = vhost::InitEal({flags.eal_mem_mb, dpdk_level});
  if (!st.ok()) {
    VS_LOG(kError, "%s", st.ToString().c_str());
    return 1;
  }
  Daemon daemon(flags);
  if (!daemon.Start().ok()) return 1;
  VS_LOG(kInfo, "ready: %zu VM port(s), control socket %s", flags.vms.size(), flags.ctl_socket.c_str());
  std::fprintf(stderr, "vsocketd: ready\n");

  int sig = 0;
  sigwait(&sigs, &sig);
  VS_LOG(kInfo, "signal %d: shutting down", sig);
  if (flags.drain_timeout_ms > 0) {
    // Drain first (what systemd's stop and restart send): every upgraded
    // connection that can leaves the rings with clean fences, so nothing
    // has to be resent when we are gone. Those still leaving at the
    // deadline (their applications do not read), and those that cannot (a
    // library without the feature, a connection half closed), resync as
    // after a crash; a second signal stops waiting.
    int64_t start = MonotonicMs();
    daemon.Drain(ConnManager::kAllVms, true);
    size_t left = 0;
    while ((left = daemon.Leaving("")) > 0 && MonotonicMs() - start < flags.drain_timeout_ms) {
      timespec ts{0, 20'000'000};
      if (sigtimedwait(&sigs, nullptr, &ts) > 0) {
        VS_LOG(kWarn, "second signal: not waiting for the drain");
        break;
      }
    }
    if (left == 0) {
      // (The last CREDITs were raised: let the worker publish them.)
      timespec ts{0, 50'000'000};
      nanosleep(&ts, nullptr);
      VS_LOG(kInfo, "drained in %lld ms", (long long)(MonotonicMs() - start));
    }
    else
      VS_LOG(kWarn, "%zu connection(s) still leaving the rings after %lld ms: they resync on kernel TCP", left,
             (long long)(MonotonicMs() - start));
  }
  daemon.Stop();
  return 0;
}

}  // namespace
}  // namespace vsocket::backend

int main(int argc, char** argv) { return vsocket::backend::Main(argc, argv); }
