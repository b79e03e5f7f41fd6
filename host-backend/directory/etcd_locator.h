// The Locator of a cluster directory in etcd (records.h has the keys).
//
// It follows the host records and the VM records of the tenants this host
// serves, no others (decision 103): a background thread reads those
// prefixes once (as of one revision), then watches them on one stream, each
// from that read's revision, and keeps a cache:
// Find() answers from the cache alone and never waits on etcd. When etcd
// cannot be reached the cache stays as it was (entries of hosts that die
// meanwhile stay too, until etcd is back and their leases' expiry reaches
// us); the thread reconnects with backoff (0.2 s doubling to 5 s) and
// resumes each prefix's watch after the last revision it applied to it, so
// nothing is missed. If etcd compacted that revision away, it reads
// everything again.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "host-backend/directory/counters.h"
#include "host-backend/directory/etcd_client.h"
#include "host-backend/directory/records.h"
#include "host-backend/fabric/locator.h"

namespace vsocket::directory {

struct EtcdLocatorHealth {
  bool connected = false;    // the watch is live
  int64_t revision = 0;      // the last revision applied to the cache
  int64_t lag_ms = 0;        // how long the cache has gone without a live watch (0: live)
  std::string last_error;    // the last failure ("" if none yet)
  std::string endpoint;      // the etcd endpoint in use
  std::vector<uint32_t> tenants;  // the tenants whose VM records are to be followed
  std::vector<uint32_t> refused_tenants;  // of those, the ones etcd refused to this host (no grant)
  uint64_t watch_events = 0;  // changes applied from the watch
  uint64_t connects = 0;     // watches set up
  uint64_t full_reads = 0;   // reads of the whole prefix (the first, and after compaction)
  uint64_t bad_records = 0;  // keys or values ignored as malformed
  size_t conflicts = 0;      // address claims ignored: another host claims the same (claims.h)
  size_t hosts = 0;          // host records in the cache
  size_t entries = 0;        // (tenant, address) entries in the cache
};

// The cache as vsocketctl locator shows it: each host with its VMs, every
// record with the lease it lives under and how long ago this host's cache
// last saw it written.
struct DirectoryVmView {
  std::string name;
  uint32_t tenant = 0;
  std::vector<std::string> addresses;
  int64_t lease = 0;
  int64_t age_ms = 0;
};
struct DirectoryHostView {
  std::string name;
  bool listed = false;  // it has a host record (else only VM records, for a moment)
  HostRecord record;
  int64_t lease = 0;
  int64_t age_ms = 0;
  std::vector<DirectoryVmView> vms;
};

class EtcdLocator : public fabric::Locator {
 public:
  struct Options {
    std::string prefix = kDefaultPrefix;               // host records
    std::string tenant_prefix = kDefaultTenantPrefix;  // VM records, by tenant
    // The tenants this host serves (its VMs', here or away): only their VM
    // records are read and watched, and Find knows no other tenant.
    std::set<uint32_t> tenants;
    int backoff_min_ms = 200;
    int backoff_max_ms = 5000;
    // Where its numbers go (the daemon's metrics); null: its own.
    DirectoryCounters* counters = nullptr;
  };
  EtcdLocator(std::shared_ptr<EtcdClient> client, Options options);
  ~EtcdLocator() override;

  // Called on the locator's thread after each change to the cache (the
  // daemon has pending connections look again). Set before Start.
  void SetOnChange(std::function<void()> fn) { on_change_ = std::move(fn); }
  void Start();
  void Stop();
  // The tenants to follow from now on (vsocketctl vm add/remove brought
  // the first VM of a tenant to this host, or took its last away: decision
  // 105). If they changed, the watch ends within a second and the
  // directory is read again, these tenants' prefixes as of one revision,
  // then watched: records of a tenant no longer followed leave the cache.
  void SetTenants(std::set<uint32_t> tenants) EXCLUDES(mu_);
  // Waits until the first read of the directory is in the cache: false if
  // `timeout_ms` passed first (Find then answers "" until it is).
  bool WaitSynced(int timeout_ms) EXCLUDES(mu_);

  std::string Find(uint32_t tenant, const proto::Endpoint& addr) const override EXCLUDES(mu_);
  EtcdLocatorHealth Health() const EXCLUDES(mu_);
  // The host records in the cache, by host name (the <host> of each key:
  // with etcd RBAC only that host can write it, decision 86), as the
  // hosts' fabric peers are found (decision 96).
  std::map<std::string, HostRecord> Hosts() const EXCLUDES(mu_);
  // Every host in the cache with its VMs (of the tenants followed), by name.
  std::vector<DirectoryHostView> View() const EXCLUDES(mu_);
  // The cached entries in the static locator's file format.
  std::string Text() const EXCLUDES(mu_);
  // The claims ignored as contradicting another host's, in the same format.
  std::string ConflictsText() const EXCLUDES(mu_);
  std::string Describe() const;  // "etcd://A,B"

 private:
  void Run();
  // Replaces the cache with a full read of `ranges` prefixes.
  void Load(const EtcdRange& range, size_t ranges) EXCLUDES(mu_);
  // Applies a watch batch of range `range` (Ranges()).
  void Apply(size_t range, int64_t revision, const std::vector<EtcdEvent>& events) EXCLUDES(mu_);
  // The prefixes followed: the host records', then each tenant's.
  std::vector<std::string> Ranges() const REQUIRES(mu_);
  // Puts one key into `hosts_`/`vms_` (false: malformed, ignored).
  bool Put(const EtcdKeyValue& kv) REQUIRES(mu_);
  void Erase(const std::string& key) REQUIRES(mu_);
  // Compiles vms_ into the matcher Find uses.
  void Rebuild() REQUIRES(mu_);
  // Copies the cache's numbers to counters_.
  void Publish() REQUIRES(mu_);
  void Disconnected(const Status& why) EXCLUDES(mu_);
  // Sleeps up to `ms` unless stopped: false once stopped.
  bool Pause(int ms) EXCLUDES(mu_);

  const std::shared_ptr<EtcdClient> client_;
  const Options options_;
  std::function<void()> on_change_;
  DirectoryCounters own_counters_;
  DirectoryCounters* const counters_;  // options_.counters or own_counters_
  std::atomic<bool> stop_{false};  // (read by the watch's progress callback)
  // Ends the watch: set with stop_, and by SetTenants (then the thread
  // reads again and clears it). The watch's own stop flag.
  std::atomic<bool> interrupt_{false};

  mutable Mutex mu_;
  CondVar cv_;                                               // synced_ or stop_ changed
  std::map<std::string, HostRecord> hosts_ GUARDED_BY(mu_);  // by key
  std::map<std::string, std::string> vms_ GUARDED_BY(mu_);   // key -> entry lines
  std::set<uint32_t> tenants_ GUARDED_BY(mu_);               // followed (Options::tenants, then SetTenants)
  bool retarget_ GUARDED_BY(mu_) = false;                    // tenants_ changed: read again
  struct Seen {
    int64_t lease = 0;
    int64_t at_ms = 0;  // MonotonicMs when the cache took it
  };
  std::map<std::string, Seen> seen_ GUARDED_BY(mu_);  // key of hosts_ or vms_ -> its last write
  std::shared_ptr<const fabric::StaticLocator> matcher_ GUARDED_BY(mu_);
  bool synced_ GUARDED_BY(mu_) = false;
  bool connected_ GUARDED_BY(mu_) = false;
  int64_t revision_ GUARDED_BY(mu_) = 0;  // the highest of range_revisions_
  // Per range (Ranges()): the last revision applied to it, where its watch
  // resumes (one stream's watches need not deliver in one order).
  std::vector<int64_t> range_revisions_ GUARDED_BY(mu_);
  std::vector<uint32_t> refused_tenants_ GUARDED_BY(mu_);  // read refused: not followed
  int64_t stale_since_ms_ GUARDED_BY(mu_) = 0;
  std::string last_error_ GUARDED_BY(mu_);
  uint64_t connects_ GUARDED_BY(mu_) = 0;
  uint64_t full_reads_ GUARDED_BY(mu_) = 0;
  uint64_t bad_records_ GUARDED_BY(mu_) = 0;
  uint64_t watch_events_ GUARDED_BY(mu_) = 0;
  size_t conflicts_ GUARDED_BY(mu_) = 0;
  std::string conflicts_text_ GUARDED_BY(mu_);

  std::thread thread_;  // last: joined before the members above go
};

}  // namespace vsocket::directory
