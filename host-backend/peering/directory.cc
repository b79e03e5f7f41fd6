// Peering's locator when it is the cluster directory in etcd
// (locator = etcd://...): the EtcdLocator it asks, the EtcdPublisher of this
// host's records, and their report for vsocketctl locator.
#include <arpa/inet.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/clock.h"
#include "base/log.h"
#include "host-backend/peering/peers.h"

namespace vsocket::backend {
namespace {

// How long Start waits for the first read of the directory before going on
// with an empty cache (pairing across hosts then waits for it).
constexpr int kDirectorySyncMs = 2000;

std::string AddressText(const vhost::VmAddress& a) {
  char buf[INET6_ADDRSTRLEN] = "";
  inet_ntop(a.family == 6 ? AF_INET6 : AF_INET, a.addr.data(), buf, sizeof(buf));
  return buf;
}

directory::VmRecord VmRecordOf(const vhost::PortConfig& p) {
  directory::VmRecord r{p.tenant_id, {}};
  for (const vhost::VmAddress& a : p.addresses) r.addresses.push_back(AddressText(a));
  return r;
}

// How this host reaches etcd: as its etcd user if configured.
Result<directory::EtcdClientOptions> EtcdAccess(const DaemonConfig& config) {
  directory::EtcdClientOptions o;
  o.tls = EtcdLocatorUsesTls(config.locator);
  if (!o.tls && !(config.etcd_ca + config.etcd_cert + config.etcd_key).empty())
    return Status(Code::kInvalidArgument, "etcd_ca, etcd_cert and etcd_key are for locator = etcds://...");
  if (config.etcd_cert.empty() != config.etcd_key.empty())
    return Status(Code::kInvalidArgument, "etcd_cert and etcd_key go together");
  o.ca_file = config.etcd_ca;
  o.cert_file = config.etcd_cert;
  o.key_file = config.etcd_key;
  if (config.etcd_user.empty()) return o;
  if (config.etcd_password_file.empty())
    return Status(Code::kInvalidArgument, "etcd_user is set but etcd_password_file is not");
  std::ifstream in(config.etcd_password_file);
  if (!in || !std::getline(in, o.password))
    return Status(Code::kInvalidArgument, "etcd_password_file " + config.etcd_password_file + " cannot be read");
  o.user = config.etcd_user;
  return o;
}

}  // namespace

Status Peering::StartDirectory(const DaemonConfig& config) {
  auto endpoints = EtcdEndpoints(config.locator);
  if (!endpoints.ok()) return endpoints.status();
  auto access = EtcdAccess(config);
  if (!access.ok()) return access.status();
  etcd_ = std::make_shared<directory::EtcdClient>(*endpoints, *access);
  directory_wake_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!directory_wake_) return Status::FromErrno("directory eventfd");
  Watch(directory_wake_.get(), false);

  directory::EtcdLocator::Options locator_options;
  locator_options.counters = &counters_.directory;
  // Only the tenants this host serves, its VMs' here or away (an away VM
  // may arrive): decision 103.
  for (const vhost::PortConfig& p : config.vms) locator_options.tenants.insert(p.tenant_id);
  etcd_locator_ = std::make_unique<directory::EtcdLocator>(etcd_, locator_options);
  ConnManager* conns = conns_;
  int wake = directory_wake_.get();
  etcd_locator_->SetOnChange([conns, wake] {
    // Pending connections look again where their peers run.
    conns->RequestVmOp(ConnManager::kAllVms, ConnManager::VmOp::kRelocate);
    uint64_t one = 1;
    (void)!write(wake, &one, sizeof(one));
  });
  etcd_locator_->Start();
  if (!etcd_locator_->WaitSynced(kDirectorySyncMs))
    VS_LOG(kWarn, "directory: %s not read within %d ms (%s); starting with an empty cache, still trying",
           etcd_locator_->Describe().c_str(), kDirectorySyncMs, etcd_locator_->Health().last_error.c_str());

  // This host and the VMs that run here now (not those `away`, nor those
  // `incoming`: published when their first device starts, decision 116).
  directory::HostRecord host{config.peer_listen, {config.fabric}};
  std::map<std::string, directory::VmRecord> vms;
  for (const vhost::PortConfig& p : config.vms)
    if (!p.away && !p.incoming) vms[p.vm_name] = VmRecordOf(p);
  directory::EtcdPublisher::Options publisher_options;
  publisher_options.counters = &counters_.directory;
  etcd_publisher_ = std::make_unique<directory::EtcdPublisher>(etcd_, host_name_, std::move(host), std::move(vms),
                                                               publisher_options);
  etcd_publisher_->Start();
  return Status::Ok();
}

// Decision 96: every host the directory lists (but this one) that offers our
// fabric is a peer, dialled at its fabric_address if its name sorts after
// ours; its identity is the name in its record's key, which only it may
// write (etcd RBAC, decision 86), and its certificate must name it as a
// configured peer's must. A [peer] section of the same name wins.
void Peering::FollowDirectoryHosts() {
  if (!etcd_locator_) return;
  directory_hosts_ = etcd_locator_->Hosts();
  const std::map<std::string, directory::HostRecord>& listed = directory_hosts_;
  auto skip = [&](const std::string& name, const std::string& why) {
    std::string& was = directory_skipped_[name];
    if (was != why) VS_LOG(kWarn, "directory: host %s is not taken as a peer: %s", name.c_str(), why.c_str());
    was = why;
  };
  for (const auto& [name, record] : listed) {
    if (name == host_name_) continue;
    Host* h = ByName(name);
    if (h != nullptr && !h->from_directory) continue;  // configured
    const auto& f = record.fabrics;
    if (std::find(f.begin(), f.end(), fabric_) == f.end()) {
      skip(name, "it does not offer the " + fabric_ + " fabric");
      if (h != nullptr && h->listed) Unlist(*h, "it no longer offers the " + fabric_ + " fabric");
      continue;
    }
    sockaddr_storage addr;
    unsigned alen;
    if (Status st = ParseHostPort(record.fabric_address, &addr, &alen); !st.ok()) {
      skip(name, "fabric_address: " + st.message());
      if (h != nullptr && h->listed) Unlist(*h, "its fabric_address cannot be used");
      continue;
    }
    directory_skipped_.erase(name);
    if (h == nullptr) {
      if (Status st = AddHost(name, record.fabric_address, true); !st.ok()) {
        skip(name, st.message());
        continue;
      }
      VS_LOG(kInfo, "peer %s (%s): found in the directory%s", name.c_str(), record.fabric_address.c_str(),
             host_name_ < name ? ", dialling it" : ", it dials this host");
      continue;
    }
    State s = h->state;
    // (A session up or being set up keeps the address it has; the next
    // dial takes the new one: StartConnect.)
    if (s == State::kIdle || s == State::kBackoff || s == State::kRetired) FollowAddress(*h);
    if (!h->listed) {
      h->listed = true;
      VS_LOG(kInfo, "peer %s (%s): back in the directory", name.c_str(), h->address.c_str());
      if (s == State::kRetired) {
        h->backoff_ms = 0;
        h->retry_at_ms = MonotonicMs();
        h->state = h->initiator ? State::kBackoff : State::kIdle;
      }
    }
  }
  for (auto& h : hosts_)
    if (h->from_directory && h->listed && listed.count(h->name) == 0)
      Unlist(*h, "its records left the directory (its lease expired, or it stopped)");
  ArmTimer();
}

void Peering::FollowAddress(Host& h) {
  if (!h.from_directory) return;
  auto it = directory_hosts_.find(h.name);
  if (it == directory_hosts_.end() || it->second.fabric_address == h.address) return;
  sockaddr_storage addr;
  unsigned alen;
  if (!ParseHostPort(it->second.fabric_address, &addr, &alen).ok()) return;  // (FollowDirectoryHosts says so)
  VS_LOG(kInfo, "peer %s: fabric_address %s -> %s (the directory)", h.name.c_str(), h.address.c_str(),
         it->second.fabric_address.c_str());
  MutexLock lock(h.mu);  // (Snapshot reads address)
  h.address = it->second.fabric_address;
  h.addr = addr;
  h.addr_len = alen;
}

void Peering::Unlist(Host& h, const std::string& why) {
  h.listed = false;
  State s = h.state;
  if (s == State::kUp) {
    // Its connections stay until the session fails; it is not dialled again.
    VS_LOG(kInfo, "peer %s: %s; its session stays up while it lasts", h.name.c_str(), why.c_str());
    return;
  }
  VS_LOG(kInfo, "peer %s: %s; not dialled or accepted any more", h.name.c_str(), why.c_str());
  if (s == State::kIdle || s == State::kBackoff || s == State::kRetired) {
    MutexLock lock(h.mu);
    h.state = State::kRetired;
    h.last_error = why;
    return;
  }
  HostDown(h, why);  // (a setup under way: abandoned, and retired)
}

void Peering::DirectoryTenants(std::set<uint32_t> tenants) {
  if (etcd_locator_) etcd_locator_->SetTenants(std::move(tenants));
}

void Peering::DirectoryVmHere(const vhost::PortConfig& vm, int follow_ms) {
  if (!etcd_publisher_) return;
  etcd_publisher_->SetVm(vm.vm_name, VmRecordOf(vm));
  if (vm.addresses.empty()) return;
  // Until our own watch shows the record (bounded: 1 s): the other hosts'
  // watches see it about as soon, and a pairing request from here for the
  // VM's connections is refused by a host whose cache does not place its
  // address here yet (Runs).
  proto::Endpoint addr;
  addr.family = vm.addresses[0].family == 6 ? proto::Family::kIpv6 : proto::Family::kIpv4;
  addr.addr = vm.addresses[0].addr;
  for (int64_t deadline = MonotonicMs() + follow_ms; MonotonicMs() < deadline; usleep(10 * 1000))
    if (etcd_locator_->Find(vm.tenant_id, addr) == host_name_) return;
  VS_LOG(kWarn, "directory: VM %s published, but not yet seen by this host's watch after %d ms", vm.vm_name.c_str(),
         follow_ms);
}

void Peering::DirectoryVmPresence(const vhost::PortConfig& vm, bool here) {
  if (!etcd_publisher_) return;
  if (here) etcd_publisher_->SetVmSoon(vm.vm_name, VmRecordOf(vm));
  else etcd_publisher_->RemoveVmSoon(vm.vm_name);
}

void Peering::DirectoryVmAway(const std::string& vm) {
  if (etcd_publisher_) etcd_publisher_->RemoveVm(vm);
}

void Peering::StopDirectory() {
  if (etcd_publisher_) etcd_publisher_->Stop(directory::EtcdPublisher::StopMode::kRevoke);
  if (etcd_locator_) etcd_locator_->Stop();
}

std::string Peering::DirectoryReport(bool json) const {
  directory::EtcdLocatorHealth h = etcd_locator_->Health();
  directory::EtcdPublisherHealth p = etcd_publisher_->Health();
  std::string text = etcd_locator_->Text();
  std::vector<directory::DirectoryHostView> view = etcd_locator_->View();
  if (json) {
    nlohmann::json entries = nlohmann::json::array();
    std::istringstream in(text);
    for (std::string t, a, host; in >> t >> a >> host;)
      entries.push_back({{"tenant", std::stoul(t)}, {"address", a}, {"host", host}});
    nlohmann::json j = {{"locator", "etcd"},          {"endpoints", etcd_->endpoints()},
                        {"endpoint", h.endpoint},     {"connected", h.connected},
                        {"revision", h.revision},     {"lag_ms", h.lag_ms},
                        {"last_error", h.last_error}, {"connects", h.connects},
                        {"full_reads", h.full_reads}, {"bad_records", h.bad_records},
                        {"hosts", h.hosts},           {"published", p.published},
                        {"lease", p.lease},           {"publish_error", p.last_error},
                        {"lease_ttl_s", p.lease_ttl_s}, {"lease_confirmed_ms_ago", p.lease_confirmed_ms_ago},
                        {"entries", entries},         {"watch_events", h.watch_events},
                        {"conflicts", h.conflicts},   {"publishes", p.publishes},
                        {"keepalive_failures", p.keepalive_failures},
                        {"unavailable_fallbacks", counters_.directory.unavailable_fallbacks.load()},
                        {"conflicting", etcd_locator_->ConflictsText()},
                        {"tenants", h.tenants},
                        {"tenants_refused", h.refused_tenants}};
    nlohmann::json hosts = nlohmann::json::array();
    for (const directory::DirectoryHostView& v : view) {
      nlohmann::json vms = nlohmann::json::array();
      for (const directory::DirectoryVmView& vm : v.vms)
        vms.push_back({{"vm", vm.name}, {"tenant", vm.tenant}, {"addresses", vm.addresses}, {"lease", vm.lease},
                       {"age_ms", vm.age_ms}});
      hosts.push_back({{"host", v.name}, {"listed", v.listed}, {"fabric_address", v.record.fabric_address},
                       {"fabrics", v.record.fabrics}, {"lease", v.lease}, {"age_ms", v.age_ms}, {"vms", vms}});
    }
    j["host_records"] = hosts;
    return j.dump() + "\n";
  }
  std::string out = "locator: " + etcd_locator_->Describe() + " (" + (h.connected ? "connected" : "NOT connected") +
                    " to " + h.endpoint + ", revision " + std::to_string(h.revision) + ", lag " +
                    std::to_string(h.lag_ms) + " ms, " + std::to_string(h.hosts) + " host(s), " +
                    std::to_string(h.entries) + " entries, " + std::to_string(h.connects) + " connect(s), " +
                    std::to_string(h.full_reads) + " full read(s), " + std::to_string(h.bad_records) +
                    " bad record(s), " + std::to_string(h.watch_events) + " watch event(s), " +
                    std::to_string(h.conflicts) + " conflict(s))\n";
  out += "tenants followed:";
  for (uint32_t t : h.tenants) out += " " + std::to_string(t);
  out += h.tenants.empty() ? " none" : "";
  for (uint32_t t : h.refused_tenants) out += " (" + std::to_string(t) + ": refused by etcd, not followed)";
  out += "\n";
  if (!h.last_error.empty()) out += "last error: " + h.last_error + "\n";
  std::string lease_left;  // what is left of our lease as etcd last confirmed it
  if (p.lease_confirmed_ms_ago >= 0) {
    int64_t left_ms = std::max<int64_t>(0, p.lease_ttl_s * 1000 - p.lease_confirmed_ms_ago);
    lease_left = ", TTL " + std::to_string(p.lease_ttl_s) + " s confirmed " +
                 std::to_string(p.lease_confirmed_ms_ago) + " ms ago, " + std::to_string(left_ms / 1000) + "." +
                 std::to_string(left_ms % 1000 / 100) + " s left";
  }
  out += "this host: " + std::string(p.published ? "published" : "NOT published") + " under lease " +
         std::to_string(p.lease) + lease_left + " (" + std::to_string(p.publishes) + " publish(es), " +
         std::to_string(p.keepalive_failures) + " keepalive failure(s))" +
         (p.last_error.empty() ? "" : " (last error: " + p.last_error + ")") + "\n";
  out += "directory-unavailable fallbacks: " + std::to_string(counters_.directory.unavailable_fallbacks.load()) + "\n";
  // Each host and its VMs, with their leases and how long ago the cache saw
  // them written (as comments: the entries below still read as a locator file).
  for (const directory::DirectoryHostView& v : view) {
    std::string fabrics;
    for (const std::string& f : v.record.fabrics) fabrics += (fabrics.empty() ? "" : ",") + f;
    out += "# host " + v.name + (v.listed ? " (" + v.record.fabric_address + ", " + fabrics + ")" : " (no host record)") +
           ": lease " + std::to_string(v.lease) + ", written " + std::to_string(v.age_ms / 1000) + " s ago\n";
    for (const directory::DirectoryVmView& vm : v.vms) {
      std::string addrs;
      for (const std::string& a : vm.addresses) addrs += (addrs.empty() ? "" : " ") + a;
      out += "#   vm " + vm.name + " (tenant " + std::to_string(vm.tenant) + ": " + addrs + "): lease " +
             std::to_string(vm.lease) + ", written " + std::to_string(vm.age_ms / 1000) + " s ago\n";
    }
  }
  out += text;
  // (commented out, so that the entries read as a locator file still)
  std::istringstream conflicting(etcd_locator_->ConflictsText());
  for (std::string line; std::getline(conflicting, line);) out += "# conflicting, ignored: " + line + "\n";
  return out;
}

}  // namespace vsocket::backend
