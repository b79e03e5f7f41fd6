// Publishes this host's records in the cluster directory (records.h) under
// a lease of its own, and keeps the lease alive from a thread.
//
// The keys live only as long as the lease: a host that dies (or loses etcd
// for longer than the TTL) disappears from every other host's locator once
// etcd expires the lease. A lease found expired after an outage is replaced
// by a new one and everything is written again. Stop() revokes the lease
// (the keys go at once) or, as a crashed host would, lets it expire.
//
// A VM that arrives or leaves (vsocketctl migrate end / detach) is written
// or deleted at once (SetVm, RemoveVm); if etcd cannot be reached then, the
// publisher's thread writes the whole set again once it can (or the next
// publish under a new lease carries it).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "base/mutex.h"
#include "host-backend/directory/counters.h"
#include "host-backend/directory/etcd_client.h"
#include "host-backend/directory/records.h"

namespace vsocket::directory {

struct EtcdPublisherHealth {
  bool published = false;  // the records are in etcd under a live lease
  int64_t lease = 0;
  uint64_t publishes = 0;  // times the records were written (a new lease each)
  uint64_t keepalive_failures = 0;  // renewals that failed
  std::string last_error;
  // The lease as etcd last confirmed it (granted or renewed): its TTL then,
  // in seconds, and how long ago that was (-1: never). What is left of it
  // is lease_ttl_s * 1000 - lease_confirmed_ms_ago.
  int64_t lease_ttl_s = 0;
  int64_t lease_confirmed_ms_ago = -1;
};

class EtcdPublisher {
 public:
  struct Options {
    std::string prefix = kDefaultPrefix;               // the host record's
    std::string tenant_prefix = kDefaultTenantPrefix;  // the VM records' (by tenant)
    int ttl_s = 10;  // the lease: how long a dead host's records outlive it
    int backoff_min_ms = 200;
    int backoff_max_ms = 5000;
    // Where its numbers go (the daemon's metrics); null: its own.
    DirectoryCounters* counters = nullptr;
  };
  EtcdPublisher(std::shared_ptr<EtcdClient> client, std::string host, HostRecord record,
                std::map<std::string, VmRecord> vms, Options options);
  ~EtcdPublisher();  // Stop(kRevoke) unless stopped

  void Start();
  enum class StopMode { kRevoke, kLetExpire };
  void Stop(StopMode mode = StopMode::kRevoke);
  // Waits until the records are written: false if `timeout_ms` passed first.
  bool WaitPublished(int timeout_ms) EXCLUDES(mu_);
  EtcdPublisherHealth Health() const EXCLUDES(mu_);
  // VM `vm` runs here now (with `record`) / no longer runs here. From any
  // thread; waits for etcd (its timeouts) only while published.
  void SetVm(const std::string& vm, VmRecord record) EXCLUDES(mu_);
  void RemoveVm(const std::string& vm) EXCLUDES(mu_);
  // The same, for a thread that must not wait on etcd (the vhost-user and
  // worker threads at a live migration's switchover and arrival, decision
  // 116): the change is kept and the publisher's thread writes it at once
  // (or when etcd answers again). A VM already published with that record,
  // or not published, is left alone.
  void SetVmSoon(const std::string& vm, VmRecord record) EXCLUDES(mu_);
  void RemoveVmSoon(const std::string& vm) EXCLUDES(mu_);

 private:
  void Run();
  // A new lease and every record under it.
  Status Publish();
  // Writes every VM record under the current lease and deletes those of
  // VMs removed since (after a change that could not be written at once).
  Status Resync(int64_t lease);
  // A change was not written (or raced a publish): Run resyncs.
  void NeedResync(const Status& why) EXCLUDES(mu_);
  // The sets' part of SetVm/RemoveVm (and their *Soon twins): the key to
  // write or delete (and, for a VM whose tenant changed, its stale key);
  // StageRemove is false for a VM not published.
  void StageSet(const std::string& vm, const VmRecord& record, std::string* stale) REQUIRES(mu_);
  bool StageRemove(const std::string& vm, std::string* key) REQUIRES(mu_);
  // A *Soon change was staged: Run's pause ends, and the log says what.
  void WakeToWrite(const std::string& vm, const char* what) EXCLUDES(mu_);
  bool Pause(int ms) EXCLUDES(mu_);
  void Failed(const Status& why) EXCLUDES(mu_);
  std::string KeyOf(const std::string& vm, const VmRecord& r) const;

  const std::shared_ptr<EtcdClient> client_;
  const std::string host_;
  const HostRecord record_;
  const Options options_;
  DirectoryCounters own_counters_;
  DirectoryCounters* const counters_;  // options_.counters or own_counters_
  std::atomic<bool> stop_{false};

  mutable Mutex mu_;
  CondVar cv_;  // published_ or stop_ changed
  bool published_ GUARDED_BY(mu_) = false;
  int64_t lease_ GUARDED_BY(mu_) = 0;
  int64_t lease_ttl_s_ GUARDED_BY(mu_) = 0;         // as etcd last confirmed it
  int64_t lease_confirmed_ms_ GUARDED_BY(mu_) = 0;  // when (MonotonicMs; 0: never)
  uint64_t publishes_ GUARDED_BY(mu_) = 0;
  std::string last_error_ GUARDED_BY(mu_);
  std::map<std::string, VmRecord> vms_ GUARDED_BY(mu_);  // the VMs that run here
  std::set<std::string> removed_ GUARDED_BY(mu_);        // keys of VMs left since the last full write
  uint64_t changes_ GUARDED_BY(mu_) = 0;                 // SetVm/RemoveVm calls
  bool resync_ GUARDED_BY(mu_) = false;
  bool soon_ GUARDED_BY(mu_) = false;  // a *Soon change waits for Run: its pause ends

  std::thread thread_;  // joined by Stop
};

}  // namespace vsocket::directory
