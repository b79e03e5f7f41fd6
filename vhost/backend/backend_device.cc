#include "vhost/backend/backend_device.h"

#include <algorithm>

#include <fcntl.h>
#include <rte_vhost.h>
#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include "base/log.h"
#include "proto/virtio_ring.h"
#include "vhost/backend/sigbus_guard.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::vhost {
namespace {

bool Aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// The file behind a guest memory region must cover it and be unable to
// shrink: an access beyond its end would be a SIGBUS (sigbus_guard.h).
Status CheckRegionFile(const rte_vhost_mem_region& r, uint32_t i) {
  std::string name = "memory region " + std::to_string(i);
  struct stat st{};
  if (r.fd < 0 || fstat(r.fd, &st) != 0) return Status(Code::kFailedPrecondition, name + " has no file");
  uint64_t offset = r.host_user_addr - reinterpret_cast<uint64_t>(r.mmap_addr);
  if (static_cast<uint64_t>(st.st_size) < offset + r.size)
    return Status(Code::kFailedPrecondition, name + ": its file has " + std::to_string(st.st_size) +
                                                 " B, the region needs " + std::to_string(offset + r.size) + " B");
  int seals = fcntl(r.fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK))
    return Status(Code::kFailedPrecondition,
                  name + ": its file is not sealed against shrinking (F_SEAL_SHRINK; a memfd, e.g. QEMU's "
                         "memory-backend-memfd)");
  if (SigbusFaultWithin(r.mmap_addr, r.mmap_size))
    return Status(Code::kFailedPrecondition, name + ": an access beyond its file's end was absorbed (SIGBUS)");
  return Status::Ok();
}

// rte_vhost marks the range in the frontend's log (SET_LOG_BASE, which it
// handles itself) if LOG_ALL is negotiated and a log is mapped.
void LogToFrontend(int vid, uint64_t gpa, uint64_t len) { rte_vhost_log_write(vid, gpa, len); }
// VSOCKET_DEBUG_NO_DIRTY_LOG=1: count what would be marked, mark nothing.
// Only for the dirty-log completeness test's negative control
// (tests/vm/migrate.sh --no-dirty-log): a migration then copies stale pages.
void CountOnly(int, uint64_t, uint64_t) {}

DirtyLog::Sink LogSink() {
  static const DirtyLog::Sink sink = [] {
    const char* v = std::getenv("VSOCKET_DEBUG_NO_DIRTY_LOG");
    if (v == nullptr || std::string(v) != "1") return &LogToFrontend;
    VS_LOG(kWarn, "VSOCKET_DEBUG_NO_DIRTY_LOG=1: writes into guest memory are NOT logged during live migration "
                  "(a migrated VM gets stale memory; tests only)");
    return &CountOnly;
  }();
  return sink;
}

}  // namespace

BackendDevice::BackendDevice(int vid, uint64_t id, const PortConfig* port, DirtyLogCounters* log_counters,
                             bool authority)
    : vid_(vid),
      id_(id),
      port_(port),
      authority_(authority),
      needs_limit_(port->proofs_by_agent && !authority),
      log_(LogSink(), vid, log_counters) {}

Status BackendDevice::Load() {
  if (rte_vhost_get_negotiated_features(vid_, &features_) != 0)
    return Status(Code::kFailedPrecondition, "no negotiated features");
  if (!(features_ & proto::kFeatureVersion1))
    return Status(Code::kFailedPrecondition, "frontend did not negotiate VERSION_1");
  event_idx_ = (features_ & proto::kFeatureEventIdx) != 0;

  uint16_t nr = rte_vhost_get_vring_num(vid_);
  if (nr != port_->num_queues)
    return Status(Code::kFailedPrecondition,
                  "frontend set up " + std::to_string(nr) + " vrings, device has " + std::to_string(port_->num_queues));
  rte_vhost_memory* mem = nullptr;
  if (rte_vhost_get_mem_table(vid_, &mem) != 0 || mem == nullptr)
    return Status(Code::kFailedPrecondition, "no memory table");
  std::vector<MemRegion> regions;
  std::vector<FileId> files;
  for (uint32_t i = 0; i < mem->nregions; ++i) {
    const rte_vhost_mem_region& r = mem->regions[i];
    if (Status st = CheckRegionFile(r, i); !st.ok()) {
      std::free(mem);
      return st;
    }
    regions.push_back({r.guest_phys_addr, r.size, reinterpret_cast<uint8_t*>(r.host_user_addr)});
    if (auto f = FileIdOf(r.fd); f.ok()) files.push_back(f.value());
  }
  std::free(mem);
  {
    MutexLock lock(files_mu_);
    region_files_ = std::move(files);
  }
  auto memory = GuestMemory::Create(std::move(regions));
  if (!memory.ok()) return memory.status();
  MutexLock limit_lock(limit_mu_);  // (memory_ and its window change together)
  memory_ = std::move(memory).value();
  memory_.set_log(&log_);
  // Decision 130: a limited device's rings too must lie inside its limit
  // (the checks below see the window).
  memory_.set_window(limit_.get());
  // (Load runs after every message that changes features, SET_FEATURES
  // with LOG_ALL included, with the data path detached.)
  log_.Set((features_ & proto::kFeatureLogAll) != 0);

  queues_.clear();
  kick_fds_.clear();
  call_fds_.clear();
  for (uint16_t q = 0; q < nr; ++q) {
    rte_vhost_vring vr{};
    if (rte_vhost_get_vhost_vring(vid_, q, &vr) != 0)
      return Status(Code::kFailedPrecondition, "vring " + std::to_string(q) + " unavailable");
    if (!proto::IsValidQueueSize(vr.size))
      return Status(Code::kOutOfRange, "vring " + std::to_string(q) + " has invalid size");
    // The library translated these, but not always completely (a ring cut
    // off at a region end can stay mapped): check every byte ourselves.
    if (!vr.desc || !vr.avail || !vr.used || !memory_.ContainsLocal(vr.desc, proto::DescTableBytes(vr.size)) ||
        !memory_.ContainsLocal(vr.avail, proto::AvailRingBytes(vr.size)) ||
        !memory_.ContainsLocal(vr.used, proto::UsedRingBytes(vr.size)) || !Aligned(vr.desc, proto::kDescAlign) ||
        !Aligned(vr.avail, proto::kAvailAlign) || !Aligned(vr.used, proto::kUsedAlign))
      return Status(Code::kOutOfRange, "vring " + std::to_string(q) + " lies outside guest memory");
    // Sleeping needs kicks: a frontend without a kick fd would force the
    // backend to poll forever, which this 2-core design never does.
    if (vr.kickfd < 0) return Status(Code::kFailedPrecondition, "vring " + std::to_string(q) + " has no kick fd");
    int kick = fcntl(vr.kickfd, F_DUPFD_CLOEXEC, 0);
    if (kick < 0) return Status::FromErrno("dup kick fd");
    kick_fds_.emplace_back(kick);
    // The data path drains kicks with read(): a blocking fd from a hostile
    // frontend must not be able to stall it.
    int fl = fcntl(kick, F_GETFL);
    if (fl < 0 || fcntl(kick, F_SETFL, fl | O_NONBLOCK) != 0) return Status::FromErrno("set kick fd non-blocking");
    // The guest's call eventfd (our dup; -1 if it gave none): a direct
    // peer wakes this process's sleepers through it (decision 97).
    call_fds_.emplace_back(vr.callfd >= 0 ? fcntl(vr.callfd, F_DUPFD_CLOEXEC, 0) : -1);
    // None: nothing we publish on this queue wakes the guest. QEMU gives
    // none for a function whose INTx is disabled as its device starts
    // (7.2.19 and later; decision 128).
    if (vr.callfd < 0)
      VS_LOG(kWarn, "device %lu (vm %s, vid %d): queue %u started without a call eventfd (its frontend gave none): "
             "the guest is not woken by it%s", static_cast<unsigned long>(id_), port_->vm_name.c_str(), vid_, q,
             logging() ? "" : "; flagged in its used ring for the guest's agent to restart the device");
    uint16_t last_avail = 0, last_used = 0;
    rte_vhost_get_vring_base(vid_, q, &last_avail, &last_used);
    queues_.emplace_back(SplitRing(vr.desc, vr.avail, vr.used, vr.size), &memory_, event_idx_, last_avail, last_used);
    // Said to the guest in the ring itself (decision 129): its agent looks
    // every 200 ms and restarts the device's queues (DRIVER_OK off and on,
    // INTx enabled), which we see as a pause and resume. Not while the log
    // is on: a stop then would read as a live migration's switchover.
    queues_.back().SetUsedFlag(proto::kUsedFlagNoCall, vr.callfd < 0 && !logging());
    // (Inside guest memory: checked above.)
    if (q == 0) request_ring_gpa_.store(memory_.GpaOf(vr.desc), std::memory_order_release);
  }
  // One that must be limited and is not yet reaches nothing (its rings were
  // checked against the whole memory above), and says so in its request
  // ring (decision 130): the agent limits a device it finds so on its next
  // look (a device new to this vsocketd: a live migration's arrival, our
  // restart).
  if (awaiting_limit_locked()) memory_.set_window(&MemWindow::Nothing());
  if (!queues_.empty()) queues_[0].SetUsedFlag(proto::kUsedFlagNeedsLimit, awaiting_limit_locked());
  return Status::Ok();
}

Status BackendDevice::LimitMemory(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  auto w = MemWindow::Create(ranges);
  if (!w.ok()) return Status(Code::kOutOfRange, w.status().message());
  MutexLock lock(limit_mu_);
  if (limit_) return Status(Code::kFailedPrecondition, "already limited");
  // Each range inside one of the frontend's regions (memory_'s translation
  // without its window: it reaches nothing until now).
  GuestMemory whole = memory_;
  whole.set_window(nullptr);
  for (const auto& [start, end] : w->ranges())
    if (whole.Translate(start, end - start) == nullptr) return Status(Code::kOutOfRange, "a range outside the VM's memory");
  uint64_t ring = request_ring_gpa();
  if (ring == 0 || !w->Contains(ring, proto::DescTableBytes(queues_.empty() ? 1 : queues_[0].ring().size())))
    return Status(Code::kOutOfRange, "its request ring lies outside the ranges");
  limit_ = std::make_unique<const MemWindow>(std::move(w).value());
  memory_.set_window(limit_.get());
  limited_.store(true, std::memory_order_release);
  if (!queues_.empty()) queues_[0].SetUsedFlag(proto::kUsedFlagNeedsLimit, false);
  return Status::Ok();
}

void BackendDevice::SyncBase() {
  for (uint16_t q = 0; q < queues_.size(); ++q)
    rte_vhost_set_vring_base(vid_, q, queues_[q].last_avail_idx(), queues_[q].used_idx());
}

std::vector<BackendDevice::QueueState> BackendDevice::QueueStates() const {
  std::vector<QueueState> out;
  for (const VirtqueueDevice& q : queues_) {
    const SplitRing& ring = q.ring();
    out.push_back({memory_.GpaOf(ring.desc()), memory_.GpaOf(ring.avail_base()), memory_.GpaOf(ring.used_base()),
                   ring.size(), q.last_avail_idx(), q.used_idx()});
  }
  return out;
}

int BackendDevice::VringCallFd(uint16_t q) const {
  rte_vhost_vring vr{};
  if (rte_vhost_get_vhost_vring(vid_, q, &vr) != 0) return -1;
  return vr.callfd;
}

bool BackendDevice::Notify(uint16_t q) {
  // rte_vhost's own event-idx check reads its copy of the used index: keep
  // it current. Non-blocking: the vhost thread may hold the queue lock while
  // it waits for us to detach (a blocking call here could deadlock).
  rte_vhost_set_vring_base(vid_, q, queues_[q].last_avail_idx(), queues_[q].used_idx());
  int r = rte_vhost_vring_call_nonblock(vid_, q);
  if (r == -EAGAIN) return false;
  counters_.notifications.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void BackendDevice::MarkBroken(std::string reason) {
  if (broken()) return;
  broken_reason_ = std::move(reason);
  broken_.store(true, std::memory_order_release);
  VS_LOG(kWarn, "device %lu (vm %s, vid %d) broken: %s", static_cast<unsigned long>(id_), port_->vm_name.c_str(), vid_,
         broken_reason_.c_str());
}

std::string BackendDevice::broken_reason() const { return broken() ? broken_reason_ : ""; }

bool BackendDevice::HasRegionFile(const FileId& f) const {
  MutexLock lock(files_mu_);
  return std::find(region_files_.begin(), region_files_.end(), f) != region_files_.end();
}

}  // namespace vsocket::vhost
