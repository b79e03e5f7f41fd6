// vsocketd as one object: the parts it owns, and the order in which they
// start and stop.
//
//   ConnManager     guest connections: registry, pairing, data movers (conn/, remote/)
//   Peering         sessions with the other hosts' vsocketds (peering/)
//   RequestService  what the worker does with each device's queues
//   Worker          the data-path thread that runs RequestService
//   CtlServer       the control socket (vsocketctl), MetricsServer (Prometheus)
#pragma once

#include <optional>
#include <set>
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
#include "host-backend/vms_dir.h"
#include "host-backend/stats.h"
#include "host-backend/vm_table.h"
#include "host-backend/worker.h"

namespace vsocket::backend {

// A control command's error answer ("error: MSG", or {"error":"MSG"}).
std::string CtlError(const std::string& msg, bool json);

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
  void SaveAttested();  // (the VMs' attestations now, in CTL_SOCKET.attested)
  // vsocketctl vm add NAME --KEY VALUE... | vm remove NAME (decision 105):
  // a VM added or removed at runtime, kept in the VMs directory.
  std::string VmCommand(const std::vector<std::string>& words, bool json);
  std::string VmAdd(const std::vector<std::string>& words, bool json);
  // begin (vm remove-begin, vsocketctl's first step): checks, then drains.
  std::string VmRemove(const std::string& vm, bool json, bool begin);
  // The tenants of the VMs in `vms` (the directory follows those).
  static std::set<uint32_t> TenantsOf(const VmTable::Vms& vms);
  // The VM named `vm` as the table has it now (a copy: the table may change).
  std::optional<vhost::PortConfig> PortNamed(const std::string& vm) const;
  // Serialises vm add, vm remove and migrate (each reads the table, then
  // changes it or the VM's port): taken before ports_mu_.
  Mutex vm_ops_mu_ ACQUIRED_BEFORE(ports_mu_);
  uint32_t next_index_ GUARDED_BY(vm_ops_mu_) = 0;  // the index vm add gives next (never one used before)
  // Held while ports open and close (VhostBackend::AddPort/RemovePort, which
  // take the backend's own lock, and may wait for the worker to let a
  // device go): never taken by anything those call.
  Mutex ports_mu_;
  std::set<uint32_t> port_open_ GUARDED_BY(ports_mu_);  // VM indices whose vhost-user port is open (not away)
  bool stopping_ GUARDED_BY(ports_mu_) = false;        // Stop() began: no port opens or closes any more
  // Members are constructed in this order (each after the parts it uses)
  // and destroyed in reverse.
  const DaemonConfig config_;  // as started (its vms: the table's first list; vms_ has them now)
  VmTable vms_{config_.vms};
  const int nap_us_;  // EffectiveNapUs (before worker_, which takes it)
  ConnManager conns_;
  Peering peering_{&conns_};
  RequestService service_{&conns_, &peering_, VmsDir(config_)};
  Worker worker_;
  const Reporting reporting_{conns_, peering_, service_.counters(), worker_.counters(), vms_};
  CtlServer ctl_;
  MetricsServer metrics_;
};

}  // namespace vsocket::backend
