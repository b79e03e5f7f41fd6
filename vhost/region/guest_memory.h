// Guest-physical -> local address translation for memory another party
// controls. Every translation is bounds-checked: [gpa, gpa+len) must lie
// entirely inside one region, with no arithmetic overflow. This is the only
// way the device side turns a guest-supplied address into a pointer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/status.h"

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

  const std::vector<MemRegion>& regions() const { return regions_; }

 private:
  std::vector<MemRegion> regions_;
};

}  // namespace vsocket::vhost
