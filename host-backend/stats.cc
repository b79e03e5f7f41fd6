#include "host-backend/stats.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "host-backend/metrics/registry.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {
namespace {

using metrics::AppendJsonField;
using metrics::DaemonCounters;
using metrics::JsonEscape;
using metrics::Metric;
using metrics::VmRow;

std::string EndpointText(const proto::Endpoint& e) {
  char buf[INET6_ADDRSTRLEN] = "?";
  inet_ntop(e.family == proto::Family::kIpv6 ? AF_INET6 : AF_INET, e.addr.data(), buf, sizeof(buf));
  return std::string(buf) + ":" + std::to_string(e.port);
}

// How an accelerated connection's bytes go: "same-host", or the name of
// the peer host the fabric takes them to; "-" on kernel TCP.
std::string Via(const Report& rep, const ConnSnapshot& c) {
  if (c.state != ConnState::kUpgraded || c.moved) return "-";
  if (c.remote_host == 0) return "same-host";
  if (c.remote_host <= rep.peers.size()) return rep.peers[c.remote_host - 1].name;
  return "host " + std::to_string(c.remote_host);
}

void Field(std::string& out, const char* name, uint64_t v, bool comma = true) {
  out += "\"";
  out += name;
  out += "\":";
  out += std::to_string(v);
  if (comma) out += ",";
}

// The parts of a report a command shows.
enum Part : uint32_t { kDevices = 1, kVms = 2, kPeers = 4, kConns = 8, kAll = 15 };

Report Collect(const Reporting& r, uint32_t parts) {
  auto& backend = vhost::VhostBackend::Instance();
  Report rep{{backend.counters(), r.worker, r.service, r.conns.counters(), r.peering.counters()}, {}, {}, {}, {}, {}};
  if (parts & (kDevices | kVms)) rep.devices = backend.Devices();
  if (parts & (kConns | kVms)) rep.conns = r.conns.Snapshot();
  if (parts & kPeers) rep.peers = r.peering.Snapshot();
  if (parts & kVms) {
    // Every VM of the configuration, with what is attached and registered now.
    rep.vm_list = r.vms.Get();
    for (const vhost::PortConfig& vm : *rep.vm_list) {
      VmRow row{&vm, 0, 0, 0, &r.conns.vm_totals(vm.index)};
      for (const auto& d : rep.devices) row.devices += d->port()->vm_name == vm.vm_name;
      for (const auto& c : rep.conns) {
        if (c.vm != vm.vm_name) continue;
        ++row.connections;
        row.accelerated += c.state == ConnState::kUpgraded;
      }
      rep.vms.push_back(row);
    }
  }
  return rep;
}

// "group":{"name":value,...} of the daemon-wide metrics in `group`.
std::string Group(std::string_view group, const DaemonCounters& c) {
  std::string out = "\"" + std::string(group) + "\":{";
  bool first = true;
  for (const Metric<DaemonCounters>& m : metrics::DaemonMetrics().daemon)
    if (m.group == group) AppendJsonField(out, m.name, m.read(c), &first);
  return out + "}";
}

std::string Stats(const Report& rep) {
  const DaemonCounters& counters = rep.counters;
  // The order of the objects stays: tests read the first "name": of the text.
  std::string out = "{" + Group("backend", counters) + "," + Group("worker", counters) + "," +
                    Group("service", counters) + ",\"devices\":[";
  bool first = true;
  for (const auto& d : rep.devices) {
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
    out += "\"call_fds\":[";
    for (uint16_t q = 0; q < d->num_queues(); ++q)
      out += std::string(q ? "," : "") + "\"" + std::to_string(d->VringCallFd(q)) + "/" +
             std::to_string(d->call_fd(q)) + "\"";
    out += "],";
    Field(out, "wakeups", d->counters().wakeups.load(), false);
    out += "}";
  }
  out += "]," + Group("conn_counters", counters) + "," + Group("peering", counters) + "," +
         Group("directory", counters) + ",\"links\":[";
  first = true;
  for (const PeerSnapshot& p : rep.peers) {
    if (!first) out += ",";
    first = false;
    out += "{\"peer\":\"" + JsonEscape(p.name) + "\",\"address\":\"" + JsonEscape(p.address) + "\",\"fabric\":\"" +
           p.fabric + "\",\"state\":\"" + p.state + "\",\"last_error\":\"" + JsonEscape(p.last_error) + "\",";
    bool first_field = true;
    for (const Metric<PeerSnapshot>& m : metrics::DaemonMetrics().peers)
      AppendJsonField(out, m.name, m.read(p), &first_field);
    out += ",\"link_frames_out\":[";
    for (size_t i = 0; i < p.link_frames_out.size(); ++i) out += (i ? "," : "") + std::to_string(p.link_frames_out[i]);
    out += "]}";
  }
  out += "],\"connections\":[";
  first = true;
  for (const ConnSnapshot& c : rep.conns) {
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
    Field(out, "kernel_bytes_before_upgrade", c.kernel_out);
    out += "\"via\":\"" + JsonEscape(Via(rep, c)) + "\"}";
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

// Adds a numeric column per metric.
template <typename Row>
void AddColumns(Table& t, const std::vector<Metric<Row>>& ms) {
  for (const Metric<Row>& m : ms) {
    t.columns.emplace_back(m.name);
    t.numeric.push_back(true);
  }
}

template <typename Row>
void AddValues(std::vector<std::string>& cells, const std::vector<Metric<Row>>& ms, const Row& row) {
  for (const Metric<Row>& m : ms) cells.push_back(std::to_string(m.read(row)));
}

Table Devices(const Report& rep) {
  Table t{{"id", "vm", "tenant", "vid", "state", "requests", "notifications", "wakeups", "broken_reason"},
          {},
          {true, false, true, true, false, true, true, true, false}};
  for (const auto& d : rep.devices) {
    t.rows.push_back({std::to_string(d->id()), d->port()->vm_name, std::to_string(d->port()->tenant_id),
                      std::to_string(d->vid()), d->broken() ? "broken" : "running",
                      std::to_string(d->counters().requests.load()), std::to_string(d->counters().notifications.load()),
                      std::to_string(d->counters().wakeups.load()), d->broken_reason()});
  }
  return t;
}

Table Vms(const std::vector<VmRow>& vms) {
  Table t{{"vm", "tenant", "socket"}, {}, {false, true, false}};
  AddColumns(t, metrics::DaemonMetrics().vms);
  for (const VmRow& vm : vms) {
    std::vector<std::string> row{vm.vm->vm_name, std::to_string(vm.vm->tenant_id), vm.vm->path};
    AddValues(row, metrics::DaemonMetrics().vms, vm);
    t.rows.push_back(std::move(row));
  }
  return t;
}

// The VMs' numbers (`ms`) summed per tenant: tenant -> VMs, then one sum per metric.
std::map<uint32_t, std::vector<uint64_t>> PerTenant(const std::vector<VmRow>& vms,
                                                    const std::vector<metrics::Metric<VmRow>>& ms) {
  std::map<uint32_t, std::vector<uint64_t>> sum;
  for (const VmRow& vm : vms) {
    auto& v = sum[vm.vm->tenant_id];
    v.resize(1 + ms.size());
    v[0] += 1;
    for (size_t i = 0; i < ms.size(); ++i) v[1 + i] += ms[i].read(vm);
  }
  return sum;
}

Table Tenants(const std::vector<VmRow>& vms) {
  const auto& ms = metrics::DaemonMetrics().vms;
  Table t{{"tenant", "vms"}, {}, {true, true}};
  AddColumns(t, ms);
  for (const auto& [tenant, v] : PerTenant(vms, ms)) {
    std::vector<std::string> row{std::to_string(tenant)};
    for (uint64_t x : v) row.push_back(std::to_string(x));
    t.rows.push_back(std::move(row));
  }
  return t;
}

// Connections on kernel TCP by reason: one row per VM, then one per tenant
// (vm "*").
Table Fallbacks(const std::vector<VmRow>& vms) {
  const auto& ms = metrics::DaemonMetrics().fallbacks;
  Table t{{"vm", "tenant"}, {}, {false, true}};
  AddColumns(t, ms);
  for (const VmRow& vm : vms) {
    std::vector<std::string> row{vm.vm->vm_name, std::to_string(vm.vm->tenant_id)};
    AddValues(row, ms, vm);
    t.rows.push_back(std::move(row));
  }
  for (const auto& [tenant, v] : PerTenant(vms, ms)) {
    std::vector<std::string> row{"*", std::to_string(tenant)};
    for (size_t i = 1; i < v.size(); ++i) row.push_back(std::to_string(v[i]));
    t.rows.push_back(std::move(row));
  }
  return t;
}

Table Connections(const Report& rep) {
  Table t{{"handle", "vm", "tenant", "local", "peer", "mode", "reason", "accel_bytes_out", "accel_bytes_in",
           "kernel_bytes_before_upgrade", "credit_used", "credit_window", "rx_queued", "via"},
          {},
          {true, false, true, false, false, false, false, true, true, true, true, true, true, false}};
  for (const ConnSnapshot& c : rep.conns) {
    t.rows.push_back({std::to_string(c.handle), c.vm, std::to_string(c.tenant), EndpointText(c.local),
                      EndpointText(c.peer), ToString(c.state), proto::ToString(c.reason), std::to_string(c.accel_out),
                      std::to_string(c.accel_in), std::to_string(c.kernel_out), std::to_string(c.tx_unacked),
                      std::to_string(c.window), std::to_string(c.rx_queued), Via(rep, c)});
  }
  return t;
}

Table Links(const Report& rep) {
  const auto& ms = metrics::DaemonMetrics().peers;
  Table t{{"peer", "address", "fabric", "state"}, {}, {false, false, false, false}};
  AddColumns(t, ms);
  t.columns.insert(t.columns.end(), {"frames_per_write", "last_error"});
  t.numeric.insert(t.numeric.end(), {true, false});
  for (const PeerSnapshot& p : rep.peers) {
    char per[32];
    std::snprintf(per, sizeof(per), "%.2f", p.write_calls ? double(p.frames_out) / double(p.write_calls) : 0.0);
    std::vector<std::string> row{p.name, p.address, p.fabric, p.state};
    AddValues(row, ms, p);
    row.insert(row.end(), {per, p.last_error.empty() ? "-" : p.last_error});
    t.rows.push_back(std::move(row));
  }
  return t;
}

Table CountersTable(const Report& rep) {
  const DaemonCounters& counters = rep.counters;
  Table t{{"counter", "value"}, {}, {false, true}};
  for (const Metric<DaemonCounters>& m : metrics::DaemonMetrics().daemon)
    t.rows.push_back({std::string(m.text_name()), std::to_string(m.read(counters))});
  return t;
}

}  // namespace

std::string RenderPrometheus(const Report& rep) {
  const metrics::Registry& reg = metrics::DaemonMetrics();
  std::string out;
  metrics::AppendPrometheus(out, reg.vms, rep.vms, &metrics::VmLabels);
  metrics::AppendPrometheus(out, reg.fallbacks, rep.vms, &metrics::VmLabels);
  metrics::AppendPrometheus(out, reg.daemon, std::vector<DaemonCounters>{rep.counters}, nullptr);
  metrics::AppendPrometheus(out, reg.peers, rep.peers, &metrics::PeerLabels);
  return out;
}

std::string PrometheusMetrics(const Reporting& r) { return RenderPrometheus(Collect(r, kVms | kPeers)); }

namespace {

template <Table (*view)(const Report&)>
std::string Render(const Report& rep, bool json) {
  Table t = view(rep);
  return json ? t.Json() : t.Text();
}

Table VmsView(const Report& rep) { return Vms(rep.vms); }
Table TenantsView(const Report& rep) { return Tenants(rep.vms); }
Table FallbacksView(const Report& rep) { return Fallbacks(rep.vms); }

// The control-socket commands: what each reads and how it is rendered.
struct Command {
  std::string_view name;
  uint32_t parts;
  std::string (*render)(const Report& rep, bool json);
};
constexpr Command kCommands[] = {
    {"stats", kAll, [](const Report& rep, bool) { return Stats(rep); }},
    {"metrics", kVms | kPeers, [](const Report& rep, bool) { return RenderPrometheus(rep); }},
    {"devices", kDevices, &Render<Devices>},
    {"vms", kVms, &Render<VmsView>},
    {"tenants", kVms, &Render<TenantsView>},
    {"fallbacks", kVms, &Render<FallbacksView>},
    {"connections", kConns | kPeers, &Render<Connections>},  // (peers: their names, for "via")
    {"links", kPeers, &Render<Links>},
    {"counters", 0, &Render<CountersTable>},
};

// The command's words without "--json"; *json: whether it was there.
std::vector<std::string> Words(const std::string& command, bool* json) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < command.size()) {
    size_t j = command.find(' ', i);
    if (j == std::string::npos) j = command.size();
    if (j > i) words.push_back(command.substr(i, j - i));
    i = j + 1;
  }
  *json = std::find(words.begin(), words.end(), "--json") != words.end();
  words.erase(std::remove(words.begin(), words.end(), "--json"), words.end());
  return words;
}

const Command* Find(const std::string& command, bool* json) {
  std::vector<std::string> words = Words(command, json);
  for (const Command& c : kCommands)
    if (!words.empty() && words[0] == c.name) return &c;
  return nullptr;
}

std::string Unknown(const std::string& command, bool json) {
  std::vector<std::string> words = Words(command, &json);
  std::string msg = "unknown command '" + (words.empty() ? std::string() : words[0]) +
                    "' (stats, devices, vms, tenants, connections, links, fallbacks, counters, metrics, drain, undrain, drained, "
                    "migrate, locator)";
  return json ? "{\"error\":\"" + JsonEscape(msg) + "\"}\n" : "error: " + msg + "\n";
}

}  // namespace

std::string RenderCommand(const std::string& command, const Report& rep) {
  bool json = false;
  const Command* c = Find(command, &json);
  return c ? c->render(rep, json) : Unknown(command, json);
}

std::string HandleCtlCommand(const std::string& command, const Reporting& r) {
  bool json = false;
  const Command* c = Find(command, &json);
  return c ? c->render(Collect(r, c->parts), json) : Unknown(command, json);
}

}  // namespace vsocket::backend
