// A QEMU live migration as vsocketd sees it (issue 36; decisions 093, 094).
//
// On the host the VM leaves: QEMU turns each of the VM's devices' dirty
// log on (VHOST_F_LOG_ALL) for the whole pre-copy. The first device's log
// going on drains the VM for kMigration (the operator's drain: every
// upgraded connection leaves the rings with clean fences, registrations
// wait unpaired), so both ends are on kernel TCP before the switchover.
// When the last log goes off with the devices still running (the
// migration was cancelled) or the last logging device stops (the
// switchover: the VM runs elsewhere now), that drain is lifted: on the
// source its connections pair and upgrade again; after a switchover there
// are none left. A drain the operator asked for is never lifted here.
//
// On the host the VM reaches: a device whose first start finds its rings
// already in use (a request queue consumed past 0: its library said HELLO
// to another vsocketd) has a session this vsocketd never saw. Its library
// is told so once, on the device's event queue: ERROR for connection 0
// (the session as a whole), unknown-connection, reason migration. The
// library takes it as its backend gone (RESYNC for anything still on the
// rings, decision 094) and opens a new session through vsocket-guestd.
//
// The directory follows (decision 116): the switchover withdraws the VM
// from this host's records, and a VM configured `incoming` (or withdrawn
// so) is published when a device of it starts here: the guest arrived, or
// came back (a migration that failed after the switchover).
#pragma once

#include <functional>

#include <atomic>
#include <cstdint>
#include <set>
#include <unordered_set>

#include "base/mutex.h"
#include "host-backend/conn/conn_manager.h"
#include "vhost/backend/backend_device.h"

namespace vsocket::backend {

struct MigrationCounters {
  std::atomic<uint64_t> drains{0};     // VMs drained because their dirty log went on
  std::atomic<uint64_t> undrains{0};   // those drains lifted (cancelled, or the VM left)
  std::atomic<uint64_t> arrivals{0};   // devices that started with a session another vsocketd opened
  std::atomic<uint64_t> told{0};       // of those, told so on their event queue
  std::atomic<uint64_t> withdrawn{0};  // VMs withdrawn from the directory at a switchover
  std::atomic<uint64_t> published{0};  // VMs published when their first device started (arrived)
};

// Where a VM runs, for the directory: `here` true when it starts running on
// this host (published), false when it left (withdrawn). Called from the
// vhost-user thread (left) and the worker thread (here); must not block.
using VmPresence = std::function<void(const vhost::PortConfig& vm, bool here)>;

class Migrations {
 public:
  Migrations(ConnManager* conns, MigrationCounters* counters, VmPresence presence = nullptr)
      : conns_(*conns), presence_(std::move(presence)), counters_(*counters) {}

  // The vhost thread: `device`'s dirty log went on (logging) or off, or
  // the device stopped with its log on (logging false, device.stopping()).
  // Asks the worker for the drain or its lifting; the caller wakes it.
  void DirtyLogChanged(vhost::BackendDevice& device, bool logging) EXCLUDES(mu_);

  // The worker thread.
  void OnAttach(vhost::BackendDevice& device) EXCLUDES(mu_);
  void OnDetach(vhost::BackendDevice& device);
  // Tells an arrived device's library its session is unknown here (once,
  // when an event buffer is there). True if it wrote.
  bool Pump(vhost::BackendDevice& device);
  // An arrived device waits for an event buffer.
  bool WaitsForBuffer(vhost::BackendDevice& device) const { return to_tell_.count(&device) != 0; }

 private:
  // The vhost thread: the VM's last logging device stopped.
  void Left(const vhost::PortConfig& vm) REQUIRES(mu_);

  ConnManager& conns_;
  const VmPresence presence_;
  Mutex mu_;
  // Per VM (port index): the devices whose log is on, and whether the
  // drain under way is this migration's (not the operator's).
  std::set<std::pair<uint32_t, uint64_t>> logging_ GUARDED_BY(mu_);
  std::set<uint32_t> drained_ GUARDED_BY(mu_);
  // VMs not published until a device of theirs starts: those that left at
  // a switchover, and `incoming` ones (PortConfig) not arrived yet.
  std::set<uint32_t> left_ GUARDED_BY(mu_);
  std::set<uint32_t> arrived_ GUARDED_BY(mu_);
  // Worker thread only.
  std::unordered_set<const vhost::BackendDevice*> seen_;
  std::unordered_set<const vhost::BackendDevice*> to_tell_;
  MigrationCounters& counters_;
};

}  // namespace vsocket::backend
