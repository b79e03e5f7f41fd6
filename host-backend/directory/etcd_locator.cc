#include "host-backend/directory/etcd_locator.h"

#include <algorithm>
#include <sstream>
#include <utility>

#include "base/clock.h"
#include "base/log.h"
#include "host-backend/directory/claims.h"
#include "host-backend/directory/pause.h"

namespace vsocket::directory {

EtcdLocator::EtcdLocator(std::shared_ptr<EtcdClient> client, Options options)
    : client_(std::move(client)),
      options_(std::move(options)),
      counters_(options_.counters != nullptr ? options_.counters : &own_counters_) {
  counters_->enabled = 1;
  MutexLock lock(mu_);
  stale_since_ms_ = MonotonicMs();
  tenants_ = options_.tenants;
}

EtcdLocator::~EtcdLocator() { Stop(); }

void EtcdLocator::Start() {
  thread_ = std::thread([this] { Run(); });
}

void EtcdLocator::Stop() {
  {
    MutexLock lock(mu_);
    stop_ = true;
    interrupt_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();  // (a watch notices stop_ within a second)
}

void EtcdLocator::SetTenants(std::set<uint32_t> tenants) {
  MutexLock lock(mu_);
  if (tenants == tenants_) return;
  tenants_ = std::move(tenants);
  retarget_ = true;
  interrupt_ = true;  // (the watch's stop flag: it ends, and Run reads again)
}

bool EtcdLocator::WaitSynced(int timeout_ms) {
  int64_t deadline = MonotonicMs() + timeout_ms;
  UniqueLock lock(mu_);
  while (!synced_ && !stop_) {
    int64_t left = deadline - MonotonicMs();
    if (left <= 0) return false;
    cv_.WaitFor(lock, std::chrono::milliseconds(left));
  }
  return synced_;
}

std::string EtcdLocator::Find(uint32_t tenant, const proto::Endpoint& addr) const {
  std::shared_ptr<const fabric::StaticLocator> matcher;
  {
    MutexLock lock(mu_);
    matcher = matcher_;
  }
  std::string host = matcher ? matcher->Find(tenant, addr) : "";
  if (!host.empty()) counters_->placements.fetch_add(1, std::memory_order_relaxed);
  return host;
}

EtcdLocatorHealth EtcdLocator::Health() const {
  EtcdLocatorHealth h;
  h.endpoint = client_->endpoint();
  MutexLock lock(mu_);
  h.tenants.assign(tenants_.begin(), tenants_.end());
  h.refused_tenants = refused_tenants_;
  h.connected = connected_;
  h.revision = revision_;
  h.lag_ms = connected_ ? 0 : MonotonicMs() - stale_since_ms_;
  h.last_error = last_error_;
  h.connects = connects_;
  h.full_reads = full_reads_;
  h.bad_records = bad_records_;
  h.watch_events = watch_events_;
  h.conflicts = conflicts_;
  h.hosts = hosts_.size();
  h.entries = matcher_ ? matcher_->size() : 0;
  return h;
}

std::string EtcdLocator::Text() const {
  MutexLock lock(mu_);
  return matcher_ ? matcher_->Text() : "";
}

std::string EtcdLocator::ConflictsText() const {
  MutexLock lock(mu_);
  return conflicts_text_;
}

std::string EtcdLocator::Describe() const {
  const std::string scheme = client_->tls() ? "etcds://" : "etcd://";
  std::string s = scheme;
  for (const std::string& e : client_->endpoints()) s += (s.size() > scheme.size() ? "," : "") + e;
  return s;
}

std::vector<std::string> EtcdLocator::Ranges() const {
  std::vector<std::string> out = {options_.prefix};
  for (uint32_t t : tenants_) out.push_back(TenantPrefix(options_.tenant_prefix, t));
  return out;
}

void EtcdLocator::Run() {
  std::vector<std::string> prefixes;
  std::vector<uint32_t> tenants;  // of prefixes[1...]
  int backoff = options_.backoff_min_ms;
  bool need_read = true;
  while (!stop_) {
    {
      // The tenants as they are now: at the first read, and whenever
      // SetTenants changed them (then everything is read again).
      MutexLock lock(mu_);
      if (stop_) break;
      if (need_read || retarget_) {
        if (retarget_) VS_LOG(kInfo, "directory: the tenants followed changed; reading the directory again");
        retarget_ = false;
        interrupt_ = false;
        need_read = true;
        prefixes = Ranges();
        tenants.assign(tenants_.begin(), tenants_.end());
        refused_tenants_.clear();
      }
    }
    if (need_read) {
      // The host records, then each tenant's VM records as of the same
      // revision: one consistent view.
      auto range = client_->GetPrefix(prefixes[0]);
      for (size_t i = 1; i < prefixes.size() && range.ok(); ++i) {
        auto more = client_->GetPrefix(prefixes[i], range->revision);
        if (more.status().code() == Code::kPermissionDenied) {
          // This host's etcd role lacks the tenant's grant (decision 103):
          // that tenant is not followed (its VMs here pair on this host
          // only), the others are.
          uint32_t t = tenants[i - 1];
          VS_LOG(kWarn, "directory: tenant %u not followed: %s (grant it to this host's etcd role)", t,
                 more.status().message().c_str());
          {
            MutexLock lock(mu_);
            refused_tenants_.push_back(t);
            last_error_ = "tenant " + std::to_string(t) + ": " + more.status().message();
          }
          prefixes.erase(prefixes.begin() + long(i));
          tenants.erase(tenants.begin() + long(i - 1));
          --i;
          continue;
        }
        if (!more.ok()) {
          range = more.status();
          break;
        }
        for (EtcdKeyValue& kv : more->kvs) range->kvs.push_back(std::move(kv));
      }
      if (!range.ok()) {
        Disconnected(range.status());
        if (!Pause(backoff)) break;
        backoff = std::min(backoff * 2, options_.backoff_max_ms);
        continue;
      }
      Load(*range, prefixes.size());
      need_read = false;
    }
    std::vector<EtcdClient::Range> ranges;
    {
      MutexLock lock(mu_);
      for (size_t i = 0; i < prefixes.size(); ++i) ranges.push_back({prefixes[i], range_revisions_[i] + 1});
    }
    int64_t compacted = 0;
    Status st = client_->WatchRanges(
        ranges,
        [&](size_t range, int64_t revision, const std::vector<EtcdEvent>& events) {
          backoff = options_.backoff_min_ms;
          Apply(range, revision, events);
          return !interrupt_;
        },
        &interrupt_, &compacted);
    VS_LOG(kDebug, "directory: watch of %zu prefix(es) ended: %s", ranges.size(), st.ToString().c_str());
    if (stop_) break;
    if (interrupt_) continue;  // SetTenants: read again (the top of the loop)
    if (st.code() == Code::kOutOfRange) {
      // What we missed is gone from etcd's history: read it all again.
      VS_LOG(kWarn, "directory: %s; reading the directory again", st.message().c_str());
      need_read = true;
      continue;
    }
    Disconnected(st.ok() ? Status(Code::kUnavailable, "watch ended") : st);
    if (!Pause(backoff)) break;
    backoff = std::min(backoff * 2, options_.backoff_max_ms);
  }
}

void EtcdLocator::Load(const EtcdRange& range, size_t ranges) {
  {
    MutexLock lock(mu_);
    hosts_.clear();
    vms_.clear();
    for (const EtcdKeyValue& kv : range.kvs) bad_records_ += !Put(kv);
    revision_ = range.revision;
    range_revisions_.assign(ranges, range.revision);
    ++full_reads_;
    Rebuild();
    Publish();
    synced_ = true;
  }
  cv_.NotifyAll();
  VS_LOG(kInfo, "directory: read %zu key(s) (hosts under %s, %zu prefix(es) of tenants under %s) at revision %lld",
         range.kvs.size(), options_.prefix.c_str(), ranges - 1, options_.tenant_prefix.c_str(),
         static_cast<long long>(range.revision));
  if (on_change_) on_change_();
}

void EtcdLocator::Apply(size_t range, int64_t revision, const std::vector<EtcdEvent>& events) {
  {
    MutexLock lock(mu_);
    if (!connected_) {
      // The watches are set up (the empty batch that says so, or events).
      connected_ = true;
      ++connects_;
      Publish();
    }
    if (events.empty()) return;
    watch_events_ += events.size();
    for (const EtcdEvent& e : events) {
      if (e.type == EtcdEvent::Type::kPut) {
        if (!Put(e.kv)) ++bad_records_;
      } else {
        Erase(e.kv.key);
      }
    }
    if (range < range_revisions_.size()) range_revisions_[range] = std::max(range_revisions_[range], revision);
    revision_ = std::max(revision_, revision);
    Rebuild();
    Publish();
  }
  if (on_change_) on_change_();
}

bool EtcdLocator::Put(const EtcdKeyValue& kv) {
  KeyName name;
  if (ParseKey(options_.prefix, kv.key, &name)) {
    auto host = DecodeHost(kv.value);
    if (!host.ok()) {
      VS_LOG(kWarn, "directory: %s: %s", kv.key.c_str(), host.status().message().c_str());
      return false;
    }
    hosts_[kv.key] = std::move(host).value();
    seen_[kv.key] = {kv.lease, MonotonicMs()};
    return true;
  }
  if (!ParseVmKey(options_.tenant_prefix, kv.key, &name) || tenants_.count(name.tenant) == 0) {
    VS_LOG(kWarn, "directory: ignoring key %s (not %sHOST or %sTENANT/HOST/VM of a tenant served here)",
           kv.key.c_str(), options_.prefix.c_str(), options_.tenant_prefix.c_str());
    return false;
  }
  auto vm = DecodeVm(kv.value);
  if (vm.ok() && vm->tenant != name.tenant)
    vm = Status(Code::kInvalidArgument, "VM record of tenant " + std::to_string(vm->tenant) + " under tenant " +
                                            std::to_string(name.tenant) + "'s prefix");
  std::string lines;
  if (vm.ok())
    for (const std::string& a : vm->addresses) lines += std::to_string(vm->tenant) + " " + a + " " + name.host + "\n";
  // Checked alone, so that one bad record never spoils the others.
  Status st = vm.ok() ? fabric::StaticLocator::Parse(lines, kv.key).status() : vm.status();
  if (!st.ok()) {
    VS_LOG(kWarn, "directory: %s: %s", kv.key.c_str(), st.message().c_str());
    vms_.erase(kv.key);
    seen_.erase(kv.key);
    return false;
  }
  vms_[kv.key] = std::move(lines);
  seen_[kv.key] = {kv.lease, MonotonicMs()};
  return true;
}

std::map<std::string, HostRecord> EtcdLocator::Hosts() const {
  std::map<std::string, HostRecord> out;
  MutexLock lock(mu_);
  for (const auto& [key, record] : hosts_) {
    KeyName name;
    if (ParseKey(options_.prefix, key, &name)) out.emplace(name.host, record);
  }
  return out;
}

std::vector<DirectoryHostView> EtcdLocator::View() const {
  std::map<std::string, DirectoryHostView> by_name;
  const int64_t now = MonotonicMs();
  MutexLock lock(mu_);
  auto seen = [&](const std::string& key, int64_t* lease, int64_t* age_ms) REQUIRES(mu_) {
    auto it = seen_.find(key);
    if (it == seen_.end()) return;
    *lease = it->second.lease;
    *age_ms = now - it->second.at_ms;
  };
  for (const auto& [key, record] : hosts_) {
    KeyName name;
    if (!ParseKey(options_.prefix, key, &name)) continue;
    DirectoryHostView& h = by_name[name.host];
    h.name = name.host;
    h.listed = true;
    h.record = record;
    seen(key, &h.lease, &h.age_ms);
  }
  for (const auto& [key, lines] : vms_) {
    KeyName name;
    if (!ParseVmKey(options_.tenant_prefix, key, &name)) continue;
    DirectoryHostView& h = by_name[name.host];
    h.name = name.host;
    DirectoryVmView vm;
    vm.name = name.vm;
    vm.tenant = name.tenant;
    std::istringstream in(lines);
    for (std::string t, a, host; in >> t >> a >> host;) vm.addresses.push_back(a);
    seen(key, &vm.lease, &vm.age_ms);
    h.vms.push_back(std::move(vm));
  }
  std::vector<DirectoryHostView> out;
  for (auto& [name, h] : by_name) out.push_back(std::move(h));
  return out;
}

void EtcdLocator::Erase(const std::string& key) {
  seen_.erase(key);
  hosts_.erase(key);
  vms_.erase(key);
}

void EtcdLocator::Rebuild() {
  std::vector<Claim> claims;
  for (const auto& [key, lines] : vms_) {
    std::istringstream in(lines);
    for (Claim c; in >> c.tenant >> c.address >> c.host;) claims.push_back(c);
  }
  // Addresses two hosts claim are believed of neither (claims.h).
  std::vector<bool> contested = Contested(claims);
  std::string text, conflicts;
  size_t n = 0;
  for (size_t i = 0; i < claims.size(); ++i) {
    std::string line = std::to_string(claims[i].tenant) + " " + claims[i].address + " " + claims[i].host + "\n";
    (contested[i] ? conflicts : text) += line;
    n += contested[i];
  }
  if (conflicts != conflicts_text_) {
    if (!conflicts.empty())
      VS_LOG(kWarn, "directory: %zu address claim(s) contradict another host's, ignored (kernel TCP):\n%s", n,
             conflicts.c_str());
    conflicts_text_ = conflicts;
  }
  conflicts_ = n;
  auto parsed = fabric::StaticLocator::Parse(text, "directory");
  if (parsed.ok()) matcher_ = std::shared_ptr<const fabric::StaticLocator>(std::move(parsed).value());
}

void EtcdLocator::Disconnected(const Status& why) {
  MutexLock lock(mu_);
  if (connected_ || last_error_ != why.message())
    VS_LOG(kWarn, "directory: etcd %s: %s (answering from the cache, revision %lld)", client_->endpoint().c_str(),
           why.message().c_str(), static_cast<long long>(revision_));
  if (connected_) stale_since_ms_ = MonotonicMs();
  connected_ = false;
  last_error_ = why.message();
  Publish();
}

void EtcdLocator::Publish() {
  DirectoryCounters& c = *counters_;
  c.connected = connected_ ? 1 : 0;
  c.revision = uint64_t(revision_);
  c.hosts = hosts_.size();
  c.entries = matcher_ ? matcher_->size() : 0;
  c.conflicts = conflicts_;
  c.watch_events = watch_events_;
  c.connects = connects_;
  c.full_reads = full_reads_;
  c.bad_records = bad_records_;
}

bool EtcdLocator::Pause(int ms) { return PauseUnlessStopped(mu_, cv_, stop_, ms); }

}  // namespace vsocket::directory
