#include "host-backend/metrics/registry.h"

namespace vsocket::backend::metrics {
namespace {

using D = DaemonCounters;
using V = VmRow;
using P = PeerSnapshot;
constexpr Type kCounter = Type::kCounter;
constexpr Type kGauge = Type::kGauge;

// Help texts of Prometheus families that several metrics share.
constexpr const char* kRejectedHelp = "Registrations refused, by reason.";
constexpr const char* kFramesDroppedHelp = "Fabric frames dropped (unknown or foreign connection).";
constexpr const char* kPeersRefusedHelp = "Peer backend connections refused, by reason.";
constexpr const char* kModeHelp = "Registered connections per VM and mode.";
constexpr const char* kAccelBytesHelp = "Bytes moved on the accelerated path.";
constexpr const char* kLinkFramesHelp = "Fabric frames per peer and direction.";
constexpr const char* kLinkBytesHelp = "Payload bytes on fabric links per peer and direction.";
constexpr const char* kPayloadHelp =
    "DATA payload sent per peer: read in place from registered guest TX rings (rdma) or copied first.";

// Daemon-wide, in the order of `stats` (by group) and `counters`. `row`
// keeps the `counters` names scripts read where they differ from the JSON
// field; `prom` keeps the Prometheus names dashboards use where they differ
// from vsocket_<row>[_total].
std::vector<Metric<D>> Daemon() {
  return {
      // vhost-user backend (vhost/backend).
      {.name = "connections", .type = kCounter, .help = "vhost-user connections accepted on the VMs' sockets.",
       .read = [](const D& c) -> uint64_t { return c.backend.connections.load(); },
       .group = "backend", .row = "vhost_connections"},
      {.name = "devices_started", .type = kCounter, .help = "Guest devices started.",
       .read = [](const D& c) -> uint64_t { return c.backend.devices_started.load(); }, .group = "backend"},
      {.name = "devices_rejected", .type = kCounter,
       .help = "Guest devices refused at start (invalid rings or memory).",
       .read = [](const D& c) -> uint64_t { return c.backend.devices_rejected.load(); }, .group = "backend"},
      {.name = "devices_stopped", .type = kCounter, .help = "Guest devices stopped.",
       .read = [](const D& c) -> uint64_t { return c.backend.devices_stopped.load(); }, .group = "backend"},
      {.name = "reconfigurations", .type = kCounter, .help = "vhost-user messages handled while a device ran.",
       .read = [](const D& c) -> uint64_t { return c.backend.reconfigurations.load(); }, .group = "backend"},
      // The data-path worker.
      {.name = "sleeps", .type = kCounter, .help = "Times the data-path worker went to sleep.",
       .read = [](const D& c) -> uint64_t { return c.worker.sleeps.load(); }, .group = "worker",
       .row = "worker_sleeps"},
      {.name = "wakeups", .type = kCounter, .help = "Times the data-path worker slept and woke up.",
       .read = [](const D& c) -> uint64_t { return c.worker.wakeups.load(); }, .group = "worker",
       .row = "worker_wakeups"},
      {.name = "broken_devices", .type = kCounter, .help = "Guest devices latched broken for ring violations.",
       .read = [](const D& c) -> uint64_t { return c.worker.broken_devices.load(); }, .group = "worker"},
      // The request service (HELLO, ECHO, undecodable messages).
      {.name = "hellos", .type = kCounter, .help = "HELLO requests answered.",
       .read = [](const D& c) -> uint64_t { return c.service.hellos.load(); }, .group = "service"},
      {.name = "echoes", .type = kCounter, .help = "ECHO requests answered.",
       .read = [](const D& c) -> uint64_t { return c.service.echoes.load(); }, .group = "service"},
      {.name = "echo_bytes", .type = kCounter, .help = "ECHO payload bytes answered.",
       .read = [](const D& c) -> uint64_t { return c.service.echo_bytes.load(); }, .group = "service"},
      {.name = "bad_messages", .type = kCounter, .help = "Guest requests that were not a valid message.",
       .read = [](const D& c) -> uint64_t { return c.service.bad_messages.load(); }, .group = "service"},
      {.name = "checksum_errors", .type = kCounter, .help = "ECHO requests with a wrong checksum.",
       .read = [](const D& c) -> uint64_t { return c.service.checksum_errors.load(); }, .group = "service"},
      // The connection manager.
      {.name = "registered", .type = kCounter, .help = "Connections registered by guests, all VMs.",
       .read = [](const D& c) -> uint64_t { return c.conns.registered.load(); },
       .prom = {"vsocket_connections_registered_total"}, .group = "conn_counters", .row = "registrations"},
      {.name = "active", .type = kGauge, .help = "Registered connections whose guest has not closed them.",
       .read = [](const D& c) -> uint64_t { return c.conns.active.load(); }, .group = "conn_counters",
       .row = "active_connections"},
      {.name = "upgrades", .type = kCounter, .help = "Connections switched to the accelerated path, all VMs.",
       .read = [](const D& c) -> uint64_t { return c.conns.upgrades.load(); },
       .prom = {"vsocket_connections_upgraded_total"}, .group = "conn_counters"},
      {.name = "rejected_spoofed", .type = kCounter, .help = kRejectedHelp,
       .read = [](const D& c) -> uint64_t { return c.conns.rejected_spoofed.load(); },
       .prom = {"vsocket_rejected_registrations_total", "reason=\"spoofed-address\""}, .group = "conn_counters"},
      {.name = "rejected_other", .type = kCounter, .help = kRejectedHelp,
       .read = [](const D& c) -> uint64_t { return c.conns.rejected_other.load(); },
       .prom = {"vsocket_rejected_registrations_total", "reason=\"other\""}, .group = "conn_counters"},
      {.name = "cross_tenant", .type = kCounter,
       .help = "Connections kept on kernel TCP because the peer is in another tenant.",
       .read = [](const D& c) -> uint64_t { return c.conns.cross_tenant.load(); }, .group = "conn_counters"},
      {.name = "accel_bytes", .type = kCounter, .help = "Bytes moved on the accelerated path, all VMs.",
       .read = [](const D& c) -> uint64_t { return c.conns.accel_bytes.load(); }, .group = "conn_counters"},
      {.name = "events", .type = kCounter, .help = "Events written to guests.",
       .read = [](const D& c) -> uint64_t { return c.conns.events.load(); }, .group = "conn_counters"},
      {.name = "event_stalls", .type = kCounter, .help = "Times events waited for a guest to post event buffers.",
       .read = [](const D& c) -> uint64_t { return c.conns.event_stalls.load(); }, .group = "conn_counters"},
      {.name = "protocol_violations", .type = kCounter,
       .help = "Guest messages outside the protocol (connection reset).",
       .read = [](const D& c) -> uint64_t { return c.conns.protocol_violations.load(); }, .group = "conn_counters"},
      {.name = "doorbell_sessions", .type = kCounter, .help = "Guest sessions that took the doorbell feature.",
       .read = [](const D& c) -> uint64_t { return c.conns.doorbell_sessions.load(); }, .group = "conn_counters"},
      {.name = "doorbell_counts", .type = kCounter,
       .help = "Send/consume counts read from connections' doorbell blocks (no guest message needed while polled).",
       .read = [](const D& c) -> uint64_t { return c.conns.doorbell_counts.load(); }, .group = "conn_counters"},
      {.name = "doorbell_messages", .type = kCounter,
       .help = "TX_TAIL/CONSUMED messages of doorbell connections (the block was armed).",
       .read = [](const D& c) -> uint64_t { return c.conns.doorbell_messages.load(); }, .group = "conn_counters"},
      {.name = "doorbell_arms", .type = kCounter, .help = "Doorbell blocks armed (polling stopped, messages asked for).",
       .read = [](const D& c) -> uint64_t { return c.conns.doorbell_arms.load(); }, .group = "conn_counters"},
      {.name = "pair_requests_sent", .type = kCounter, .help = "PAIR_REQUESTs sent to peer hosts.",
       .read = [](const D& c) -> uint64_t { return c.conns.pair_requests_sent.load(); }, .group = "conn_counters"},
      {.name = "pair_requests_received", .type = kCounter, .help = "PAIR_REQUESTs received from peer hosts.",
       .read = [](const D& c) -> uint64_t { return c.conns.pair_requests_received.load(); },
       .group = "conn_counters"},
      {.name = "pair_refused", .type = kCounter, .help = "Pairing requests refused (a peer asked for what we do not run).",
       .read = [](const D& c) -> uint64_t { return c.conns.pair_refused.load(); }, .group = "conn_counters"},
      {.name = "remote_upgrades", .type = kCounter, .help = "Connections upgraded with a peer on another host.",
       .read = [](const D& c) -> uint64_t { return c.conns.remote_upgrades.load(); }, .group = "conn_counters"},
      {.name = "fabric_bytes_out", .type = kCounter, .help = "Accelerated bytes sent to peer hosts.",
       .read = [](const D& c) -> uint64_t { return c.conns.fabric_bytes_out.load(); }, .group = "conn_counters"},
      {.name = "fabric_bytes_in", .type = kCounter, .help = "Accelerated bytes received from peer hosts.",
       .read = [](const D& c) -> uint64_t { return c.conns.fabric_bytes_in.load(); }, .group = "conn_counters"},
      {.name = "fabric_bytes_placed", .type = kCounter,
       .help = "Of fabric_bytes_in: written one-sided into guest RX rings (rdma).",
       .read = [](const D& c) -> uint64_t { return c.conns.fabric_bytes_placed.load(); }, .group = "conn_counters"},
      {.name = "rdma_rx_regions", .type = kCounter, .help = "Guest RX rings registered for peer hosts to write.",
       .read = [](const D& c) -> uint64_t { return c.conns.rdma_rx_regions.load(); }, .group = "conn_counters"},
      {.name = "rdma_rx_regions_dropped", .type = kCounter, .help = "Guest RX ring registrations dropped again.",
       .read = [](const D& c) -> uint64_t { return c.conns.rdma_rx_regions_dropped.load(); },
       .group = "conn_counters"},
      {.name = "rdma_rx_withdrawn", .type = kCounter,
       .help = "Of those: dropped after the peer acknowledged a PLACEMENT.",
       .read = [](const D& c) -> uint64_t { return c.conns.rdma_rx_withdrawn.load(); }, .group = "conn_counters"},
      {.name = "rdma_tx_regions", .type = kCounter, .help = "Guest TX rings registered for sends to read in place.",
       .read = [](const D& c) -> uint64_t { return c.conns.rdma_tx_regions.load(); }, .group = "conn_counters"},
      {.name = "rdma_tx_regions_dropped", .type = kCounter, .help = "Guest TX ring registrations withdrawn again.",
       .read = [](const D& c) -> uint64_t { return c.conns.rdma_tx_regions_dropped.load(); },
       .group = "conn_counters"},
      {.name = "rdma_reg_us", .type = kCounter, .help = "Microseconds spent registering guest rings (RX and TX).",
       .read = [](const D& c) -> uint64_t { return c.conns.rdma_reg_us.load(); }, .group = "conn_counters"},
      {.name = "credit_held", .type = kCounter,
       .help = "Credits held back: the peer consumed bytes a send still read.",
       .read = [](const D& c) -> uint64_t { return c.conns.credit_held.load(); }, .group = "conn_counters"},
      {.name = "rings_held", .type = kCounter,
       .help = "Closed connections whose rings the guest had to keep until sends or peer writes finished.",
       .read = [](const D& c) -> uint64_t { return c.conns.rings_held.load(); }, .group = "conn_counters"},
      {.name = "rings_released", .type = kCounter, .help = "RINGS_RELEASED owed to guests for held rings.",
       .read = [](const D& c) -> uint64_t { return c.conns.rings_released.load(); }, .group = "conn_counters"},
      {.name = "frames_dropped", .type = kCounter,
       .help = "Fabric frames dropped, any reason (unknown handle, wrong tenant or wrong host).",
       .read = [](const D& c) -> uint64_t { return c.conns.frames_dropped.load(); }, .group = "conn_counters"},
      {.name = "frames_cross_tenant", .type = kCounter, .help = kFramesDroppedHelp,
       .read = [](const D& c) -> uint64_t { return c.conns.frames_cross_tenant.load(); },
       .prom = {"vsocket_fabric_frames_dropped_total", "reason=\"cross-tenant\""}, .group = "conn_counters"},
      {.name = "frames_dropped_other", .type = kCounter, .help = kFramesDroppedHelp,
       .read = [](const D& c) -> uint64_t { return c.conns.frames_dropped.load() - c.conns.frames_cross_tenant.load(); },
       .prom = {"vsocket_fabric_frames_dropped_total", "reason=\"other\""}, .group = "conn_counters"},
      {.name = "fabric_violations", .type = kCounter,
       .help = "Fabric frames outside a connection's window (that connection is reset).",
       .read = [](const D& c) -> uint64_t { return c.conns.fabric_violations.load(); }, .group = "conn_counters"},
      {.name = "fabric_downgrades", .type = kCounter, .help = "Connections taken off the fabric (link lost).",
       .read = [](const D& c) -> uint64_t { return c.conns.fabric_downgrades.load(); }, .group = "conn_counters"},
      // Peering.
      {.name = "refused_tls", .type = kCounter, .help = kPeersRefusedHelp,
       .read = [](const D& c) -> uint64_t { return c.peering.refused_tls.load(); },
       .prom = {"vsocket_peers_refused_total", "reason=\"tls\""}, .group = "peering", .row = "peers_refused_tls"},
      {.name = "refused_name", .type = kCounter, .help = kPeersRefusedHelp,
       .read = [](const D& c) -> uint64_t { return c.peering.refused_name.load(); },
       .prom = {"vsocket_peers_refused_total", "reason=\"unknown-peer\""}, .group = "peering",
       .row = "peers_refused_name"},
      {.name = "refused_link", .type = kCounter, .help = kPeersRefusedHelp,
       .read = [](const D& c) -> uint64_t { return c.peering.refused_link.load(); },
       .prom = {"vsocket_peers_refused_total", "reason=\"bad-link-key\""}, .group = "peering",
       .row = "peers_refused_link"},
  };
}

// Per VM, in the order of the `vms` columns.
std::vector<Metric<V>> Vms() {
  return {
      {.name = "devices", .type = kGauge, .help = "Guest devices (one per attached guest process) per VM.",
       .read = [](const V& v) -> uint64_t { return v.devices; }},
      {.name = "connections", .type = kGauge, .help = "Registered connections per VM, any mode.",
       .read = [](const V& v) -> uint64_t { return v.connections; }, .prom = {"vsocket_registered_connections"}},
      {.name = "accelerated", .type = kGauge, .help = kModeHelp,
       .read = [](const V& v) -> uint64_t { return v.accelerated; },
       .prom = {"vsocket_connections", "mode=\"accelerated\""}},
      {.name = "kernel", .type = kGauge, .help = kModeHelp,
       .read = [](const V& v) -> uint64_t { return v.connections - v.accelerated; },
       .prom = {"vsocket_connections", "mode=\"kernel\""}},
      {.name = "registrations", .type = kCounter, .help = "Connections registered by guests.",
       .read = [](const V& v) -> uint64_t { return v.totals->registrations.load(); }},
      {.name = "upgrades", .type = kCounter, .help = "Connections switched to the accelerated path.",
       .read = [](const V& v) -> uint64_t { return v.totals->upgrades.load(); }},
      {.name = "accel_bytes_out", .type = kCounter, .help = kAccelBytesHelp,
       .read = [](const V& v) -> uint64_t { return v.totals->accel_bytes_out.load(); },
       .prom = {"vsocket_accelerated_bytes_total", "direction=\"out\""}},
      {.name = "accel_bytes_in", .type = kCounter, .help = kAccelBytesHelp,
       .read = [](const V& v) -> uint64_t { return v.totals->accel_bytes_in.load(); },
       .prom = {"vsocket_accelerated_bytes_total", "direction=\"in\""}},
  };
}

// Per peer host (totals over the links it had), in the order of the
// `stats` links[] fields.
std::vector<Metric<P>> Peers() {
  return {
      {.name = "connects", .type = kCounter, .help = "Times the fabric session with a peer host came up.",
       .read = [](const P& p) -> uint64_t { return p.connects; }, .prom = {"vsocket_link_connects_total"}},
      {.name = "losses", .type = kCounter, .help = "Fabric links lost after being up.",
       .read = [](const P& p) -> uint64_t { return p.losses; }, .prom = {"vsocket_link_losses_total"}},
      {.name = "frames_out", .type = kCounter, .help = kLinkFramesHelp,
       .read = [](const P& p) -> uint64_t { return p.frames_out; },
       .prom = {"vsocket_link_frames_total", "direction=\"out\""}},
      {.name = "frames_in", .type = kCounter, .help = kLinkFramesHelp,
       .read = [](const P& p) -> uint64_t { return p.frames_in; },
       .prom = {"vsocket_link_frames_total", "direction=\"in\""}},
      {.name = "data_bytes_out", .type = kCounter, .help = kLinkBytesHelp,
       .read = [](const P& p) -> uint64_t { return p.data_bytes_out; },
       .prom = {"vsocket_link_bytes_total", "direction=\"out\""}},
      {.name = "data_bytes_in", .type = kCounter, .help = kLinkBytesHelp,
       .read = [](const P& p) -> uint64_t { return p.data_bytes_in; },
       .prom = {"vsocket_link_bytes_total", "direction=\"in\""}},
      {.name = "write_calls", .type = kCounter, .help = "Write calls on fabric links (frames/writes = batching).",
       .read = [](const P& p) -> uint64_t { return p.write_calls; }, .prom = {"vsocket_link_writes_total"}},
      {.name = "read_calls", .type = kCounter, .help = "Read calls on fabric links.",
       .read = [](const P& p) -> uint64_t { return p.read_calls; }, .prom = {"vsocket_link_reads_total"}},
      {.name = "busy", .type = kCounter, .help = "Sends a fabric link refused because it was full (retried later).",
       .read = [](const P& p) -> uint64_t { return p.busy; }, .prom = {"vsocket_link_busy_total"}},
      {.name = "copied_bytes", .type = kCounter, .help = kPayloadHelp,
       .read = [](const P& p) -> uint64_t { return p.copied_bytes; },
       .prom = {"vsocket_link_payload_bytes_total", "how=\"copied\""}},
      {.name = "inplace_bytes", .type = kCounter, .help = kPayloadHelp,
       .read = [](const P& p) -> uint64_t { return p.inplace_bytes; },
       .prom = {"vsocket_link_payload_bytes_total", "how=\"in-place\""}},
      {.name = "links", .type = kGauge, .help = "Data links (TCP connections or RC QPs) up to a peer host.",
       .read = [](const P& p) -> uint64_t { return p.link_frames_out.size(); }, .prom = {"vsocket_links"}},
      // Not "up": deploy/testbed2.sh and tests/e2e/cross_host.sh take " up " in
      // the `links` text for the state column.
      {.name = "link_up", .type = kGauge, .help = "Fabric link to a peer host is up (1) or not (0).",
       .read = [](const P& p) -> uint64_t { return p.state == "up"; }, .prom = {"vsocket_link_up"},
       .row_labels = [](const P& p) { return "fabric=\"" + JsonEscape(p.fabric) + "\""; }},
  };
}

}  // namespace

const Registry& DaemonMetrics() {
  static const Registry registry{Daemon(), Vms(), Peers()};
  return registry;
}

std::string VmLabels(const VmRow& r) {
  return "vm=\"" + JsonEscape(r.vm->vm_name) + "\",tenant=\"" + std::to_string(r.vm->tenant_id) + "\"";
}

std::string PeerLabels(const PeerSnapshot& p) { return "peer=\"" + JsonEscape(p.name) + "\""; }

}  // namespace vsocket::backend::metrics
