#include "host-backend/directory/etcd_publisher.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "base/clock.h"
#include "base/log.h"

namespace vsocket::directory {

EtcdPublisher::EtcdPublisher(std::shared_ptr<EtcdClient> client, std::string host, HostRecord record,
                             std::map<std::string, VmRecord> vms, Options options)
    : client_(std::move(client)),
      host_(std::move(host)),
      record_(std::move(record)),
      options_(std::move(options)),
      counters_(options_.counters != nullptr ? options_.counters : &own_counters_) {
  MutexLock lock(mu_);
  vms_ = std::move(vms);
}

EtcdPublisher::~EtcdPublisher() {
  if (thread_.joinable()) Stop(StopMode::kRevoke);
}

void EtcdPublisher::Start() {
  thread_ = std::thread([this] { Run(); });
}

void EtcdPublisher::Stop(StopMode mode) {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
  int64_t lease;
  {
    MutexLock lock(mu_);
    lease = lease_;
    published_ = false;
    lease_ = 0;
  }
  counters_->published = 0;
  if (mode == StopMode::kRevoke && lease != 0) {
    Status st = client_->Revoke(lease);
    if (!st.ok())
      VS_LOG(kWarn, "directory: revoking lease %lld: %s (the records go when it expires, within %d s)",
             static_cast<long long>(lease), st.message().c_str(), options_.ttl_s);
  }
}

bool EtcdPublisher::WaitPublished(int timeout_ms) {
  int64_t deadline = MonotonicMs() + timeout_ms;
  UniqueLock lock(mu_);
  while (!published_ && !stop_) {
    int64_t left = deadline - MonotonicMs();
    if (left <= 0) return false;
    cv_.WaitFor(lock, std::chrono::milliseconds(left));
  }
  return published_;
}

EtcdPublisherHealth EtcdPublisher::Health() const {
  MutexLock lock(mu_);
  EtcdPublisherHealth h{published_, lease_, publishes_, counters_->keepalive_failures.load(), last_error_};
  if (published_ && lease_confirmed_ms_ != 0) {
    h.lease_ttl_s = lease_ttl_s_;
    h.lease_confirmed_ms_ago = MonotonicMs() - lease_confirmed_ms_;
  }
  return h;
}

std::string EtcdPublisher::KeyOf(const std::string& vm, const VmRecord& r) const {
  return VmKey(options_.tenant_prefix, r.tenant, host_, vm);
}

void EtcdPublisher::StageSet(const std::string& vm, const VmRecord& record, std::string* stale) {
  auto was = vms_.find(vm);
  if (was != vms_.end() && was->second.tenant != record.tenant) {
    *stale = KeyOf(vm, was->second);
    removed_.insert(*stale);
  }
  vms_[vm] = record;
  removed_.erase(KeyOf(vm, record));
  ++changes_;
}

bool EtcdPublisher::StageRemove(const std::string& vm, std::string* key) {
  auto it = vms_.find(vm);
  if (it == vms_.end()) return false;
  *key = KeyOf(vm, it->second);
  vms_.erase(it);
  removed_.insert(*key);
  ++changes_;
  return true;
}

void EtcdPublisher::SetVmSoon(const std::string& vm, VmRecord record) {
  {
    MutexLock lock(mu_);
    auto was = vms_.find(vm);
    if (was != vms_.end() && EncodeVm(was->second) == EncodeVm(record)) return;  // (the record holds the tenant)
    std::string stale;
    StageSet(vm, record, &stale);
    resync_ = soon_ = true;
  }
  WakeToWrite(vm, "runs here: publishing");
}

void EtcdPublisher::RemoveVmSoon(const std::string& vm) {
  {
    MutexLock lock(mu_);
    std::string key;
    if (!StageRemove(vm, &key)) return;
    resync_ = soon_ = true;
  }
  WakeToWrite(vm, "left this host: withdrawing");
}

void EtcdPublisher::WakeToWrite(const std::string& vm, const char* what) {
  cv_.NotifyAll();
  VS_LOG(kInfo, "directory: VM %s %s", vm.c_str(), what);
}

void EtcdPublisher::SetVm(const std::string& vm, VmRecord record) {
  int64_t lease;
  std::string stale;  // its key under another tenant, if its tenant changed
  {
    MutexLock lock(mu_);
    StageSet(vm, record, &stale);
    lease = published_ ? lease_ : 0;
  }
  if (lease == 0) return;  // (written with the rest when it publishes)
  if (!stale.empty()) {
    auto del = client_->Delete(stale);
    if (!del.ok()) return NeedResync(del.status());
  }
  auto put = client_->Put(KeyOf(vm, record), EncodeVm(record), lease);
  if (!put.ok()) return NeedResync(put.status());
  VS_LOG(kInfo, "directory: VM %s runs here: published", vm.c_str());
}

void EtcdPublisher::RemoveVm(const std::string& vm) {
  int64_t lease;
  std::string key;
  {
    MutexLock lock(mu_);
    if (!StageRemove(vm, &key)) return;
    lease = published_ ? lease_ : 0;
  }
  if (lease == 0) return;  // (its key went with the lease, or was never written)
  auto del = client_->Delete(key);
  if (!del.ok()) return NeedResync(del.status());
  VS_LOG(kInfo, "directory: VM %s left this host: withdrawn", vm.c_str());
}

void EtcdPublisher::NeedResync(const Status& why) {
  Failed(why);
  MutexLock lock(mu_);
  resync_ = true;
}

Status EtcdPublisher::Resync(int64_t lease) {
  std::map<std::string, VmRecord> vms;
  std::set<std::string> removed;
  uint64_t changes;
  {
    MutexLock lock(mu_);
    vms = vms_;
    removed = removed_;
    changes = changes_;
  }
  for (const std::string& key : removed) {
    auto del = client_->Delete(key);
    if (!del.ok()) return del.status();
  }
  std::vector<std::pair<std::string, std::string>> records;
  for (const auto& [vm, r] : vms) records.emplace_back(KeyOf(vm, r), EncodeVm(r));
  auto put = client_->PutAll(records, lease);
  if (!put.ok()) return put.status();
  MutexLock lock(mu_);
  if (changes_ == changes) {  // (else another round: a change came meanwhile)
    resync_ = false;
    removed_.clear();
  }
  return Status::Ok();
}

Status EtcdPublisher::Publish() {
  const int64_t granted_ms = MonotonicMs();
  auto lease = client_->GrantLease(options_.ttl_s);
  if (!lease.ok()) return lease.status();
  std::map<std::string, VmRecord> vms;
  uint64_t changes;
  {
    MutexLock lock(mu_);
    lease_ = *lease;  // (revoked by Stop even if the writes below fail)
    vms = vms_;
    changes = changes_;
  }
  // The host and its VMs in one transaction (a hundred keys per
  // transaction at most): a peer never sees half of them.
  std::vector<std::pair<std::string, std::string>> records = {{HostKey(options_.prefix, host_), EncodeHost(record_)}};
  for (const auto& [vm, r] : vms) records.emplace_back(KeyOf(vm, r), EncodeVm(r));
  auto put = client_->PutAll(records, *lease);
  if (!put.ok()) return put.status();
  {
    MutexLock lock(mu_);
    published_ = true;
    ++publishes_;
    lease_ttl_s_ = options_.ttl_s;
    lease_confirmed_ms_ = granted_ms;
    // Keys of VMs removed before went with the old lease; a change during
    // the writes above is written by a resync.
    if (changes_ == changes) {
      removed_.clear();
      resync_ = false;
    } else {
      resync_ = true;
    }
  }
  counters_->published = 1;
  counters_->publishes.fetch_add(1, std::memory_order_relaxed);
  cv_.NotifyAll();
  VS_LOG(kInfo, "directory: published host %s and %zu VM(s) under lease %lld (TTL %d s)", host_.c_str(), vms.size(),
         static_cast<long long>(*lease), options_.ttl_s);
  return Status::Ok();
}

void EtcdPublisher::Run() {
  int backoff = options_.backoff_min_ms;
  // Renewed three times per TTL: two renewals may fail before it expires.
  const int renew_ms = std::max(300, options_.ttl_s * 1000 / 3);
  int64_t renewed_ms = MonotonicMs();  // (a publish grants a fresh lease)
  while (!stop_) {
    bool published, resync;
    int64_t lease;
    {
      MutexLock lock(mu_);
      published = published_;
      lease = lease_;
      resync = resync_;
    }
    Status st;
    if (!published) {
      st = Publish();
      renewed_ms = MonotonicMs();
    } else {
      // A resync puts under the lease (refused once it expired) or renews
      // it; changes that come faster than the renewals do not starve them.
      if (resync && MonotonicMs() - renewed_ms < renew_ms) {
        st = Resync(lease);
      } else {
        const int64_t asked_ms = MonotonicMs();
        renewed_ms = asked_ms;
        resync = false;
        auto ttl = client_->KeepAlive(lease);
        st = ttl.status();
        if (ttl.ok()) {
          MutexLock lock(mu_);
          if (lease_ == lease) {
            lease_ttl_s_ = *ttl;
            lease_confirmed_ms_ = asked_ms;  // (the TTL runs from before the answer)
          }
        }
      }
      if (!st.ok() && !resync) counters_->keepalive_failures.fetch_add(1, std::memory_order_relaxed);
      if (st.code() == Code::kNotFound) {
        // Expired while etcd was out of reach: the records are gone.
        VS_LOG(kWarn, "directory: lease %lld expired; publishing again", static_cast<long long>(lease));
        counters_->published = 0;
        MutexLock lock(mu_);
        published_ = false;
        lease_ = 0;
      }
    }
    if (st.ok()) {
      backoff = options_.backoff_min_ms;
      bool more;
      {
        MutexLock lock(mu_);
        more = resync_ && published_;  // (a change waited for the renewal, or came during the write)
      }
      if (more) continue;
      if (!Pause(static_cast<int>(std::max<int64_t>(0, renew_ms - (MonotonicMs() - renewed_ms))))) break;
    } else {
      Failed(st);
      if (!Pause(backoff)) break;
      backoff = std::min(backoff * 2, options_.backoff_max_ms);
    }
  }
}

void EtcdPublisher::Failed(const Status& why) {
  MutexLock lock(mu_);
  if (last_error_ != why.message())
    VS_LOG(kWarn, "directory: publishing host %s: %s", host_.c_str(), why.message().c_str());
  last_error_ = why.message();
}

bool EtcdPublisher::Pause(int ms) {
  // Ended early by a *Soon change while published (not published: the
  // next publish writes it, after the backoff).
  int64_t until = MonotonicMs() + ms;
  UniqueLock lock(mu_);
  while (!stop_.load()) {
    if (soon_ && published_) {
      soon_ = false;
      return true;
    }
    int64_t left = until - MonotonicMs();
    if (left <= 0) return true;
    cv_.WaitFor(lock, std::chrono::milliseconds(left));
  }
  return false;
}

}  // namespace vsocket::directory
