// Guest-physical -> local address translation for memory another party
// controls. Every translation is bounds-checked: [gpa, gpa+len) must lie
// entirely inside one region, with no arithmetic overflow. This is the only
// way the device side turns a guest-supplied address into a pointer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/status.h"
#include "vhost/region/dirty_log.h"

namespace vsocket::vhost {

struct MemRegion {
  uint64_t gpa = 0;          // guest-physical start
  uint64_t size = 0;         // bytes
  uint8_t* local = nullptr;  // where the region is mapped in this process
};

class GuestMemory {
 public:
  GuestMemory() = default;
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
};

}  // namespace vsocket::vhost
