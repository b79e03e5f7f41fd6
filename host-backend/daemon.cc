#include "host-backend/daemon.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include <algorithm>
#include <sstream>
#include <utility>
#include <vector>

#include "base/log.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {

std::string CtlError(const std::string& msg, bool json) {
  return json ? "{\"error\":\"" + msg + "\"}\n" : "error: " + msg + "\n";
}

Daemon::Daemon(DaemonConfig config)
    : config_(std::move(config)),
      nap_us_(EffectiveNapUs(config_, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)))),
      worker_(&service_, WorkerOptions{config_.poll_us, config_.poll_max_us, 64, nap_us_}) {}

Status Daemon::Start() {
  // The worker's own reference to the VM list (vm add/remove replace it
  // through its queue: RequestLocalPorts).
  conns_.SetLocalPorts(vms_.Get());
  conns_.SetOrphanBudgets(uint64_t(config_.orphan_mb_per_vm) << 20, uint64_t(config_.orphan_mb_total) << 20);
  conns_.SetConnsPerVm(static_cast<uint32_t>(config_.max_conns_per_vm));
  conns_.SetNaps(nap_us_ > 0);
  if (nap_us_ > 0)
    VS_LOG(kInfo, "worker naps %d us between passes instead of polling (sharing the CPUs with the guests; nap_us)",
           nap_us_);
  for (const vhost::PortConfig& p : config_.vms)
    if (p.away) conns_.StartAway(p.index);
  {
    MutexLock lock(vm_ops_mu_);  // (before the control socket can ask)
    for (const vhost::PortConfig& p : config_.vms) next_index_ = std::max(next_index_, p.index + 1);
  }
  LoadAttested();
  Status st = peering_.Start(config_);
  if (!st.ok()) {
    VS_LOG(kError, "peering: %s", st.ToString().c_str());
    return st;
  }
  if (peering_.enabled()) {
    worker_.AddWakeFd(peering_.wake_fd());
    worker_.AddWakeFd(conns_.registrations_fd());
  }
  // From here on the connections are the worker's: reports ask it.
  conns_.SetWorker([this] { worker_.Wake(); });
  st = worker_.Start();
  if (!st.ok()) {
    VS_LOG(kError, "%s", st.ToString().c_str());
    return st;
  }
  st = ctl_.Start(config_.ctl_socket, [this](const std::string& cmd) { return CtlCommand(cmd); });
  if (!st.ok()) {
    VS_LOG(kError, "control socket: %s", st.ToString().c_str());
    return st;
  }
  if (config_.metrics_port != 0) {
    st = metrics_.Start(config_.metrics_addr, config_.metrics_port, [this] { return PrometheusMetrics(reporting_); });
    if (!st.ok()) {
      VS_LOG(kError, "metrics listener: %s", st.ToString().c_str());
      return st;
    }
  }
  MutexLock lock(ports_mu_);
  for (const vhost::PortConfig& p : config_.vms) {
    if (p.away) {
      VS_LOG(kInfo, "vm %s: runs on another host (away = true); its port opens at 'vsocketctl migrate end %s'",
             p.vm_name.c_str(), p.vm_name.c_str());
      continue;
    }
    st = vhost::VhostBackend::Instance().AddPort(p, &worker_);
    if (!st.ok()) {
      VS_LOG(kError, "%s", st.ToString().c_str());
      return st;
    }
    port_open_.insert(p.index);
  }
  return Status::Ok();
}

void Daemon::Stop() {
  // The worker first: removing a port detaches its devices, and a running
  // worker would treat each as a guest that exited (its connections
  // closed, their peers told "shutdown" once the bytes the daemon holds are
  // gone with it: a silent short stream). Stopped, it says nothing more;
  // every guest sees its vhost-user socket hang up and finishes its
  // connections on kernel TCP (RESYNC), and the peer hosts see their links
  // drop and do the same.
  {
    // No migrate command opens or closes a port from here on.
    MutexLock lock(ports_mu_);
    stopping_ = true;
  }
  worker_.Stop();
  conns_.SetWorker(nullptr);  // (a report asked meanwhile is made by whoever asked)
  {
    MutexLock lock(ports_mu_);
    for (const vhost::PortConfig& p : *vms_.Get())
      if (port_open_.erase(p.index) != 0) (void)vhost::VhostBackend::Instance().RemovePort(p.path);
  }
  peering_.StopDirectory();  // (this host's records leave the directory)
  metrics_.Stop();
  ctl_.Stop();
}

}  // namespace vsocket::backend

namespace vsocket::backend {

void Daemon::Drain(uint32_t vm_index, bool drain) {
  (void)Apply(vm_index, drain ? ConnManager::VmOp::kDrain : ConnManager::VmOp::kUndrain);
}

bool Daemon::Apply(uint32_t vm_index, ConnManager::VmOp op, proto::Reason why) {
  uint64_t seq = conns_.RequestVmOp(vm_index, op, why);
  worker_.Wake();
  // Back once the worker applied it (its next pass: at once, unless it is
  // wedged or stopped), so that what the caller counts next includes it.
  for (int i = 0; i < 5000 && conns_.drains_applied() < seq; ++i) usleep(1000);
  return conns_.drains_applied() >= seq;
}

size_t Daemon::Leaving(const std::string& vm, size_t* accelerated) const {
  size_t n = 0, accel = 0;
  for (const ConnSnapshot& c : conns_.Snapshot()) {
    if (!vm.empty() && c.vm != vm) continue;
    n += c.leaving;
    accel += c.state == ConnState::kUpgraded && !c.moved;
  }
  if (accelerated != nullptr) *accelerated = accel;
  return n;
}

std::string Daemon::CtlCommand(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> words;
  bool json = false;
  for (std::string w; in >> w;) {
    if (w == "--json") json = true;
    else words.push_back(w);
  }
  if (!words.empty() && words[0] == "migrate") return MigrateCommand(words, json);
  if (!words.empty() && words[0] == "locator") return LocatorCommand(words, json);
  if (!words.empty() && words[0] == "attest") return AttestCommand(words, json);
  if (!words.empty() && words[0] == "vm") return VmCommand(words, json);
  if (words.empty() || (words[0] != "drain" && words[0] != "undrain" && words[0] != "drained"))
    return HandleCtlCommand(line, reporting_);
  auto error = [&](const std::string& msg) { return CtlError(msg, json); };
  if (words.size() > 2) return error("usage: " + words[0] + " [VM]");
  std::string vm = words.size() == 2 ? words[1] : "";
  std::optional<vhost::PortConfig> port = PortNamed(vm);
  if (!vm.empty() && !port) return error("no VM named '" + vm + "' (vsocketctl vms lists them)");
  if (port && conns_.away(port->index)) {
    if (words[0] != "drained")
      return error(vm + " runs on another host (vsocketctl migrate end " + vm + " when it is back)");
    return json ? "{\"vm\":\"" + vm + "\",\"draining\":true,\"away\":true,\"leaving\":0,\"accelerated\":0}\n"
                : vm + ": runs on another host, 0 connection(s) still leaving the rings, 0 accelerated\n";
  }
  if (words[0] != "drained") {
    Drain(port ? port->index : ConnManager::kAllVms, words[0] == "drain");
    VS_LOG(kInfo, "operator: %s %s", words[0].c_str(), vm.empty() ? "(all VMs)" : vm.c_str());
  }
  // Where it stands (`drained` says how far a drain got).
  size_t accel = 0, left = Leaving(vm, &accel);
  bool draining = words[0] == "drain";
  if (words[0] == "drained") {
    draining = true;
    for (const vhost::PortConfig& p : *vms_.Get())
      if ((vm.empty() || p.vm_name == vm) && !conns_.away(p.index) && conns_.draining(p.index) == proto::Reason::kNone)
        draining = false;
  }
  std::string name = vm.empty() ? "all VMs" : vm;
  if (json)
    return "{\"vm\":\"" + (vm.empty() ? std::string("*") : vm) + "\",\"draining\":" + (draining ? "true" : "false") +
           ",\"leaving\":" + std::to_string(left) + ",\"accelerated\":" + std::to_string(accel) + "}\n";
  return name + ": " + (draining ? "draining" : "not draining") + ", " + std::to_string(left) +
         " connection(s) still leaving the rings, " + std::to_string(accel) + " accelerated\n";
}

}  // namespace vsocket::backend

namespace vsocket::backend {

std::optional<vhost::PortConfig> Daemon::PortNamed(const std::string& vm) const {
  for (const vhost::PortConfig& p : *vms_.Get())
    if (p.vm_name == vm) return p;
  return std::nullopt;
}

// Moving a guest to another host (docs/operator-guide.md "Moving guests"):
//   migrate begin VM   it drains for kMigration (vsocketctl then waits for
//                      the drain, up to --wait, and sends detach)
//   migrate detach VM  it leaves: connections still on the rings are reset,
//                      its vhost-user port closes (its sessions end)
//   migrate end VM     it runs here (arrived, or its move was called off):
//                      its port opens and it pairs again
std::string Daemon::MigrateCommand(const std::vector<std::string>& words, bool json) {
  auto error = [&](const std::string& msg) { return CtlError(msg, json); };
  if (words.size() != 3 || (words[1] != "begin" && words[1] != "detach" && words[1] != "end"))
    return error("usage: migrate begin|end VM");
  const std::string& vm = words[2];
  MutexLock ops(vm_ops_mu_);  // (the VM stays while it moves)
  std::optional<vhost::PortConfig> port = PortNamed(vm);
  if (!port) return error("no VM named '" + vm + "' (vsocketctl vms lists them)");
  auto answer = [&](const std::string& state, const std::string& text) {
    size_t accel = 0, left = Leaving(vm, &accel);
    if (json)
      return "{\"vm\":\"" + vm + "\",\"state\":\"" + state + "\",\"leaving\":" + std::to_string(left) +
             ",\"accelerated\":" + std::to_string(accel) + "}\n";
    return vm + ": " + text + "\n";
  };
  bool away = conns_.away(port->index);
  if (words[1] == "begin") {
    if (away) return error(vm + " runs on another host already");
    if (!Apply(port->index, ConnManager::VmOp::kDrain, proto::Reason::kMigration))
      return error("vsocketd's worker did not answer in 5 s");
    VS_LOG(kInfo, "operator: migrate begin %s", vm.c_str());
    size_t accel = 0, left = Leaving(vm, &accel);
    return answer("leaving", "leaving this host: draining, " + std::to_string(left) +
                                 " connection(s) still leaving the rings, " + std::to_string(accel) + " accelerated");
  }
  if (words[1] == "detach") {
    if (away) return answer("away", "runs on another host");
    if (conns_.draining(port->index) != proto::Reason::kMigration)
      return error(vm + " is not leaving (vsocketctl migrate begin " + vm + " first)");
    uint64_t reset0 = conns_.counters().migration_resets.load();
    // The port closes only once the worker let the VM go: a running worker
    // would otherwise take each of its sessions' ends for a guest that
    // exited (its connections closed, their peers told EOF).
    if (!Apply(port->index, ConnManager::VmOp::kLeave))
      return error("vsocketd's worker did not answer in 5 s: " + vm + " was not detached");
    uint64_t reset = conns_.counters().migration_resets.load() - reset0;
    {
      MutexLock lock(ports_mu_);
      if (stopping_) return error("vsocketd is stopping");
      if (port_open_.erase(port->index) != 0) {
        // Ends its vhost-user sessions: its libraries go on on kernel TCP
        // (everything moved already, or was reset just now) and connect
        // again wherever the VM's socket path leads next.
        Status st = vhost::VhostBackend::Instance().RemovePort(port->path);
        if (!st.ok()) VS_LOG(kWarn, "vm %s: %s", vm.c_str(), st.ToString().c_str());
      }
    }
    peering_.DirectoryVmAway(vm);  // (withdrawn before the new host publishes it: decision 86)
    VS_LOG(kInfo, "operator: migrate detach %s: left this host, %lu connection(s) reset", vm.c_str(),
           static_cast<unsigned long>(reset));
    return answer("away", "left this host: its vhost-user port is closed; " + std::to_string(reset) +
                              " connection(s) still on the rings were reset");
  }
  // end: only for a VM that runs elsewhere or is leaving (not to undo an
  // operator's drain). The port first: a guest that attaches before the
  // worker applied the arrival waits pending, and pairs with it.
  if (!away && conns_.draining(port->index) != proto::Reason::kMigration)
    return error(vm + " runs here and is not leaving");
  // Published (and seen) before its port opens: the hosts its connections
  // pair with must already place it here (decision 90).
  peering_.DirectoryVmHere(*port);
  {
    MutexLock lock(ports_mu_);
    if (stopping_) return error("vsocketd is stopping");
    if (port_open_.count(port->index) == 0) {
      Status st = vhost::VhostBackend::Instance().AddPort(*port, &worker_);
      if (!st.ok()) return error(vm + ": " + st.message());
      port_open_.insert(port->index);
    }
  }
  if (!Apply(port->index, ConnManager::VmOp::kArrive))
    return error("vsocketd's worker did not answer in 5 s: " + vm + "'s port is open, it may not pair yet");
  VS_LOG(kInfo, "operator: migrate end %s: %s", vm.c_str(), away ? "arrived" : "stays");
  return answer("here", away ? "runs here: its vhost-user port is open" : "runs here (its move was called off)");
}

// vsocketctl locator: the static locator's entries; `locator set TENANT
// ADDRESS[/PREFIX] HOST` sets one (a guest moved); `locator reload` reads
// the file again. Pending connections then look again. With the etcd
// directory (locator = etcd://...): its health and cached entries.
std::string Daemon::LocatorCommand(const std::vector<std::string>& words, bool json) {
  auto error = [&](const std::string& msg) { return CtlError(msg, json); };
  if (words.size() == 1 && peering_.etcd_locator() != nullptr) return peering_.DirectoryReport(json);
  if (words.size() == 1) {
    Result<std::string> text = peering_.LocatorText();
    if (!text.ok()) return error(text.status().message());
    if (!json) return *text;
    std::string out = "[";
    std::istringstream in(*text);
    for (std::string t, a, h; in >> t >> a >> h;)
      out += std::string(out.size() > 1 ? "," : "") + "{\"tenant\":" + t + ",\"address\":\"" + a +
             "\",\"host\":\"" + h + "\"}";
    return out + "]\n";
  }
  std::string done;
  if (words[1] == "set" && words.size() == 5) {
    size_t replaced = 0;
    Status st = peering_.SetLocations(words[2] + " " + words[3] + " " + words[4] + "\n", &replaced);
    if (!st.ok()) return error(st.message());
    done = "tenant " + words[2] + " " + words[3] + " runs on " + words[4] + (replaced ? "" : " (a new entry)");
  } else if (words[1] == "reload" && words.size() == 2) {
    Status st = peering_.ReloadLocator();
    if (!st.ok()) return error(st.message());
    done = "reloaded";
  } else {
    return error("usage: locator [set TENANT ADDRESS[/PREFIX] HOST | reload]");
  }
  (void)Apply(ConnManager::kAllVms, ConnManager::VmOp::kRelocate);
  VS_LOG(kInfo, "operator: locator %s", done.c_str());
  return json ? "{\"locator\":\"" + done + "\"}\n" : "locator: " + done + "\n";
}

std::string Daemon::AttestCommand(const std::vector<std::string>& words, bool json) {
  auto error = [&](const std::string& msg) { return CtlError(msg, json); };
  char* end = nullptr;
  unsigned long long cookie = words.size() == 3 ? std::strtoull(words[2].c_str(), &end, 10) : 0;
  if (words.size() != 3 || *end != '\0' || cookie == 0)
    return error("usage: attest VM COOKIE (vsocketctl attest VM, run inside the VM's network namespace, finds it)");
  std::optional<vhost::PortConfig> port = PortNamed(words[1]);
  if (!port) return error("no VM named '" + words[1] + "' (vsocketctl vms lists them)");
  vhost::VhostBackend::Instance().AttestNetns(port->path, cookie);
  SaveAttested();
  VS_LOG(kInfo, "operator: attest %s (network namespace cookie %llu)", words[1].c_str(), cookie);
  std::string c = std::to_string(cookie);
  return json ? "{\"vm\":\"" + words[1] + "\",\"netns_cookie\":" + c + "}\n"
              : words[1] + ": network namespace " + c + " attested: socket proofs from any other are refused\n";
}

// Kept for the next start: written whole, then renamed over the old.
void Daemon::SaveAttested() {
  std::string text;
  for (const vhost::PortConfig& p : *vms_.Get())
    if (uint64_t c = vhost::VhostBackend::Instance().AttestedNetns(p.path); c != 0)
      text += p.vm_name + " " + std::to_string(c) + "\n";
  std::string path = config_.ctl_socket + ".attested", tmp = path + ".tmp";
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    bool ok = std::fputs(text.c_str(), f) >= 0;
    ok = std::fclose(f) == 0 && ok;
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0)
      VS_LOG(kWarn, "attest: %s not written: the attestation lasts until vsocketd stops", path.c_str());
  }
}

void Daemon::LoadAttested() {
  std::FILE* f = std::fopen((config_.ctl_socket + ".attested").c_str(), "r");
  if (f == nullptr) return;
  char name[256];
  unsigned long long cookie;
  while (std::fscanf(f, "%255s %llu", name, &cookie) == 2)
    if (std::optional<vhost::PortConfig> p = PortNamed(name)) vhost::VhostBackend::Instance().AttestNetns(p->path, cookie);
  std::fclose(f);
}

}  // namespace vsocket::backend
