// The VMs a vsocketd serves now, read by every thread (the worker's
// pairing, the control socket, the metrics listener) and changed by
// vsocketctl vm add/remove (decision 105).
//
// Copy on write: a list is never changed once published; vm add/remove
// build a new one and publish it whole. A reader takes the current list
// (one shared_ptr copy under a lock held for just that) and reads it for
// as long as it likes without a lock: a report renders the VMs it took
// even if one is removed meanwhile, and nobody reads a vector while it is
// being resized. Rejected: a mutex around the vector (every reader, the
// worker included, would hold it for its whole walk, and a reader's
// pointer into it, as the metrics rows keep, would dangle after the next
// push_back). The worker does not read the table at all: ConnManager gets
// each new list through its VM-operation queue and swaps it on its own
// thread (ConnManager::RequestLocalPorts), so pairing never takes a lock.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {

class VmTable {
 public:
  using Vms = std::vector<vhost::PortConfig>;

  explicit VmTable(Vms vms) : vms_(std::make_shared<const Vms>(std::move(vms))) {}

  // The list as it is now (never null; unchanged for as long as it is held).
  std::shared_ptr<const Vms> Get() const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return vms_;
  }
  // Publishes a new list (vm add/remove, serialised by their caller).
  void Set(std::shared_ptr<const Vms> vms) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    vms_ = std::move(vms);
  }

 private:
  mutable Mutex mu_;
  std::shared_ptr<const Vms> vms_ GUARDED_BY(mu_);
};

}  // namespace vsocket::backend
