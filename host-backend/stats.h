// vsocketd's reporting: the control-socket commands (for vsocketctl) and
// Prometheus metrics.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "host-backend/conn/conn_manager.h"
#include "host-backend/metrics/registry.h"
#include "host-backend/peering/peers.h"
#include "host-backend/request_service.h"
#include "host-backend/vm_table.h"
#include "host-backend/worker.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {

// What the reports read (any thread).
struct Reporting {
  const ConnManager& conns;
  const Peering& peering;
  const ServiceCounters& service;
  const WorkerCounters& worker;
  const VmTable& vms;  // (a report takes the list as it is when it starts)
};

// Commands (a line; "--json" anywhere selects JSON):
//   stats                 everything, JSON
//   devices | vms | tenants | connections | counters   text table or JSON
//   metrics               Prometheus text exposition
// Unknown commands: an error line (JSON with --json).
std::string HandleCtlCommand(const std::string& command, const Reporting& r);

std::string PrometheusMetrics(const Reporting& r);

// What one report shows, read once; rendered without reading anything else.
struct Report {
  metrics::DaemonCounters counters;
  std::vector<std::shared_ptr<vhost::BackendDevice>> devices;
  std::vector<metrics::VmRow> vms;
  std::vector<PeerSnapshot> peers;
  std::vector<ConnSnapshot> conns;
  std::shared_ptr<const VmTable::Vms> vm_list;  // what the vms rows point into
};

// HandleCtlCommand and PrometheusMetrics on a report (tests).
std::string RenderCommand(const std::string& command, const Report& report);
std::string RenderPrometheus(const Report& report);

}  // namespace vsocket::backend
