// One guest (vhost-user connection) as the data path sees it: its memory
// table and validated virtqueues, loaded from rte_vhost's state. Everything
// here is read from a frontend we do not trust and is checked on load.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <memory>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "vhost/backend/socket_proof.h"
#include "vhost/region/guest_memory.h"
#include "vhost/ring/virtqueue_device.h"

namespace vsocket::vhost {

struct PortConfig;

struct DeviceCounters {
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> bad_messages{0};
  std::atomic<uint64_t> notifications{0};
  std::atomic<uint64_t> wakeups{0};
};

class BackendDevice {
 public:
  // `log_counters`: where the dirty log counts what it marks (may be null).
  BackendDevice(int vid, uint64_t id, const PortConfig* port, DirtyLogCounters* log_counters = nullptr,
                bool authority = false);

  // (Re)reads memory table, vrings and kick fds from rte_vhost and validates
  // them: exactly port->num_queues vrings, every ring inside guest memory,
  // sizes sane. Queue indices resume where rte_vhost says.
  Status Load();
  // Writes our ring indices back into rte_vhost (for GET_VRING_BASE and for
  // its event-idx call suppression).
  void SyncBase();
  // Where each queue's rings are (guest-physical) and how far they went,
  // as of the last Load and since: a device stopped and started again with
  // equal states was resumed (a VM pause), not reset (decision 123).
  struct QueueState {
    uint64_t desc = 0, avail = 0, used = 0;
    uint16_t size = 0, last_avail = 0, used_idx = 0;
    bool operator==(const QueueState&) const = default;
  };
  std::vector<QueueState> QueueStates() const;
  // Signals the guest on queue q if it asked for it. False if the vhost
  // library is busy reconfiguring the queue: retry later.
  bool Notify(uint16_t q);

  int vid() const { return vid_; }
  uint64_t id() const { return id_; }
  const PortConfig* port() const { return port_; }
  // Attached on its port's agent socket (PATH.agent): the VM's socket-proof
  // authority, which may VOUCH for its other devices (decision 100).
  bool authority() const { return authority_; }
  // Guest-physical address of queue 0's descriptor table, as of the last
  // Load (what the VM's agent names this device by in a VOUCH).
  uint64_t request_ring_gpa() const { return request_ring_gpa_.load(std::memory_order_acquire); }
  size_t num_queues() const { return queues_.size(); }
  VirtqueueDevice& queue(size_t i) { return queues_[i]; }
  int kick_fd(size_t i) const { return kick_fds_[i].get(); }
  // The guest's call eventfd of queue i (-1: none), as of the last Load.
  int call_fd(size_t i) const { return i < call_fds_.size() ? call_fds_[i].get() : -1; }
  // rte_vhost's call eventfd of queue q as it is now (-1: none: a call
  // then wakes nobody), for `vsocketctl stats`.
  int VringCallFd(uint16_t q) const;
  bool event_idx() const { return event_idx_; }
  uint64_t features() const { return features_; }

  const GuestMemory& memory() const { return memory_; }
  // The frontend's dirty log (live migration): on while VHOST_F_LOG_ALL is
  // negotiated, as of the last Load(). memory().MarkWritten marks in it.
  bool logging() const { return log_.on(); }
  // Tests: guest memory without rte_vhost behind it (instead of Load(); the
  // device has no queues then).
  void SetMemoryForTesting(GuestMemory memory) { memory_ = std::move(memory); }
  // Tests: the dirty log on or off, as a Load after SET_FEATURES with or
  // without VHOST_F_LOG_ALL leaves it (what logging() says).
  void SetLoggingForTesting(bool on) { log_.Set(on); }

  // Set when the guest is gone for good (not just paused for a
  // reconfiguration): its connections must be released.
  void set_stopping() { stopping_.store(true, std::memory_order_release); }
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }
  // Stopped by its frontend and kept (decision 123), then the frontend went
  // away: the VM went with its processes (migrated while paused, or
  // killed). Its connections leave with it as at a live migration's
  // switchover (decision 106), not as at a process exit.
  void set_left_with_vm() { left_with_vm_.store(true, std::memory_order_release); }
  bool left_with_vm() const { return left_with_vm_.load(std::memory_order_acquire); }

  // Latches the device broken (guest violated the ring protocol).
  void MarkBroken(std::string reason);
  bool broken() const { return broken_.load(std::memory_order_acquire); }
  std::string broken_reason() const;

  // The files behind its memory regions (as of the last Load): a proof
  // channel that passes one of them belongs to this device's process.
  // Thread-safe.
  bool HasRegionFile(const FileId& f) const EXCLUDES(files_mu_);
  // 4-tuples this device's process proved it holds (socket_proof.h).
  ProvenSockets& proofs() { return proofs_; }

  // Decision 130: on a port whose sockets the VM's agent proves, a device
  // other than the agent's own reaches no guest memory until the agent
  // limits it (LIMIT_MEMORY) to the memory it gave that function, and then
  // only that: every descriptor, ring and registered data ring must lie
  // inside `ranges` ([gpa, gpa + len)). Once per device (kept across a
  // pause and a reload); kFailedPrecondition if already limited,
  // kOutOfRange if a range is not guest memory or the request ring lies
  // outside them. Thread-safe.
  Status LimitMemory(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) EXCLUDES(limit_mu_);
  bool limited() const { return limited_.load(std::memory_order_acquire); }
  // The agent must limit it before it reaches any memory (above).
  bool needs_limit() const { return needs_limit_; }
  // Not served yet: it must be limited and is not (the worker's check).
  bool awaiting_limit() const { return needs_limit_ && !limited(); }

  DeviceCounters& counters() { return counters_; }
  const DeviceCounters& counters() const { return counters_; }

 private:
  const int vid_;
  const uint64_t id_;
  const PortConfig* const port_;
  const bool authority_;
  const bool needs_limit_;  // its port's sockets proved by the VM's agent, and not the agent's own device
  std::atomic<uint64_t> request_ring_gpa_{0};
  uint64_t features_ = 0;
  bool event_idx_ = false;
  DirtyLog log_;  // before memory_, which points at it
  GuestMemory memory_;
  std::vector<VirtqueueDevice> queues_;
  std::vector<UniqueFd> kick_fds_;  // our dups: immune to the library closing its fd
  std::vector<UniqueFd> call_fds_;  // likewise
  std::atomic<bool> broken_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> left_with_vm_{false};
  std::string broken_reason_;  // written once, before broken_ is set
  DeviceCounters counters_;
  // Taken after VhostBackend's lock (which asks HasRegionFile under it):
  // nothing is taken while it is held.
  mutable Mutex files_mu_;
  std::vector<FileId> region_files_ GUARDED_BY(files_mu_);
  ProvenSockets proofs_;
  // LimitMemory's window (never replaced once set: memory_ points at it).
  mutable Mutex limit_mu_;
  std::unique_ptr<const MemWindow> limit_ GUARDED_BY(limit_mu_);
  std::atomic<bool> limited_{false};  // limit_ is set (read without limit_mu_)
  bool awaiting_limit_locked() const REQUIRES(limit_mu_) { return needs_limit_ && !limit_; }
};

}  // namespace vsocket::vhost
