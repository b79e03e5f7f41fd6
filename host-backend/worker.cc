#include "host-backend/worker.h"

#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "base/adaptive_poll.h"
#include "base/clock.h"
#include "base/log.h"

namespace vsocket::backend {
namespace {

constexpr uint64_t kWakeTag = ~uint64_t{0};
constexpr uint64_t kExtraTag = ~uint64_t{0} - 1;  // the service polls it itself

}  // namespace

Worker::Worker(DeviceService* service, WorkerOptions options) : service_(service), options_(options) {}

Worker::~Worker() { Stop(); }

Status Worker::Start() {
  epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  wake_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!epoll_ || !wake_) return Status::FromErrno("worker epoll/eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeTag;
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev) != 0) return Status::FromErrno("epoll_ctl wake");
  for (int fd : extra_fds_) {
    ev.data.u64 = kExtraTag;
    if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return Status::FromErrno("epoll_ctl extra fd");
  }
  {
    MutexLock lock(mu_);
    running_ = true;
  }
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void Worker::Stop() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  uint64_t one = 1;
  (void)!write(wake_.get(), &one, sizeof(one));
  thread_.join();
}

void Worker::Wake() {
  uint64_t one = 1;
  if (wake_) (void)!write(wake_.get(), &one, sizeof(one));
}

uint64_t Worker::Post(Op op) {
  uint64_t seq;
  {
    MutexLock lock(mu_);
    seq = op.seq = next_seq_++;
    ops_.push_back(std::move(op));
  }
  uint64_t one = 1;
  (void)!write(wake_.get(), &one, sizeof(one));
  return seq;
}

void Worker::Attach(std::shared_ptr<vhost::BackendDevice> device) {
  Post(Op{OpKind::kAttach, std::move(device), nullptr, 0});
}

void Worker::Detach(vhost::BackendDevice* device) {
  uint64_t seq = Post(Op{OpKind::kDetach, nullptr, device, 0});
  // Wait until the worker has passed this op: from then on it no longer
  // touches the device's memory. The worker never blocks on rte_vhost, so
  // this cannot deadlock with the vhost thread's queue locks.
  UniqueLock lock(mu_);
  // Not merely until stop_ is set: the worker may still be in its last pass
  // over this device (a guest leaving while the daemon shuts down; rte_vhost
  // unmaps its memory as soon as we return).
  while (done_seq_ < seq && running_) done_cv_.Wait(lock);
}

void Worker::MigrationChanged(vhost::BackendDevice* device, bool logging) {
  VS_LOG(kInfo, "device %lu: live migration %s", static_cast<unsigned long>(device->id()),
         logging ? "started" : device->stopping() ? "device stopped while logging" : "ended");
  service_->OnDirtyLog(*device, logging);  // (decision 093: the VM's drain, or its lifting)
  Wake();
}

bool Worker::ProcessMailbox() {
  std::vector<Op> ops;
  {
    MutexLock lock(mu_);
    ops.swap(ops_);
  }
  if (ops.empty()) return false;
  uint64_t last = 0;
  for (Op& op : ops) {
    last = op.seq;
    if (op.kind == OpKind::kAttach) {
      // A call owed when it was detached is owed still (decision 126): a
      // message that detaches a device holds its queues' locks first, so a
      // call the worker makes meanwhile finds them locked (Notify: EAGAIN),
      // and the detach dropped that debt with the entry (a guest asleep for
      // it slept for good). Nor can a call made around a stop be trusted to
      // have reached a guest whose frontend replaced the call fd since. So
      // every queue is called once at each attach: a spurious interrupt
      // costs the guest one look.
      Active a{op.device, std::vector<bool>(op.device->num_queues(), true)};
      for (size_t q = 0; q < op.device->num_queues(); ++q) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = op.device->id();
        if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, op.device->kick_fd(q), &ev) != 0)
          op.device->MarkBroken("kick fd of queue " + std::to_string(q) + " is not pollable");
      }
      service_->OnAttach(*op.device);
      active_.push_back(std::move(a));
      // Buffers may have been queued before we started listening.
      for (size_t q = 0; q < op.device->num_queues(); ++q) op.device->queue(q).DisableNotify();
    } else {
      bool found = false;
      for (size_t i = 0; i < active_.size(); ++i) {
        if (active_[i].device.get() == op.raw) {
          // The guest is gone, its memory still mapped until we answer:
          // act on what it posted last (a TX_TAIL right before it died
          // carries bytes the peer must still get) before orphaning.
          if (!active_[i].device->broken()) Serve(active_[i]);
          Untrack(i);
          found = true;
          break;
        }
      }
      // Already untracked (paused around a message, or broken) but now gone
      // for good: its connections must still be released.
      if (!found && op.raw->stopping()) service_->OnDetach(*op.raw);
    }
  }
  {
    MutexLock lock(mu_);
    done_seq_ = last;
  }
  done_cv_.NotifyAll();
  return true;
}

void Worker::Untrack(size_t index) {
  Active& a = active_[index];
  for (size_t q = 0; q < a.device->num_queues(); ++q)
    epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, a.device->kick_fd(q), nullptr);
  service_->OnDetach(*a.device);
  active_.erase(active_.begin() + static_cast<ptrdiff_t>(index));
}

bool Worker::Serve(Active& a) {
  vhost::BackendDevice& dev = *a.device;
  if (dev.broken()) return false;
  // Not a byte of its memory until the VM's agent has limited it (decision
  // 130): its requests wait in the ring (the agent kicks it after).
  if (dev.awaiting_limit()) return false;
  bool worked = false;
  vhost::VirtqueueDevice& rq = dev.queue(0);
  for (int n = 0; n < options_.batch; ++n) {
    vhost::DescChain chain;
    vhost::PopResult r = rq.Pop(&chain);
    if (r == vhost::PopResult::kEmpty) break;
    if (r == vhost::PopResult::kBroken) {
      dev.MarkBroken(std::string("request queue: ") + rq.broken_reason());
      counters_.broken_devices.fetch_add(1);
      return worked;
    }
    if (chain.readable_bytes == 0) {
      // Every vSocket request has bytes to read; a chain that is all
      // device-writable is a network driver's receive buffer. Answering it
      // would write into a foreign driver's packet (the guest kernel's
      // virtio_net logged "bad gso"): stop the device without touching it.
      dev.MarkBroken(
          "request queue: a buffer with nothing to read (a receive buffer: a foreign driver, such as the guest "
          "kernel's virtio_net, owns this device; bind vsocket-guestd to it, docs/vm-mode.md)");
      counters_.broken_devices.fetch_add(1);
      return worked;
    }
    // A FENCE is returned and published before it acts (decision 124).
    struct Taker final : RequestTaker {
      Taker(vhost::VirtqueueDevice& q, uint16_t h, Active& act) : rq(q), head(h), a(act) {}
      void TakeFirst() override {
        rq.Push(head, 0);
        if (rq.PublishUsed()) a.call_pending[0] = true;
      }
      vhost::VirtqueueDevice& rq;
      uint16_t head;
      Active& a;
    } taker(rq, chain.head, a);
    uint32_t written = service_->HandleRequest(dev, chain, taker);
    if (!taker.taken()) rq.Push(chain.head, written);
    dev.counters().requests.fetch_add(1, std::memory_order_relaxed);
    worked = true;
  }
  worked |= service_->Pump(dev);
  for (size_t q = 0; q < dev.num_queues(); ++q)
    if (dev.queue(q).PublishUsed()) a.call_pending[q] = true;
  for (size_t q = 0; q < a.call_pending.size(); ++q)
    if (a.call_pending[q] && dev.Notify(static_cast<uint16_t>(q))) a.call_pending[q] = false;
  return worked;
}

bool Worker::EnableAllNotify() {
  bool pending = false;
  for (Active& a : active_) {
    if (a.device->broken()) continue;
    // A device waiting for its memory limit (decision 130) is not served:
    // what waits in its rings is no work of ours until then (else we would
    // spin on it). It still asks for kicks: one after its limit wakes us.
    for (size_t q = 0; q < a.device->num_queues(); ++q) {
      if (a.device->awaiting_limit()) {
        (void)a.device->queue(q).EnableNotify();
      } else if (service_->NeedsKick(*a.device, q)) {
        pending |= a.device->queue(q).EnableNotify();
      } else {
        a.device->queue(q).DisableNotify();
      }
    }
  }
  return pending;
}

void Worker::DisableAllNotify() {
  for (Active& a : active_)
    if (!a.device->broken())
      for (size_t q = 0; q < a.device->num_queues(); ++q) a.device->queue(q).DisableNotify();
}

void Worker::HandleEvents(const epoll_event* events, int n) {
  for (int i = 0; i < n; ++i) {
    uint64_t v;
    if (events[i].data.u64 == kWakeTag) {
      (void)!read(wake_.get(), &v, sizeof(v));
      continue;
    }
    if (events[i].data.u64 == kExtraTag) continue;
    for (Active& a : active_) {
      if (a.device->id() != events[i].data.u64) continue;
      a.device->counters().wakeups.fetch_add(1, std::memory_order_relaxed);
      for (size_t q = 0; q < a.device->num_queues(); ++q) (void)!read(a.device->kick_fd(q), &v, sizeof(v));
    }
  }
}

void Worker::Run() {
  if (options_.nap_us > 0) prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);  // naps as long as asked, not +50 us
  int64_t last_work = MonotonicNs();
  int64_t idle_since = 0;  // the last work before the current idle stretch
  AdaptivePoll adapt(int64_t{options_.poll_us} * 1000, int64_t{options_.poll_max_us} * 1000);
  epoll_event events[64];
  uint32_t idle_spins = 0;
  // Bytes the last working pass moved: a quarter of a (default) ring or
  // more, and the rings, not the CPU, limit the stream: poll rather than
  // nap, or the rings would wait full for the next pass.
  constexpr uint64_t kPollAfterPassBytes = 64 * 1024;
  uint64_t moved_total = service_->BytesMoved(), last_pass_bytes = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    bool worked = ProcessMailbox();
    worked |= service_->Poll();
    bool calls_owed = false;
    for (size_t i = 0; i < active_.size();) {
      worked |= Serve(active_[i]);
      if (active_[i].device->broken()) {
        // Stop listening to a broken guest: its kicks must not cost us CPU.
        Untrack(i);
        continue;
      }
      for (bool p : active_[i].call_pending) calls_owed |= p;
      ++i;
    }
    int64_t now = MonotonicNs();
    if (worked) {
      uint64_t total = service_->BytesMoved();
      last_pass_bytes = total - moved_total;
      moved_total = total;
      if (idle_since != 0) adapt.Record(now - idle_since);  // how long the lull lasted
      idle_since = 0;
      last_work = now;
      idle_spins = 0;
      continue;
    }
    if (idle_since == 0) idle_since = last_work;
    if (now - last_work < adapt.budget_ns()) {
      if (options_.nap_us > 0 && last_pass_bytes < kPollAfterPassBytes) {
        // A guest about to wait for what we have not moved yet kicks us
        // out of the nap (proto::kFeatureNaps).
        timespec ts{options_.nap_us / 1000000, (options_.nap_us % 1000000) * 1000L};
        int n = epoll_pwait2(epoll_.get(), events, 64, &ts, nullptr);
        HandleEvents(events, n);
        counters_.naps.fetch_add(1, std::memory_order_relaxed);
        if (n > 0) counters_.nap_kicks.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      SpinStep(idle_spins++);
      continue;
    }
    // Idle: ask for kicks, re-check (a buffer may have raced in), sleep.
    if (service_->BeforeSleep()) {
      last_work = MonotonicNs();
      continue;
    }
    if (EnableAllNotify()) {
      DisableAllNotify();
      continue;
    }
    counters_.sleeps.fetch_add(1, std::memory_order_relaxed);
    // A call the vhost library could not take yet is retried soon.
    int n = epoll_wait(epoll_.get(), events, 64, calls_owed ? 1 : service_->SleepTimeoutMs());
    HandleEvents(events, n);
    counters_.wakeups.fetch_add(1, std::memory_order_relaxed);
    DisableAllNotify();
    last_work = MonotonicNs();
    idle_spins = 0;
  }
  // Release anyone waiting in Detach(): no device is touched any more.
  MutexLock lock(mu_);
  running_ = false;
  done_seq_ = next_seq_;
  done_cv_.NotifyAll();
}

}  // namespace vsocket::backend
