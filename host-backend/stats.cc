#include "host-backend/stats.h"

#include <arpa/inet.h>

#include <cstdio>

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

std::string Stats(const ControlService& service, const Worker& worker) {
  auto& backend = vhost::VhostBackend::Instance();
  const auto& bc = backend.counters();
  const auto& sc = service.counters();
  const auto& wc = worker.counters();
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
  const auto& cc = service.conns().counters();
  Field(out, "registered", cc.registered.load());
  Field(out, "active", cc.active.load());
  Field(out, "upgrades", cc.upgrades.load());
  Field(out, "rejected_spoofed", cc.rejected_spoofed.load());
  Field(out, "rejected_other", cc.rejected_other.load());
  Field(out, "cross_tenant", cc.cross_tenant.load());
  Field(out, "accel_bytes", cc.accel_bytes.load());
  Field(out, "events", cc.events.load());
  Field(out, "event_stalls", cc.event_stalls.load());
  Field(out, "protocol_violations", cc.protocol_violations.load(), false);
  out += "},\"connections\":[";
  first = true;
  for (const ConnSnapshot& c : service.conns().Snapshot()) {
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

}  // namespace

std::string HandleCtlCommand(const std::string& command, const ControlService& service,
                             const Worker& worker) {
  if (command == "stats") return Stats(service, worker);
  return "{\"error\":\"unknown command: " + JsonEscape(command) + "\"}\n";
}

}  // namespace vsocket::backend
