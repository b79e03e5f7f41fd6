// The data-path thread: serves every attached guest device's virtqueues.
// Busy-polls (or, with nap_us, naps) while there is traffic, then
// re-enables notifications and sleeps in epoll on the devices' kick
// eventfds (never spins while idle).
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "host-backend/conn/request_result.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {

// What the worker does with a device's queues. Runs on the worker thread.
class DeviceService {
 public:
  virtual ~DeviceService() = default;
  virtual void OnAttach(vhost::BackendDevice& device) {}
  virtual void OnDetach(vhost::BackendDevice& device) {}
  // The vhost thread (not the worker's): the device's dirty log went on or
  // off (a live migration; off with device.stopping(): the device stopped
  // with it on). The worker is woken after.
  virtual void OnDirtyLog(vhost::BackendDevice& device, bool logging) {}
  // The proof thread (not the worker's): a direct pair's memory for a
  // connection of `device` (decision 97).
  virtual Status FetchDirect(const vhost::BackendDevice* device, uint64_t token, vhost::DirectGrant* out) {
    return Status(Code::kNotFound, "no direct pairs here");
  }
  // Handles one chain from the request queue (queue 0). Returns the number
  // of bytes written into the chain's writable part. A request the guest
  // must see taken before it acts (a FENCE) calls taker.TakeFirst(), which
  // returns the chain and publishes it; the return value is then ignored.
  virtual uint32_t HandleRequest(vhost::BackendDevice& device, const vhost::DescChain& chain,
                                 RequestTaker& taker) = 0;
  // Once per worker pass, before devices are served: work that spans
  // devices (moving bytes between guests). True if anything was done.
  virtual bool Poll() { return false; }
  // Per device and pass, after its requests: fill its other queues (events).
  // The worker publishes and notifies. True if anything was done.
  virtual bool Pump(vhost::BackendDevice& device) { return false; }
  // Whether the worker must be woken when the guest adds buffers to queue q
  // (the event queue only matters while events wait for buffers; otherwise
  // its always-available buffers would keep the worker from sleeping).
  virtual bool NeedsKick(vhost::BackendDevice& device, size_t q) { return true; }
  // Right before the worker sleeps: re-enable whatever stands in for kicks
  // (connections' doorbells). True if work turned up meanwhile (then it
  // does not sleep).
  virtual bool BeforeSleep() { return false; }
  // The longest the worker may sleep with nothing to do (ms; -1: until
  // woken): a timer of the service's that falls due.
  virtual int SleepTimeoutMs() { return -1; }
  // Bytes moved between rings so far (a running total): a pass that moved a
  // quarter ring or more is followed by polling, not a nap (nap_us).
  virtual uint64_t BytesMoved() const { return 0; }
};

struct WorkerOptions {
  // How long to keep polling after the last piece of work before sleeping.
  // 0: sleep as soon as idle (lowest CPU, highest latency).
  int poll_us = 50;
  // Up to this much, adapted to how soon work usually comes back after an
  // idle moment (base/adaptive_poll.h); <= poll_us: fixed poll_us.
  int poll_max_us = 400;
  // Chains taken from one queue per pass, so one busy guest cannot starve
  // the others.
  int batch = 64;
  // > 0: between passes, while it would poll, the worker sleeps this long
  // instead of spinning, the guests' kicks still off (decision 67): where
  // it shares its CPUs with the guests, a spin takes the CPU they need,
  // and a kick per write costs them a system call each.
  int nap_us = 0;
};

struct WorkerCounters {
  std::atomic<uint64_t> sleeps{0};
  std::atomic<uint64_t> wakeups{0};
  std::atomic<uint64_t> naps{0};
  std::atomic<uint64_t> nap_kicks{0};  // naps a guest's kick (or another event) ended early
  std::atomic<uint64_t> broken_devices{0};
};

class Worker : public vhost::DeviceListener {
 public:
  Worker(DeviceService* service, WorkerOptions options);
  ~Worker() override;

  Status Start();
  void Stop();
  // Also wake up when `fd` is readable (e.g. the peering epoll); call before
  // Start(). The service's Poll() does the work.
  void AddWakeFd(int fd) { extra_fds_.push_back(fd); }
  // Any thread: the worker makes a pass soon (it may be asleep), in which
  // the service's Poll() sees what the caller asked for.
  void Wake();

  void Attach(std::shared_ptr<vhost::BackendDevice> device) override;
  void Detach(vhost::BackendDevice* device) override;
  void MigrationChanged(vhost::BackendDevice* device, bool logging) override;
  Status FetchDirect(vhost::BackendDevice* device, uint64_t token, vhost::DirectGrant* out) override {
    return service_->FetchDirect(device, token, out);
  }

  const WorkerCounters& counters() const { return counters_; }

 private:
  enum class OpKind { kAttach, kDetach };
  struct Op {
    OpKind kind;
    std::shared_ptr<vhost::BackendDevice> device;  // kAttach
    vhost::BackendDevice* raw;                     // kDetach
    uint64_t seq;
  };
  struct Active {
    std::shared_ptr<vhost::BackendDevice> device;
    std::vector<bool> call_pending;  // per queue: notify retry owed
  };

  void Run();
  // What a wait on epoll_ returned: reads the wake and kick eventfds.
  void HandleEvents(const epoll_event* events, int n);
  bool ProcessMailbox() EXCLUDES(mu_);
  uint64_t Post(Op op) EXCLUDES(mu_);  // returns the op's sequence number
  // Serves one device; true if any chain was processed.
  bool Serve(Active& a);
  void Untrack(size_t index);
  bool EnableAllNotify();
  void DisableAllNotify();
  void DrainKicks();

  DeviceService* const service_;
  const WorkerOptions options_;
  UniqueFd epoll_;
  UniqueFd wake_;
  std::thread thread_;
  std::atomic<bool> stop_{false};

  // The mailbox: ops posted by the vhost thread, applied by the worker.
  Mutex mu_;
  CondVar done_cv_;  // done_seq_ moved, or running_ went false
  std::vector<Op> ops_ GUARDED_BY(mu_);
  uint64_t next_seq_ GUARDED_BY(mu_) = 1;
  uint64_t done_seq_ GUARDED_BY(mu_) = 0;
  bool running_ GUARDED_BY(mu_) = false;  // the thread runs Run() (set by Start, cleared as it returns)

  std::vector<Active> active_;  // worker thread only
  std::vector<int> extra_fds_;
  WorkerCounters counters_;
};

}  // namespace vsocket::backend
