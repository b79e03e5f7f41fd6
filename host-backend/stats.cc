#include "host-backend/stats.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {
namespace {

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

std::string EndpointText(const proto::Endpoint& e) {
  char buf[INET6_ADDRSTRLEN] = "?";
  inet_ntop(e.family == proto::Family::kIpv6 ? AF_INET6 : AF_INET, e.addr.data(), buf, sizeof(buf));
  return std::string(buf) + ":" + std::to_string(e.port);
}

void Field(std::string& out, const char* name, uint64_t v, bool comma = true) {
  out += "\"";
  out += name;
  out += "\":";
  out += std::to_string(v);
  if (comma) out += ",";
}

std::string Stats(const Reporting& r) {
  auto& backend = vhost::VhostBackend::Instance();
  const auto& bc = backend.counters();
  const auto& sc = r.service;
  const auto& wc = r.worker;
  std::string out = "{\"backend\":{";
  Field(out, "connections", bc.connections.load());
  Field(out, "devices_started", bc.devices_started.load());
  Field(out, "devices_rejected", bc.devices_rejected.load());
  Field(out, "devices_stopped", bc.devices_stopped.load());
  Field(out, "reconfigurations", bc.reconfigurations.load(), false);
  out += "},\"worker\":{";
  Field(out, "sleeps", wc.sleeps.load());
  Field(out, "wakeups", wc.wakeups.load());
  Field(out, "broken_devices", wc.broken_devices.load(), false);
  out += "},\"service\":{";
  Field(out, "hellos", sc.hellos.load());
  Field(out, "echoes", sc.echoes.load());
  Field(out, "echo_bytes", sc.echo_bytes.load());
  Field(out, "bad_messages", sc.bad_messages.load());
  Field(out, "checksum_errors", sc.checksum_errors.load(), false);
  out += "},\"devices\":[";
  bool first = true;
  for (const auto& d : backend.Devices()) {
    if (!first) out += ",";
    first = false;
    out += "{";
    Field(out, "id", d->id());
    Field(out, "vid", static_cast<uint64_t>(d->vid()));
    out += "\"vm\":\"" + JsonEscape(d->port()->vm_name) + "\",";
    Field(out, "tenant", d->port()->tenant_id);
    out += std::string("\"broken\":") + (d->broken() ? "true" : "false") + ",";
    out += "\"broken_reason\":\"" + JsonEscape(d->broken_reason()) + "\",";
    Field(out, "requests", d->counters().requests.load());
    Field(out, "bad_messages", d->counters().bad_messages.load());
    Field(out, "notifications", d->counters().notifications.load());
    Field(out, "wakeups", d->counters().wakeups.load(), false);
    out += "}";
  }
  out += "],\"conn_counters\":{";
  const auto& cc = r.conns.counters();
  Field(out, "registered", cc.registered.load());
  Field(out, "active", cc.active.load());
  Field(out, "upgrades", cc.upgrades.load());
  Field(out, "rejected_spoofed", cc.rejected_spoofed.load());
  Field(out, "rejected_other", cc.rejected_other.load());
  Field(out, "cross_tenant", cc.cross_tenant.load());
  Field(out, "accel_bytes", cc.accel_bytes.load());
  Field(out, "events", cc.events.load());
  Field(out, "event_stalls", cc.event_stalls.load());
  Field(out, "protocol_violations", cc.protocol_violations.load());
  Field(out, "doorbell_sessions", cc.doorbell_sessions.load());
  Field(out, "doorbell_counts", cc.doorbell_counts.load());
  Field(out, "doorbell_messages", cc.doorbell_messages.load());
  Field(out, "doorbell_arms", cc.doorbell_arms.load());
  Field(out, "pair_requests_sent", cc.pair_requests_sent.load());
  Field(out, "pair_requests_received", cc.pair_requests_received.load());
  Field(out, "pair_refused", cc.pair_refused.load());
  Field(out, "remote_upgrades", cc.remote_upgrades.load());
  Field(out, "fabric_bytes_out", cc.fabric_bytes_out.load());
  Field(out, "fabric_bytes_in", cc.fabric_bytes_in.load());
  Field(out, "fabric_bytes_placed", cc.fabric_bytes_placed.load());
  Field(out, "rdma_rx_regions", cc.rdma_rx_regions.load());
  Field(out, "rdma_rx_regions_dropped", cc.rdma_rx_regions_dropped.load());
  Field(out, "rdma_rx_withdrawn", cc.rdma_rx_withdrawn.load());
  Field(out, "rdma_tx_regions", cc.rdma_tx_regions.load());
  Field(out, "rdma_tx_regions_dropped", cc.rdma_tx_regions_dropped.load());
  Field(out, "rdma_reg_us", cc.rdma_reg_us.load());
  Field(out, "credit_held", cc.credit_held.load());
  Field(out, "rings_held", cc.rings_held.load());
  Field(out, "rings_released", cc.rings_released.load());
  Field(out, "frames_dropped", cc.frames_dropped.load());
  Field(out, "frames_cross_tenant", cc.frames_cross_tenant.load());
  Field(out, "fabric_violations", cc.fabric_violations.load());
  Field(out, "fabric_downgrades", cc.fabric_downgrades.load(), false);
  out += "},\"links\":[";
  first = true;
  for (const PeerSnapshot& p : r.peering.Snapshot()) {
    if (!first) out += ",";
    first = false;
    out += "{\"peer\":\"" + JsonEscape(p.name) + "\",\"address\":\"" + JsonEscape(p.address) +
           "\",\"fabric\":\"" + p.fabric + "\",\"state\":\"" + p.state + "\",\"last_error\":\"" + JsonEscape(p.last_error) + "\",";
    Field(out, "connects", p.connects);
    Field(out, "losses", p.losses);
    Field(out, "frames_out", p.frames_out);
    Field(out, "frames_in", p.frames_in);
    Field(out, "data_bytes_out", p.data_bytes_out);
    Field(out, "data_bytes_in", p.data_bytes_in);
    Field(out, "write_calls", p.write_calls);
    Field(out, "read_calls", p.read_calls);
    Field(out, "busy", p.busy);
    Field(out, "copied_bytes", p.copied_bytes);
    Field(out, "inplace_bytes", p.inplace_bytes);
    out += "\"links\":" + std::to_string(p.link_frames_out.size()) + ",\"link_frames_out\":[";
    for (size_t i = 0; i < p.link_frames_out.size(); ++i)
      out += (i ? "," : "") + std::to_string(p.link_frames_out[i]);
    out += "]}";
  }
  out += "],\"connections\":[";
  first = true;
  for (const ConnSnapshot& c : r.conns.Snapshot()) {
    if (!first) out += ",";
    first = false;
    out += "{";
    Field(out, "handle", c.handle);
    Field(out, "device", c.device_id);
    out += "\"vm\":\"" + JsonEscape(c.vm) + "\",";
    Field(out, "tenant", c.tenant);
    out += "\"local\":\"" + EndpointText(c.local) + "\",\"peer\":\"" + EndpointText(c.peer) + "\",";
    out += std::string("\"mode\":\"") + ToString(c.state) + "\",";
    out += std::string("\"reason\":\"") + proto::ToString(c.reason) + "\",";
    Field(out, "accel_bytes_out", c.accel_out);
    Field(out, "accel_bytes_in", c.accel_in);
    Field(out, "kernel_bytes_before_upgrade", c.kernel_out, false);
    out += "}";
  }
  out += "]}\n";
  return out;
}

// ---- views -------------------------------------------------------------------

// A table rendered as aligned text or as a JSON array of objects.
struct Table {
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;
  std::vector<bool> numeric;  // per column: JSON number, not string

  std::string Text() const {
    std::vector<size_t> w(columns.size());
    for (size_t i = 0; i < columns.size(); ++i) w[i] = columns[i].size();
    for (const auto& row : rows)
      for (size_t i = 0; i < row.size(); ++i) w[i] = std::max(w[i], row[i].size());
    std::string out;
    auto line = [&](const std::vector<std::string>& cells) {
      for (size_t i = 0; i < cells.size(); ++i) {
        out += cells[i];
        if (i + 1 < cells.size()) out += std::string(w[i] - cells[i].size() + 2, ' ');
      }
      out += "\n";
    };
    line(columns);
    for (const auto& row : rows) line(row);
    if (rows.empty()) out += "(none)\n";
    return out;
  }
  std::string Json() const {
    std::string out = "[";
    for (size_t r = 0; r < rows.size(); ++r) {
      out += r ? ",{" : "{";
      for (size_t i = 0; i < columns.size(); ++i) {
        if (i) out += ",";
        out += "\"" + columns[i] + "\":";
        out += numeric[i] ? rows[r][i] : "\"" + JsonEscape(rows[r][i]) + "\"";
      }
      out += "}";
    }
    return out + "]\n";
  }
};

Table Devices() {
  Table t{{"id", "vm", "tenant", "vid", "state", "requests", "notifications", "wakeups", "broken_reason"},
          {},
          {true, false, true, true, false, true, true, true, false}};
  for (const auto& d : vhost::VhostBackend::Instance().Devices()) {
    t.rows.push_back({std::to_string(d->id()), d->port()->vm_name, std::to_string(d->port()->tenant_id),
                      std::to_string(d->vid()), d->broken() ? "broken" : "running",
                      std::to_string(d->counters().requests.load()),
                      std::to_string(d->counters().notifications.load()),
                      std::to_string(d->counters().wakeups.load()), d->broken_reason()});
  }
  return t;
}

Table Vms(const Reporting& r) {
  Table t{{"vm", "tenant", "socket", "devices", "connections", "accelerated", "registrations", "upgrades",
           "accel_bytes_out", "accel_bytes_in"},
          {},
          {false, true, false, true, true, true, true, true, true, true}};
  auto devices = vhost::VhostBackend::Instance().Devices();
  auto conns = r.conns.Snapshot();
  for (const vhost::PortConfig& vm : r.vms) {
    size_t ndev = 0, nconn = 0, naccel = 0;
    for (const auto& d : devices) ndev += d->port()->vm_name == vm.vm_name;
    for (const auto& c : conns) {
      if (c.vm != vm.vm_name) continue;
      ++nconn;
      naccel += c.state == ConnState::kUpgraded;
    }
    const VmTotals& tot = r.conns.vm_totals(vm.index);
    t.rows.push_back({vm.vm_name, std::to_string(vm.tenant_id), vm.path, std::to_string(ndev),
                      std::to_string(nconn), std::to_string(naccel),
                      std::to_string(tot.registrations.load()), std::to_string(tot.upgrades.load()),
                      std::to_string(tot.accel_bytes_out.load()), std::to_string(tot.accel_bytes_in.load())});
  }
  return t;
}

Table Tenants(const Reporting& r) {
  Table vms = Vms(r);
  std::map<std::string, std::vector<uint64_t>> sum;  // tenant -> vms, devices, conns, accel, bytes out, in
  for (const auto& row : vms.rows) {
    auto& v = sum[row[1]];
    v.resize(6);
    v[0] += 1;
    v[1] += std::stoull(row[3]);
    v[2] += std::stoull(row[4]);
    v[3] += std::stoull(row[5]);
    v[4] += std::stoull(row[8]);
    v[5] += std::stoull(row[9]);
  }
  Table t{{"tenant", "vms", "devices", "connections", "accelerated", "accel_bytes_out", "accel_bytes_in"},
          {},
          {true, true, true, true, true, true, true}};
  for (const auto& [tenant, v] : sum) {
    std::vector<std::string> row{tenant};
    for (uint64_t x : v) row.push_back(std::to_string(x));
    t.rows.push_back(row);
  }
  return t;
}

Table Connections(const Reporting& r) {
  Table t{{"handle", "vm", "tenant", "local", "peer", "mode", "reason", "accel_bytes_out", "accel_bytes_in",
           "kernel_bytes_before_upgrade", "credit_used", "credit_window", "rx_queued"},
          {},
          {true, false, true, false, false, false, false, true, true, true, true, true, true}};
  for (const ConnSnapshot& c : r.conns.Snapshot()) {
    t.rows.push_back({std::to_string(c.handle), c.vm, std::to_string(c.tenant), EndpointText(c.local),
                      EndpointText(c.peer), ToString(c.state), proto::ToString(c.reason),
                      std::to_string(c.accel_out), std::to_string(c.accel_in), std::to_string(c.kernel_out),
                      std::to_string(c.tx_unacked), std::to_string(c.window), std::to_string(c.rx_queued)});
  }
  return t;
}

Table Links(const Reporting& r) {
  Table t{{"peer", "address", "fabric", "state", "links", "connects", "losses", "frames_out", "frames_in",
           "data_bytes_out", "data_bytes_in", "frames_per_write", "last_error"},
          {},
          {false, false, false, false, true, true, true, true, true, true, true, true, false}};
  for (const PeerSnapshot& p : r.peering.Snapshot()) {
    char per[32];
    std::snprintf(per, sizeof(per), "%.2f", p.write_calls ? double(p.frames_out) / double(p.write_calls) : 0.0);
    t.rows.push_back({p.name, p.address, p.fabric, p.state, std::to_string(p.link_frames_out.size()),
                      std::to_string(p.connects), std::to_string(p.losses),
                      std::to_string(p.frames_out), std::to_string(p.frames_in), std::to_string(p.data_bytes_out),
                      std::to_string(p.data_bytes_in), per, p.last_error.empty() ? "-" : p.last_error});
  }
  return t;
}

Table Counters(const Reporting& r) {
  const auto& bc = vhost::VhostBackend::Instance().counters();
  const auto& cc = r.conns.counters();
  const auto& wc = r.worker;
  const auto& sc = r.service;
  Table t{{"counter", "value"}, {}, {false, true}};
  auto add = [&](const char* n, uint64_t v) { t.rows.push_back({n, std::to_string(v)}); };
  add("vhost_connections", bc.connections.load());
  add("devices_started", bc.devices_started.load());
  add("devices_rejected", bc.devices_rejected.load());
  add("devices_stopped", bc.devices_stopped.load());
  add("reconfigurations", bc.reconfigurations.load());
  add("broken_devices", wc.broken_devices.load());
  add("worker_sleeps", wc.sleeps.load());
  add("worker_wakeups", wc.wakeups.load());
  add("registrations", cc.registered.load());
  add("active_connections", cc.active.load());
  add("upgrades", cc.upgrades.load());
  add("rejected_spoofed", cc.rejected_spoofed.load());
  add("rejected_other", cc.rejected_other.load());
  add("cross_tenant", cc.cross_tenant.load());
  add("accel_bytes", cc.accel_bytes.load());
  add("events", cc.events.load());
  add("event_stalls", cc.event_stalls.load());
  add("protocol_violations", cc.protocol_violations.load());
  add("doorbell_sessions", cc.doorbell_sessions.load());
  add("doorbell_counts", cc.doorbell_counts.load());
  add("doorbell_messages", cc.doorbell_messages.load());
  add("doorbell_arms", cc.doorbell_arms.load());
  add("pair_requests_sent", cc.pair_requests_sent.load());
  add("pair_requests_received", cc.pair_requests_received.load());
  add("pair_refused", cc.pair_refused.load());
  add("remote_upgrades", cc.remote_upgrades.load());
  add("fabric_bytes_out", cc.fabric_bytes_out.load());
  add("fabric_bytes_in", cc.fabric_bytes_in.load());
  add("fabric_bytes_placed", cc.fabric_bytes_placed.load());
  add("rdma_rx_regions", cc.rdma_rx_regions.load());
  add("rdma_rx_regions_dropped", cc.rdma_rx_regions_dropped.load());
  add("rdma_rx_withdrawn", cc.rdma_rx_withdrawn.load());
  add("rdma_tx_regions", cc.rdma_tx_regions.load());
  add("rdma_tx_regions_dropped", cc.rdma_tx_regions_dropped.load());
  add("rdma_reg_us", cc.rdma_reg_us.load());
  add("credit_held", cc.credit_held.load());
  add("rings_held", cc.rings_held.load());
  add("rings_released", cc.rings_released.load());
  add("frames_dropped", cc.frames_dropped.load());
  add("frames_cross_tenant", cc.frames_cross_tenant.load());
  add("fabric_violations", cc.fabric_violations.load());
  add("fabric_downgrades", cc.fabric_downgrades.load());
  const auto& pc = r.peering.counters();
  add("peers_refused_tls", pc.refused_tls.load());
  add("peers_refused_name", pc.refused_name.load());
  add("peers_refused_link", pc.refused_link.load());
  add("bad_messages", sc.bad_messages.load());
  add("echoes", sc.echoes.load());
  return t;
}

}  // namespace

std::string PrometheusMetrics(const Reporting& r) {
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  auto sample = [&](const char* name, const std::string& labels, uint64_t v) {
    out += name;
    if (!labels.empty()) out += "{" + labels + "}";
    out += " " + std::to_string(v) + "\n";
  };
  Table vms = Vms(r);
  auto vm_labels = [](const std::vector<std::string>& row) {
    return "vm=\"" + JsonEscape(row[0]) + "\",tenant=\"" + row[1] + "\"";
  };
  metric("vsocket_devices", "gauge", "Guest devices (one per attached guest process) per VM.");
  for (const auto& row : vms.rows) sample("vsocket_devices", vm_labels(row), std::stoull(row[3]));
  metric("vsocket_connections", "gauge", "Registered connections per VM and mode.");
  for (const auto& row : vms.rows) {
    uint64_t total = std::stoull(row[4]), accel = std::stoull(row[5]);
    sample("vsocket_connections", vm_labels(row) + ",mode=\"accelerated\"", accel);
    sample("vsocket_connections", vm_labels(row) + ",mode=\"kernel\"", total - accel);
  }
  metric("vsocket_registrations_total", "counter", "Connections registered by guests.");
  for (const auto& row : vms.rows) sample("vsocket_registrations_total", vm_labels(row), std::stoull(row[6]));
  metric("vsocket_upgrades_total", "counter", "Connections switched to the accelerated path.");
  for (const auto& row : vms.rows) sample("vsocket_upgrades_total", vm_labels(row), std::stoull(row[7]));
  metric("vsocket_accelerated_bytes_total", "counter", "Bytes moved on the accelerated path.");
  for (const auto& row : vms.rows) {
    sample("vsocket_accelerated_bytes_total", vm_labels(row) + ",direction=\"out\"", std::stoull(row[8]));
    sample("vsocket_accelerated_bytes_total", vm_labels(row) + ",direction=\"in\"", std::stoull(row[9]));
  }
  const auto& cc = r.conns.counters();
  const auto& bc = vhost::VhostBackend::Instance().counters();
  const auto& wc = r.worker;
  metric("vsocket_rejected_registrations_total", "counter", "Registrations refused, by reason.");
  sample("vsocket_rejected_registrations_total", "reason=\"spoofed-address\"", cc.rejected_spoofed.load());
  sample("vsocket_rejected_registrations_total", "reason=\"other\"", cc.rejected_other.load());
  metric("vsocket_cross_tenant_total", "counter", "Connections kept on kernel TCP because the peer is in another tenant.");
  sample("vsocket_cross_tenant_total", "", cc.cross_tenant.load());
  metric("vsocket_protocol_violations_total", "counter", "Guest messages outside the protocol (connection reset).");
  sample("vsocket_protocol_violations_total", "", cc.protocol_violations.load());
  metric("vsocket_broken_devices_total", "counter", "Guest devices latched broken for ring violations.");
  sample("vsocket_broken_devices_total", "", wc.broken_devices.load());
  metric("vsocket_devices_rejected_total", "counter", "Guest devices refused at start (invalid rings or memory).");
  sample("vsocket_devices_rejected_total", "", bc.devices_rejected.load());
  metric("vsocket_events_total", "counter", "Events written to guests.");
  sample("vsocket_events_total", "", cc.events.load());
  metric("vsocket_doorbell_counts_total", "counter",
         "Send/consume counts read from connections' doorbell blocks (no guest message needed while polled).");
  sample("vsocket_doorbell_counts_total", "", cc.doorbell_counts.load());
  metric("vsocket_doorbell_messages_total", "counter",
         "TX_TAIL/CONSUMED messages of doorbell connections (the block was armed).");
  sample("vsocket_doorbell_messages_total", "", cc.doorbell_messages.load());
  metric("vsocket_doorbell_arms_total", "counter", "Doorbell blocks armed (polling stopped, messages asked for).");
  sample("vsocket_doorbell_arms_total", "", cc.doorbell_arms.load());
  metric("vsocket_worker_wakeups_total", "counter", "Times the data-path worker slept and woke up.");
  sample("vsocket_worker_wakeups_total", "", wc.wakeups.load());
  auto peers = r.peering.Snapshot();
  auto peer = [](const PeerSnapshot& p) { return "peer=\"" + JsonEscape(p.name) + "\""; };
  metric("vsocket_link_up", "gauge", "Fabric link to a peer host is up (1) or not (0).");
  for (const auto& p : peers) sample("vsocket_link_up", peer(p) + ",fabric=\"" + p.fabric + "\"", p.state == "up");
  metric("vsocket_links", "gauge", "Data links (TCP connections or RC QPs) up to a peer host.");
  for (const auto& p : peers) sample("vsocket_links", peer(p), p.link_frames_out.size());
  metric("vsocket_link_losses_total", "counter", "Fabric links lost after being up.");
  for (const auto& p : peers) sample("vsocket_link_losses_total", peer(p), p.losses);
  metric("vsocket_link_frames_total", "counter", "Fabric frames per peer and direction.");
  for (const auto& p : peers) {
    sample("vsocket_link_frames_total", peer(p) + ",direction=\"out\"", p.frames_out);
    sample("vsocket_link_frames_total", peer(p) + ",direction=\"in\"", p.frames_in);
  }
  metric("vsocket_link_bytes_total", "counter", "Payload bytes on fabric links per peer and direction.");
  for (const auto& p : peers) {
    sample("vsocket_link_bytes_total", peer(p) + ",direction=\"out\"", p.data_bytes_out);
    sample("vsocket_link_bytes_total", peer(p) + ",direction=\"in\"", p.data_bytes_in);
  }
  metric("vsocket_link_payload_bytes_total", "counter",
         "DATA payload sent per peer: read in place from registered guest TX rings (rdma) or copied first.");
  for (const auto& p : peers) {
    sample("vsocket_link_payload_bytes_total", peer(p) + ",how=\"in-place\"", p.inplace_bytes);
    sample("vsocket_link_payload_bytes_total", peer(p) + ",how=\"copied\"", p.copied_bytes);
  }
  metric("vsocket_rings_held_total", "counter",
         "Closed connections whose rings the guest had to keep until sends or peer writes finished.");
  sample("vsocket_rings_held_total", "", cc.rings_held.load());
  metric("vsocket_link_writes_total", "counter", "Write calls on fabric links (frames/writes = batching).");
  for (const auto& p : peers) sample("vsocket_link_writes_total", peer(p), p.write_calls);
  metric("vsocket_fabric_frames_dropped_total", "counter", "Fabric frames dropped (unknown or foreign connection).");
  sample("vsocket_fabric_frames_dropped_total", "reason=\"cross-tenant\"", cc.frames_cross_tenant.load());
  sample("vsocket_fabric_frames_dropped_total", "reason=\"other\"", cc.frames_dropped.load() - cc.frames_cross_tenant.load());
  metric("vsocket_peers_refused_total", "counter", "Peer backend connections refused, by reason.");
  const auto& pc = r.peering.counters();
  sample("vsocket_peers_refused_total", "reason=\"tls\"", pc.refused_tls.load());
  sample("vsocket_peers_refused_total", "reason=\"unknown-peer\"", pc.refused_name.load());
  sample("vsocket_peers_refused_total", "reason=\"bad-link-key\"", pc.refused_link.load());
  return out;
}

std::string HandleCtlCommand(const std::string& command, const Reporting& r) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < command.size()) {
    size_t j = command.find(' ', i);
    if (j == std::string::npos) j = command.size();
    if (j > i) words.push_back(command.substr(i, j - i));
    i = j + 1;
  }
  bool json = std::find(words.begin(), words.end(), "--json") != words.end();
  words.erase(std::remove(words.begin(), words.end(), "--json"), words.end());
  std::string cmd = words.empty() ? "" : words[0];
  if (cmd == "stats") return Stats(r);
  if (cmd == "metrics") return PrometheusMetrics(r);
  Table t;
  if (cmd == "devices") t = Devices();
  else if (cmd == "vms") t = Vms(r);
  else if (cmd == "tenants") t = Tenants(r);
  else if (cmd == "connections") t = Connections(r);
  else if (cmd == "counters") t = Counters(r);
  else if (cmd == "links") t = Links(r);
  else {
    std::string msg = "unknown command '" + cmd + "' (stats, devices, vms, tenants, connections, links, counters, metrics)";
    return json ? "{\"error\":\"" + JsonEscape(msg) + "\"}\n" : "error: " + msg + "\n";
  }
  return json ? t.Json() : t.Text();
}

}  // namespace vsocket::backend
