// Every metric of vsocketd, registered once (registry.cc): the daemon-wide
// counters (vhost backend, worker, request service, connection manager,
// peering), the per-VM numbers and the per-peer-host link statistics.
// vsocketctl's text tables, its --json output and the Prometheus exposition
// are all generated from this registry (host-backend/stats.cc); no output
// lists a counter by hand.
#pragma once

#include <cstdint>
#include <vector>

#include "host-backend/conn/counters.h"
#include "host-backend/metrics/metric.h"
#include "host-backend/peering/peers.h"
#include "host-backend/request_service.h"
#include "host-backend/worker.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend::metrics {

// The daemon-wide counters, read as one row.
struct DaemonCounters {
  const vhost::BackendCounters& backend;
  const WorkerCounters& worker;
  const ServiceCounters& service;
  const ConnManagerCounters& conns;
  const PeeringCounters& peering;
};

// One VM: its port, what is attached and registered now, and its totals.
struct VmRow {
  const vhost::PortConfig* vm = nullptr;
  uint64_t devices = 0;      // guest devices attached
  uint64_t connections = 0;  // registered connections
  uint64_t accelerated = 0;  // ... of them upgraded
  const VmTotals* totals = nullptr;
};

struct Registry {
  // `counters` rows and the `stats` objects named by each metric's group.
  std::vector<Metric<DaemonCounters>> daemon;
  // `vms` columns (summed per tenant in `tenants`), labelled vm and tenant.
  std::vector<Metric<VmRow>> vms;
  // `links` columns and `stats` links[] fields, labelled peer.
  std::vector<Metric<PeerSnapshot>> peers;
  // `fallbacks` columns (per VM, and summed per tenant), labelled vm and
  // tenant, and reason in Prometheus.
  std::vector<Metric<VmRow>> fallbacks;
};

const Registry& DaemonMetrics();

// The Prometheus labels of a VM row and of a peer row.
std::string VmLabels(const VmRow& r);
std::string PeerLabels(const PeerSnapshot& p);

}  // namespace vsocket::backend::metrics
