// vsocketd as one object: the parts it owns, and the order in which they
// start and stop.
//
//   ConnManager     guest connections: registry, pairing, data movers (conn/, remote/)
//   Peering         sessions with the other hosts' vsocketds (peering/)
//   RequestService  what the worker does with each device's queues
//   Worker          the data-path thread that runs RequestService
//   CtlServer       the control socket (vsocketctl), MetricsServer (Prometheus)
#pragma once

#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "host-backend/config.h"
#include "host-backend/conn/conn_manager.h"
#include "host-backend/ctl_server.h"
#include "host-backend/metrics_server.h"
#include "host-backend/peering/peers.h"
#include "host-backend/request_service.h"
#include "host-backend/stats.h"
#include "host-backend/worker.h"

namespace vsocket::backend {

class Daemon {
 public:
  explicit Daemon(DaemonConfig config);

  // Starts peering, the worker, the control socket, the metrics listener
  // (metrics_port != 0) and the VMs' vhost-user ports, in that order. On an
  // error, logs which part failed and returns it.
  Status Start();
  // Stops the worker (nothing more reaches any guest), then removes the
  // ports and stops the metrics listener and the control socket.
  void Stop();
  // Drains (or undrains) VM vm_index, ConnManager::kAllVms for every VM
  // (SIGTERM, before Stop; vsocketctl drain/undrain); back once the worker
  // applied it.
  void Drain(uint32_t vm_index, bool drain);
  // Applies op to VM vm_index (ConnManager::VmOp); back once the worker did.
  // False if it did not within 5 s (a wedged or stopped worker).
  bool Apply(uint32_t vm_index, ConnManager::VmOp op, proto::Reason why = proto::Reason::kOperator);
  // Connections (of VM `vm`; empty: all) a drain asked to leave the rings
  // that have not yet (nor closed), and those accelerated in all.
  size_t Leaving(const std::string& vm, size_t* accelerated = nullptr) const;

 private:
  // vsocketctl drain|undrain|drained [VM]: answered here (they act on the
  // worker); anything else is a report (stats.h).
  std::string CtlCommand(const std::string& command);
  // vsocketctl migrate begin|detach|end VM and locator [set ...|reload].
  std::string MigrateCommand(const std::vector<std::string>& words, bool json);
  std::string LocatorCommand(const std::vector<std::string>& words, bool json);
  // vsocketctl attest VM COOKIE: the VM's network namespace (socket proofs
  // from another are refused). Kept in CTL_SOCKET.attested across restarts
  // (namespace cookies are never reused until the host reboots).
  std::string AttestCommand(const std::vector<std::string>& words, bool json);
  void LoadAttested();
  const vhost::PortConfig* PortNamed(const std::string& vm) const;
  // Held while ports open and close (VhostBackend::AddPort/RemovePort, which
  // take the backend's own lock, and may wait for the worker to let a
  // device go): never taken by anything those call.
  Mutex ports_mu_;
  std::vector<bool> port_open_ GUARDED_BY(ports_mu_);  // per VM index: its vhost-user port is open (not away)
  bool stopping_ GUARDED_BY(ports_mu_) = false;        // Stop() began: no port opens or closes any more
  // Members are constructed in this order (each after the parts it uses)
  // and destroyed in reverse.
  const DaemonConfig config_;
  const int nap_us_;  // EffectiveNapUs (before worker_, which takes it)
  ConnManager conns_;
  Peering peering_{&conns_};
  RequestService service_{&conns_, &peering_};
  Worker worker_;
  const Reporting reporting_{conns_, peering_, service_.counters(), worker_.counters(), config_.vms};
  CtlServer ctl_;
  MetricsServer metrics_;
};

}  // namespace vsocket::backend
