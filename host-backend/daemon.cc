#include "host-backend/daemon.h"

#include <unistd.h>

#include <sstream>
#include <utility>
#include <vector>

#include "base/log.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {

Daemon::Daemon(DaemonConfig config)
    : config_(std::move(config)), worker_(&service_, WorkerOptions{config_.poll_us, config_.poll_max_us, 64}) {}

Status Daemon::Start() {
  conns_.SetLocalPorts(&config_.vms);
  conns_.SetOrphanBudgets(uint64_t(config_.orphan_mb_per_vm) << 20, uint64_t(config_.orphan_mb_total) << 20);
  conns_.SetConnsPerVm(static_cast<uint32_t>(config_.max_conns_per_vm));
  Status st = peering_.Start(config_);
  if (!st.ok()) {
    VS_LOG(kError, "peering: %s", st.ToString().c_str());
    return st;
  }
  if (peering_.enabled()) worker_.AddWakeFd(peering_.wake_fd());
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
  for (const vhost::PortConfig& p : config_.vms) {
    st = vhost::VhostBackend::Instance().AddPort(p, &worker_);
    if (!st.ok()) {
      VS_LOG(kError, "%s", st.ToString().c_str());
      return st;
    }
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
  worker_.Stop();
  for (const vhost::PortConfig& p : config_.vms) (void)vhost::VhostBackend::Instance().RemovePort(p.path);
  metrics_.Stop();
  ctl_.Stop();
}

}  // namespace vsocket::backend

namespace vsocket::backend {

void Daemon::Drain(uint32_t vm_index, bool drain) {
  uint64_t seq = conns_.RequestDrain(vm_index, drain, proto::Reason::kOperator);
  worker_.Wake();
  // Back once the worker applied it (its next pass: at once, unless it is
  // wedged), so that what the caller counts next includes it.
  for (int i = 0; i < 1000 && conns_.drains_applied() < seq; ++i) usleep(1000);
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
  if (words.empty() || (words[0] != "drain" && words[0] != "undrain" && words[0] != "drained"))
    return HandleCtlCommand(line, reporting_);
  auto error = [&](const std::string& msg) {
    return json ? "{\"error\":\"" + msg + "\"}\n" : "error: " + msg + "\n";
  };
  if (words.size() > 2) return error("usage: " + words[0] + " [VM]");
  std::string vm = words.size() == 2 ? words[1] : "";
  const vhost::PortConfig* port = nullptr;
  for (const vhost::PortConfig& p : config_.vms)
    if (p.vm_name == vm) port = &p;
  if (!vm.empty() && port == nullptr) return error("no VM named '" + vm + "' (vsocketctl vms lists them)");
  if (words[0] != "drained") {
    Drain(port ? port->index : ConnManager::kAllVms, words[0] == "drain");
    VS_LOG(kInfo, "operator: %s %s", words[0].c_str(), vm.empty() ? "(all VMs)" : vm.c_str());
  }
  // Where it stands (`drained` says how far a drain got).
  size_t accel = 0, left = Leaving(vm, &accel);
  bool draining = words[0] == "drain";
  if (words[0] == "drained") {
    draining = true;
    for (const vhost::PortConfig& p : config_.vms)
      if ((vm.empty() || p.vm_name == vm) && conns_.draining(p.index) == proto::Reason::kNone) draining = false;
  }
  std::string name = vm.empty() ? "all VMs" : vm;
  if (json)
    return "{\"vm\":\"" + (vm.empty() ? std::string("*") : vm) + "\",\"draining\":" + (draining ? "true" : "false") +
           ",\"leaving\":" + std::to_string(left) + ",\"accelerated\":" + std::to_string(accel) + "}\n";
  return name + ": " + (draining ? "draining" : "not draining") + ", " + std::to_string(left) +
         " connection(s) still leaving the rings, " + std::to_string(accel) + " accelerated\n";
}

}  // namespace vsocket::backend
