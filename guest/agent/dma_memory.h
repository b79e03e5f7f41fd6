// Memory whose guest-physical addresses are known and stable: what the
// in-guest agent places its virtqueues and buffers in (decision 84).
//
// Huge pages from a hugetlbfs memfd (MFD_HUGETLB): each 2 MiB page is
// physically contiguous and never migrates or swaps; the agent, as root,
// reads each page's frame from /proc/self/pagemap. A structure that must be
// GPA-contiguous (a ring, a buffer) must not cross a huge-page boundary:
// Allocate() guarantees that. The memfd can later be handed to the
// application processes (SCM_RIGHTS).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"

namespace vsocket::agent {

class DmaMemory {
 public:
  static constexpr size_t kHugePage = 2u << 20;

  // `pages` huge pages, zeroed, locked, translated. kResourceExhausted
  // names the sysctl when the guest has none reserved.
  static Result<std::unique_ptr<DmaMemory>> Create(size_t pages);
  ~DmaMemory();
  DmaMemory(const DmaMemory&) = delete;
  DmaMemory& operator=(const DmaMemory&) = delete;

  // `size` bytes aligned to `align`, within one huge page (so GPA-contiguous);
  // nullptr when none is left. Bump allocation: freed with the whole.
  uint8_t* Allocate(size_t size, size_t align = 64);
  // The guest-physical address of p (inside this memory).
  uint64_t Gpa(const void* p) const;
  int fd() const { return fd_.get(); }
  // Bytes handed out so far (from base()); the rest is free.
  size_t used() const { return next_; }
  uint64_t page_gpa(size_t i) const { return pages_[i]; }
  size_t num_pages() const { return pages_.size(); }
  uint8_t* base() const { return base_; }
  size_t size() const { return pages_.size() * kHugePage; }

 private:
  DmaMemory(UniqueFd fd, uint8_t* base, std::vector<uint64_t> pages)
      : fd_(std::move(fd)), base_(base), pages_(std::move(pages)) {}
  UniqueFd fd_;
  uint8_t* base_;
  std::vector<uint64_t> pages_;  // GPA of each huge page
  size_t next_ = 0;
};

}  // namespace vsocket::agent
