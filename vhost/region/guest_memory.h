// Guest-physical -> local address translation for memory another party
// controls. Every translation is bounds-checked: [gpa, gpa+len) must lie
// entirely inside one region, with no arithmetic overflow. This is the only
// way the device side turns a guest-supplied address into a pointer.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "base/status.h"
#include "vhost/region/dirty_log.h"

namespace vsocket::vhost {

struct MemRegion {
  uint64_t gpa = 0;          // guest-physical start
  uint64_t size = 0;         // bytes
  uint8_t* local = nullptr;  // where the region is mapped in this process
};

// The part of a frontend's memory one device may reach (decision 130: the
// pages a VM's agent gave that function): [gpa, gpa + len) ranges, sorted,
// not overlapping. Immutable once made.
class MemWindow {
 public:
  // Merges adjacent ranges; kInvalidArgument if any is empty, wraps or
  // overlaps another.
  static Result<MemWindow> Create(std::vector<std::pair<uint64_t, uint64_t>> ranges);
  // [gpa, gpa + len) lies inside one range (len 0: gpa inside or at its end).
  bool Contains(uint64_t gpa, uint64_t len) const;
  const std::vector<std::pair<uint64_t, uint64_t>>& ranges() const { return ranges_; }  // (start, end)
  // A window with nothing in it: every translation fails.
  static const MemWindow& Nothing();

 private:
  std::vector<std::pair<uint64_t, uint64_t>> ranges_;
};

class GuestMemory {
 public:
  GuestMemory() = default;
  GuestMemory(const GuestMemory& o) : regions_(o.regions_), log_(o.log_), window_(o.window()) {}
  GuestMemory& operator=(const GuestMemory& o) {
    regions_ = o.regions_;
    log_ = o.log_;
    window_.store(o.window(), std::memory_order_release);
    return *this;
  }
  // Regions may not overlap in guest-physical space; zero-sized or
  // overflowing regions are rejected.
  static Result<GuestMemory> Create(std::vector<MemRegion> regions);

  // Pointer to `len` bytes at `gpa`, or nullptr if any of it is outside the
  // guest's memory. len == 0 is valid iff gpa lies inside a region (or at its
  // very end).
  uint8_t* Translate(uint64_t gpa, uint64_t len) const;
  // Same check for a range given in this process's address space (used for
  // ring addresses that the vhost library already translated).
  bool ContainsLocal(const void* p, uint64_t len) const;
  // The guest-physical address of p (in this process's address space), or
  // 0 if p is in no region.
  uint64_t GpaOf(const void* p) const;

  const std::vector<MemRegion>& regions() const { return regions_; }
  // From now on Translate and ContainsLocal also require the range to lie
  // inside `w` (nullptr: the whole memory again). Safe while another thread
  // translates: a translation sees the window or not, never half of it.
  // `w` must outlive this object's use.
  void set_window(const MemWindow* w) { window_.store(w, std::memory_order_release); }
  const MemWindow* window() const { return window_.load(std::memory_order_acquire); }

  // Every write into this memory calls MarkWritten(p, len) with the range it
  // wrote (this process's address), after writing: during a live migration
  // the range goes into the frontend's dirty log (dirty_log.h), else this is
  // one branch. `log` must outlive this object.
  void set_log(const DirtyLog* log) { log_ = log; }
  bool logging() const { return log_->on(); }
  void MarkWritten(const void* p, uint64_t len) const {
    if (log_->on()) [[unlikely]]
      MarkWrittenSlow(p, len);
  }

 private:
  void MarkWrittenSlow(const void* p, uint64_t len) const;

  std::vector<MemRegion> regions_;
  const DirtyLog* log_ = &DirtyLog::Never();
  std::atomic<const MemWindow*> window_{nullptr};
};

}  // namespace vsocket::vhost
