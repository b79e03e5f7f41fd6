// A shared-memory region backed by a memfd, mapped MAP_SHARED, owned RAII.
// Huge pages are used when asked for and available (MFD_HUGETLB), with a
// silent fallback to normal pages. The fd is what vhost-user sends the
// backend in SET_MEM_TABLE; its size is sealed (F_SEAL_SHRINK, F_SEAL_GROW),
// which the backend requires: a file that could shrink under its mapping
// would let a guest crash the backend with SIGBUS.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"

namespace vsocket::vhost {

class ShmRegion {
 public:
  enum class Pages { kNormal, kHugeIfAvailable };
  // kUnsealed: only for tests that play a hostile frontend.
  enum class Seal { kSizeSealed, kUnsealed };

  static Result<std::unique_ptr<ShmRegion>> Create(const char* name, size_t size, Pages pages = Pages::kNormal,
                                                   Seal seal = Seal::kSizeSealed);
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  uint8_t* base() const { return base_; }
  size_t size() const { return size_; }
  int fd() const { return fd_.get(); }
  bool huge_pages() const { return huge_; }
  // Gives the memory back (ReplaceWithZeroPages, then the memfd closes): for
  // a session that was lost. The backend's own mapping, if it still has
  // one, is its own; ours no longer shares it.
  void Release();
  bool Contains(const void* p, size_t len) const {
    auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(base_);
    return a >= b && a - b <= size_ && len <= size_ - (a - b);
  }

 private:
  ShmRegion(UniqueFd fd, uint8_t* base, size_t size, bool huge)
      : fd_(std::move(fd)), base_(base), size_(size), huge_(huge) {}

  UniqueFd fd_;
  uint8_t* base_;
  size_t size_;
  bool huge_;
};

// Replaces the mapping at [base, base + size) (page-aligned; huge-page
// aligned for a hugetlb mapping) with private zero pages that cost nothing
// until written: the shared memory behind it is no longer held by this
// mapping, and the addresses stay reserved, so a late stray access reads
// zeros rather than faulting or reaching memory reused for something else.
Status ReplaceWithZeroPages(void* base, size_t size);

// Carves aligned, never-overlapping chunks out of a region (first fit, with
// free). Not thread-safe; owners serialize.
class RegionAllocator {
 public:
  RegionAllocator(uint8_t* base, size_t size) : base_(base), size_(size) {}
  // `boundary` (a power of two, 0: none): no chunk crosses a multiple of it
  // (offsets from base). In a VM the memory is contiguous guest-physically
  // only within each 2 MiB huge page (decision 84).
  RegionAllocator(uint8_t* base, size_t size, size_t boundary) : base_(base), size_(size), boundary_(boundary) {}
  // nullptr when no chunk of that size is free (or it is larger than the
  // boundary). align must be a power of two.
  uint8_t* Allocate(size_t size, size_t align = 64);
  void Free(uint8_t* p);
  size_t bytes_in_use() const { return in_use_; }

 private:
  struct Chunk {
    size_t offset;
    size_t size;
  };
  uint8_t* base_;
  size_t size_;
  size_t boundary_ = 0;
  size_t in_use_ = 0;
  std::vector<Chunk> used_;  // sorted by offset
};

}  // namespace vsocket::vhost
