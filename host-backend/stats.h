// vsocketd's reporting: the control-socket commands (for vsocketctl) and
// Prometheus metrics.
#pragma once

#include <string>
#include <vector>

#include "host-backend/control_service.h"
#include "host-backend/worker.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {

struct Reporting {
  const ControlService& service;
  const Worker& worker;
  const std::vector<vhost::PortConfig>& vms;
};

// Commands (a line; "--json" anywhere selects JSON):
//   stats                 everything, JSON
//   devices | vms | tenants | connections | counters   text table or JSON
//   metrics               Prometheus text exposition
// Unknown commands: an error line (JSON with --json).
std::string HandleCtlCommand(const std::string& command, const Reporting& r);

std::string PrometheusMetrics(const Reporting& r);

}  // namespace vsocket::backend
