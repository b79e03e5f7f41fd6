#include "host-backend/daemon.h"

#include <utility>

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
  st = ctl_.Start(config_.ctl_socket, [this](const std::string& cmd) { return HandleCtlCommand(cmd, reporting_); });
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
