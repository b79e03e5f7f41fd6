#include "host-backend/migration.h"

#include <array>
#include <cstdlib>
#include <string>

#include "base/log.h"
#include "proto/control.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {

namespace {

// VSOCKET_DEBUG_NO_MIGRATION_DRAIN=1: connections stay on the rings while
// a VM is copied (decision 88's conditions). Only for the dirty-log
// completeness test's negative control (tests/vm/migrate.sh
// migrate_without_dirty_log), which needs vsocketd writing into the guest
// during the pre-copy to see what an unmarked write does.
bool NoMigrationDrain() {
  static const bool off = [] {
    const char* v = std::getenv("VSOCKET_DEBUG_NO_MIGRATION_DRAIN");
    if (v == nullptr || std::string(v) != "1") return false;
    VS_LOG(kWarn, "VSOCKET_DEBUG_NO_MIGRATION_DRAIN=1: connections stay on the rings during live migrations "
                  "(they do not survive the move; tests only)");
    return true;
  }();
  return off;
}

}  // namespace

void Migrations::Left(const vhost::PortConfig& vm) {
  if (!left_.insert(vm.index).second) return;
  arrived_.erase(vm.index);
  counters_.withdrawn.fetch_add(1, std::memory_order_relaxed);
  VS_LOG(kInfo, "vm %s: its devices stopped with their dirty log on (the switchover): it runs elsewhere now; "
                "out of this host's directory records (etcd) until a device of it starts here again",
         vm.vm_name.c_str());
  if (presence_) presence_(vm, false);
}

void Migrations::DirtyLogChanged(vhost::BackendDevice& device, bool logging) {
  const uint32_t vm = device.port()->index;
  const char* name = device.port()->vm_name.c_str();
  MutexLock lock(mu_);
  auto first = logging_.lower_bound({vm, 0});
  bool was_on = first != logging_.end() && first->first == vm;
  if (logging) logging_.insert({vm, device.id()});
  else logging_.erase({vm, device.id()});
  first = logging_.lower_bound({vm, 0});
  bool on = first != logging_.end() && first->first == vm;
  if (!on && was_on && device.stopping()) Left(*device.port());
  if (NoMigrationDrain()) return;
  if (on && !was_on) {
    // Only a VM that does not drain already: an operator's drain (or a
    // process-mode move) stays theirs, and so does its lifting.
    if (conns_.draining(vm) != proto::Reason::kNone) {
      VS_LOG(kInfo, "vm %s: live migration began while it drains already (%s): left as it is", name,
             proto::ToString(conns_.draining(vm)));
      return;
    }
    drained_.insert(vm);
    counters_.drains.fetch_add(1, std::memory_order_relaxed);
    (void)conns_.RequestDrain(vm, true, proto::Reason::kMigration);
    VS_LOG(kInfo, "vm %s: live migration began: its connections leave the rings (drain, reason migration)", name);
  } else if (!on && was_on && drained_.erase(vm) != 0) {
    counters_.undrains.fetch_add(1, std::memory_order_relaxed);
    (void)conns_.RequestDrain(vm, false, proto::Reason::kMigration);
    VS_LOG(kInfo, "vm %s: %s: the migration's drain is lifted", name,
           device.stopping() ? "its devices stopped (the switchover: it runs elsewhere now)"
                             : "live migration ended with its devices running here (cancelled)");
  }
}

void Migrations::OnAttach(vhost::BackendDevice& device) {
  const vhost::PortConfig& vm = *device.port();
  {
    MutexLock lock(mu_);
    bool waits = left_.count(vm.index) != 0 || (vm.incoming && arrived_.count(vm.index) == 0);
    if (waits) {
      left_.erase(vm.index);
      arrived_.insert(vm.index);
      counters_.published.fetch_add(1, std::memory_order_relaxed);
      VS_LOG(kInfo, "vm %s: device %lu started: the VM runs here (it arrived): in this host's directory records (etcd)", vm.vm_name.c_str(),
             static_cast<unsigned long>(device.id()));
      if (presence_) presence_(vm, true);
    }
  }
  if (device.num_queues() < 2) return;  // (not loaded: nothing of a session to look at)
  if (!seen_.insert(&device).second) return;  // (again after a reconfiguration)
  // A device that starts for the first time with requests consumed already
  // was started by another vsocketd: QEMU brought the rings' state along
  // (SET_VRING_BASE), not the session. A fresh device starts at 0 (a
  // wrap to exactly 0 on both queues is the one case this misses: that
  // library then waits for answers as from a stopped backend, §8).
  if (device.queue(0).last_avail_idx() == 0 && device.queue(1).last_avail_idx() == 0) return;
  to_tell_.insert(&device);
  counters_.arrivals.fetch_add(1, std::memory_order_relaxed);
  VS_LOG(kInfo, "vm %s: device %lu arrived with a session opened elsewhere (request queue at %u): telling its library",
         device.port()->vm_name.c_str(), static_cast<unsigned long>(device.id()), device.queue(0).last_avail_idx());
}

void Migrations::OnDetach(vhost::BackendDevice& device) {
  if (!device.stopping()) return;
  seen_.erase(&device);
  to_tell_.erase(&device);
}

bool Migrations::Pump(vhost::BackendDevice& device) {
  if (to_tell_.empty() || to_tell_.count(&device) == 0 || device.broken()) return false;
  vhost::VirtqueueDevice& q = device.queue(1);
  vhost::DescChain chain;
  vhost::PopResult r = q.Pop(&chain);
  if (r == vhost::PopResult::kBroken) {
    device.MarkBroken(std::string("event queue: ") + q.broken_reason());
    to_tell_.erase(&device);
    return false;
  }
  if (r == vhost::PopResult::kEmpty) return false;  // (NeedsKick: woken when one is posted)
  to_tell_.erase(&device);
  if (chain.num_readable != 0) {
    device.MarkBroken("event queue: a buffer with bytes to read (not vSocket's driver)");
    return false;
  }
  proto::Message m{proto::MsgType::kError, 0,
                   proto::Error{0, proto::WireError::kUnknownConnection, proto::Reason::kMigration}};
  std::array<uint8_t, proto::kMaxMessageSize> buf;
  auto len = proto::Encode(m, buf);
  uint32_t written = len.ok() && *len <= chain.writable_bytes ? static_cast<uint32_t>(chain.CopyIn({buf.data(), *len})) : 0;
  q.Push(chain.head, written);  // (CopyIn and Push mark what they write: decision 88)
  counters_.told.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace vsocket::backend
