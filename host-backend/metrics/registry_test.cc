// The metric registry is the one list of vsocketd's counters: every counter
// of the daemon's counter structs is registered, and every registered
// metric shows, with its value, in the text tables, the JSON and the
// Prometheus exposition generated from it.
#include "host-backend/metrics/registry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "host-backend/stats.h"

namespace vsocket::backend::metrics {
namespace {

// Gives every counter of a struct of std::atomic<uint64_t> its own value.
template <typename T>
void Fill(T& counters, uint64_t* next, std::set<uint64_t>* values) {
  static_assert(sizeof(T) % sizeof(std::atomic<uint64_t>) == 0);
  auto* a = reinterpret_cast<std::atomic<uint64_t>*>(&counters);
  for (size_t i = 0; i < sizeof(T) / sizeof(std::atomic<uint64_t>); ++i) {
    a[i].store(*next);
    values->insert(*next);
    *next += 1000;
  }
}

// The cells of a text table: header -> value, for the row whose first cell is `key`.
std::map<std::string, std::string> TextRow(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  std::vector<std::string> header;
  std::istringstream h(line);
  for (std::string w; h >> w;) header.push_back(w);
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::istringstream c(line);
    for (std::string w; c >> w;) cells.push_back(w);
    if (cells.empty() || cells[0] != key) continue;
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < header.size() && i < cells.size(); ++i) row[header[i]] = cells[i];
    return row;
  }
  return {};
}

bool HasLine(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

std::string Labels(std::vector<std::string> parts) {
  std::string out;
  for (const std::string& p : parts)
    if (!p.empty()) out += (out.empty() ? "" : ",") + p;
  return out.empty() ? "" : "{" + out + "}";
}

class RegistryTest : public ::testing::Test {
 protected:
  RegistryTest() {
    uint64_t next = 1000;
    Fill(backend_, &next, &values_);
    Fill(worker_, &next, &values_);
    Fill(service_, &next, &values_);
    Fill(conns_, &next, &values_);
    Fill(peering_, &next, &values_);
    // frames_dropped counts the cross-tenant drops too.
    values_.erase(conns_.frames_dropped.load());
    conns_.frames_dropped = conns_.frames_cross_tenant + 7;
    values_.insert(conns_.frames_dropped.load());
    Fill(totals_, &next, &vm_values_);
    vm_.path = "/run/vsocket/vm1.sock";
    vm_.vm_name = "vm1";
    vm_.tenant_id = 7;
    peer_ = PeerSnapshot{"hostB", "192.0.2.2:7300", "rdma", "up", true, 11, 12, 0, "", 13, 14, 15, 16, 17, 18, 19, 20,
                         21,      {22, 23}};
    report_.vms.push_back(VmRow{&vm_, 2, 5, 3, &totals_});
    report_.peers.push_back(peer_);
  }

  vhost::BackendCounters backend_;
  WorkerCounters worker_;
  ServiceCounters service_;
  ConnManagerCounters conns_;
  PeeringCounters peering_;
  VmTotals totals_;
  vhost::PortConfig vm_;
  PeerSnapshot peer_;
  std::set<uint64_t> values_, vm_values_;
  Report report_{{backend_, worker_, service_, conns_, peering_}, {}, {}, {}, {}, nullptr};
};

TEST_F(RegistryTest, EveryDaemonCounterIsRegistered) {
  std::set<uint64_t> read;
  for (const auto& m : DaemonMetrics().daemon) read.insert(m.read(report_.counters));
  for (uint64_t v : values_) EXPECT_TRUE(read.count(v)) << "a counter with value " << v << " is not registered";
  std::set<uint64_t> vm_read;
  for (const auto& m : DaemonMetrics().vms) vm_read.insert(m.read(report_.vms[0]));
  for (const auto& m : DaemonMetrics().fallbacks) vm_read.insert(m.read(report_.vms[0]));
  for (uint64_t v : vm_values_) EXPECT_TRUE(vm_read.count(v)) << "a VM total with value " << v << " is not registered";
}

TEST_F(RegistryTest, NamesAreUniqueAndFamiliesConsistent) {
  std::set<std::string> rows, fields, samples;
  std::map<std::string, Type> family_type;
  for (const auto& m : DaemonMetrics().daemon) {
    EXPECT_TRUE(rows.insert(std::string(m.text_name())).second) << m.text_name();
    EXPECT_TRUE(fields.insert(std::string(m.group) + "." + std::string(m.name)).second) << m.name;
    EXPECT_FALSE(m.group.empty()) << m.name;
    EXPECT_FALSE(m.help.empty()) << m.name;
    EXPECT_TRUE(samples.insert(m.family() + std::string(m.prom.labels)).second) << m.family();
    EXPECT_EQ(family_type.emplace(m.family(), m.type).first->second, m.type) << m.family();
  }
  for (const auto& m : DaemonMetrics().vms) {
    EXPECT_TRUE(samples.insert(m.family() + std::string(m.prom.labels)).second) << m.family();
    EXPECT_EQ(family_type.emplace(m.family(), m.type).first->second, m.type) << m.family();
  }
  for (const auto& m : DaemonMetrics().peers) {
    EXPECT_TRUE(samples.insert(m.family() + std::string(m.prom.labels)).second) << m.family();
    EXPECT_EQ(family_type.emplace(m.family(), m.type).first->second, m.type) << m.family();
  }
  std::string prom = RenderPrometheus(report_);
  for (const auto& [family, type] : family_type) {
    EXPECT_TRUE(HasLine(prom, "# TYPE " + family + " " + ToString(type))) << family;
    size_t n = 0;
    for (size_t at = prom.find("# HELP " + family + " "); at != std::string::npos;
         at = prom.find("# HELP " + family + " ", at + 1))
      ++n;
    EXPECT_EQ(n, 1u) << family;
  }
}

TEST_F(RegistryTest, EveryDaemonMetricInTextJsonAndPrometheus) {
  std::string text = RenderCommand("counters", report_);
  std::string text_json = RenderCommand("counters --json", report_);
  std::string stats = RenderCommand("stats", report_);
  std::string prom = RenderPrometheus(report_);
  for (const auto& m : DaemonMetrics().daemon) {
    std::string v = std::to_string(m.read(report_.counters));
    std::string name(m.text_name());
    EXPECT_TRUE(std::regex_search(text, std::regex("(^|\n)" + name + " +" + v + "\n"))) << name << "\n" << text;
    EXPECT_NE(text_json.find("{\"counter\":\"" + name + "\",\"value\":" + v + "}"), std::string::npos) << name;
    size_t group = stats.find("\"" + std::string(m.group) + "\":{");
    ASSERT_NE(group, std::string::npos) << m.group;
    size_t end = stats.find('}', group);
    std::string object = stats.substr(group, end - group);
    EXPECT_TRUE(std::regex_search(object, std::regex("[{,]\"" + std::string(m.name) + "\":" + v + "(,|$)")))
        << m.name << " in " << object;
    EXPECT_TRUE(HasLine(prom, m.family() + Labels({std::string(m.prom.labels)}) + " " + v)) << m.family();
  }
}

TEST_F(RegistryTest, EveryVmMetricInTextJsonAndPrometheus) {
  auto vms = TextRow(RenderCommand("vms", report_), "vm1");
  auto tenants = TextRow(RenderCommand("tenants", report_), "7");
  std::string vms_json = RenderCommand("vms --json", report_);
  std::string tenants_json = RenderCommand("tenants --json", report_);
  std::string prom = RenderPrometheus(report_);
  const VmRow& row = report_.vms[0];
  for (const auto& m : DaemonMetrics().vms) {
    std::string v = std::to_string(m.read(row));
    std::string name(m.name);
    EXPECT_EQ(vms[name], v) << name;
    EXPECT_EQ(tenants[name], v) << name;  // one VM in the tenant
    EXPECT_NE(vms_json.find("\"" + name + "\":" + v), std::string::npos) << name;
    EXPECT_NE(tenants_json.find("\"" + name + "\":" + v), std::string::npos) << name;
    EXPECT_TRUE(HasLine(prom, m.family() + Labels({VmLabels(row), std::string(m.prom.labels)}) + " " + v))
        << m.family();
  }
  EXPECT_EQ(tenants["vms"], "1");
}

// `fallbacks`: a row per VM and one per tenant (vm "*"), and
// vsocket_fallbacks_total{vm,tenant,reason}; every reason vsocketd counts
// has its column.
TEST_F(RegistryTest, EveryFallbackInTextJsonAndPrometheus) {
  auto vm = TextRow(RenderCommand("fallbacks", report_), "vm1");
  auto tenant = TextRow(RenderCommand("fallbacks", report_), "*");
  std::string json = RenderCommand("fallbacks --json", report_);
  std::string prom = RenderPrometheus(report_);
  const VmRow& row = report_.vms[0];
  EXPECT_EQ(DaemonMetrics().fallbacks.size(), kFallbackReasons);
  for (const auto& m : DaemonMetrics().fallbacks) {
    std::string v = std::to_string(m.read(row));
    std::string name(m.name);
    EXPECT_EQ(vm[name], v) << name;
    EXPECT_EQ(tenant[name], v) << name;  // one VM in the tenant
    EXPECT_EQ(tenant["tenant"], "7");
    EXPECT_NE(json.find("\"" + name + "\":" + v), std::string::npos) << name;
    EXPECT_TRUE(HasLine(prom, "vsocket_fallbacks_total" + Labels({VmLabels(row), std::string(m.prom.labels)}) + " " + v))
        << name;
  }
  for (proto::Reason r : kCountedFallbacks)
    EXPECT_EQ(DaemonMetrics().fallbacks[FallbackSlot(r)].read(row), totals_.fallbacks[FallbackSlot(r)].load());
}

TEST_F(RegistryTest, EveryPeerMetricInTextJsonAndPrometheus) {
  auto links = TextRow(RenderCommand("links", report_), "hostB");
  std::string links_json = RenderCommand("links --json", report_);
  std::string stats = RenderCommand("stats", report_);
  std::string prom = RenderPrometheus(report_);
  std::string stats_links = stats.substr(stats.find("\"links\":["));
  for (const auto& m : DaemonMetrics().peers) {
    std::string v = std::to_string(m.read(peer_));
    std::string name(m.name);
    EXPECT_EQ(links[name], v) << name;
    EXPECT_NE(links_json.find("\"" + name + "\":" + v), std::string::npos) << name;
    EXPECT_TRUE(std::regex_search(stats_links, std::regex("[{,]\"" + name + "\":" + v + "[,}]"))) << name;
    std::string own = m.row_labels ? m.row_labels(peer_) : "";
    EXPECT_TRUE(HasLine(prom, m.family() + Labels({PeerLabels(peer_), own, std::string(m.prom.labels)}) + " " + v))
        << m.family();
  }
}

// Fields that scripts and tests read (tests/, bench/, deploy/) keep their names.
TEST_F(RegistryTest, NamesScriptsReadAreKept) {
  std::string stats = RenderCommand("stats", report_);
  for (const char* f : {"\"backend\":{\"connections\":", "\"devices_started\":", "\"devices_rejected\":",
                        "\"reconfigurations\":", "\"broken_devices\":", "\"echoes\":", "\"checksum_errors\":",
                        "\"rejected_spoofed\":", "\"protocol_violations\":", "\"upgrades\":", "\"accel_bytes\":",
                        "\"doorbell_sessions\":", "\"doorbell_counts\":", "\"doorbell_arms\":"})
    EXPECT_NE(stats.find(f), std::string::npos) << f;
  for (const char* f : {"\"connects\":", "\"losses\":", "\"links\":", "\"data_bytes_out\":", "\"inplace_bytes\":",
                        "\"copied_bytes\":", "\"link_frames_out\":[22,23]", "\"fabric\":\"rdma\"", "\"state\":\"up\""})
    EXPECT_NE(stats.find(f), std::string::npos) << f;
  std::string text = RenderCommand("counters", report_);
  for (const char* row :
       {"active_connections", "remote_upgrades", "fabric_bytes_out", "fabric_downgrades", "peers_refused_tls",
        "peers_refused_name", "peers_refused_link", "peers_refused_revoked", "peers_refused_busy", "rdma_rx_regions", "rdma_rx_regions_dropped", "rdma_rx_withdrawn",
        "rdma_tx_regions", "rdma_tx_regions_dropped", "rings_held", "rings_released"})
    EXPECT_TRUE(std::regex_search(text, std::regex(std::string("(^|\n)") + row + " +[0-9]+\n"))) << row;
  // Scripts wait for a link with `vsocketctl links | grep -q " up "`: only
  // the state column of a peer that is up may say it.
  report_.peers[0].state = "backoff";
  EXPECT_EQ(RenderCommand("links", report_).find(" up "), std::string::npos) << RenderCommand("links", report_);
  report_.peers[0].state = "up";
  EXPECT_NE(RenderCommand("links", report_).find(" up "), std::string::npos);
  std::string prom = RenderPrometheus(report_);
  for (const char* m :
       {"vsocket_accelerated_bytes_total{vm=\"vm1\"", "vsocket_cross_tenant_total ", "vsocket_connections{",
        "vsocket_doorbell_counts_total ", "vsocket_link_up{peer=\"hostB\",fabric=\"rdma\"} 1"})
    EXPECT_NE(prom.find(m), std::string::npos) << m;
}

}  // namespace
}  // namespace vsocket::backend::metrics
