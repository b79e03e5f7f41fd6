#include "vhost/region/shm_region.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "base/own_fd.h"

namespace vsocket::vhost {
namespace {

constexpr size_t kHugePage = 2u << 20;
constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;

}  // namespace

Result<std::unique_ptr<ShmRegion>> ShmRegion::Create(const char* name, size_t size, Pages pages, Seal seal) {
  if (size == 0) return Status(Code::kInvalidArgument, "empty shared region");
  bool sealed = seal == Seal::kSizeSealed;
  unsigned sealing = sealed ? MFD_ALLOW_SEALING : 0;
  if (pages == Pages::kHugeIfAvailable) {
    size_t huge_size = (size + kHugePage - 1) & ~(kHugePage - 1);
    int fd = OwnFd(memfd_create(name, MFD_CLOEXEC | MFD_HUGETLB | sealing));
    if (fd >= 0) {
      UniqueFd owned(fd);
      if (ftruncate(fd, static_cast<off_t>(huge_size)) == 0 && (!sealed || fcntl(fd, F_ADD_SEALS, kSizeSeals) == 0)) {
        void* p = mmap(nullptr, huge_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (p != MAP_FAILED)
          return std::unique_ptr<ShmRegion>(new ShmRegion(std::move(owned), static_cast<uint8_t*>(p), huge_size, true));
      }
    }
    // No hugetlbfs pages reserved: fall through to normal pages.
  }
  int fd = OwnFd(memfd_create(name, MFD_CLOEXEC | sealing));
  if (fd < 0) return Status::FromErrno("memfd_create");
  UniqueFd owned(fd);
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size = (size + page - 1) & ~(page - 1);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) return Status::FromErrno("ftruncate memfd");
  if (sealed && fcntl(fd, F_ADD_SEALS, kSizeSeals) != 0) return Status::FromErrno("seal memfd");
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Status::FromErrno("mmap memfd");
  return std::unique_ptr<ShmRegion>(new ShmRegion(std::move(owned), static_cast<uint8_t*>(p), size, false));
}

ShmRegion::~ShmRegion() {
  if (base_ != nullptr) munmap(base_, size_);
}

void ShmRegion::Release() {
  if (!fd_) return;
  (void)ReplaceWithZeroPages(base_, size_);
  fd_.reset();
}

Status ReplaceWithZeroPages(void* base, size_t size) {
  void* p = mmap(base, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return Status::FromErrno("mmap zero pages over released memory");
  return Status::Ok();
}

uint8_t* RegionAllocator::Allocate(size_t size, size_t align) {
  if (size == 0 || align == 0 || (align & (align - 1)) != 0) return nullptr;
  if (boundary_ != 0 && size > boundary_) return nullptr;
  size_t cursor = 0;
  size_t insert_at = 0;
  for (size_t i = 0; i <= used_.size(); ++i) {
    size_t start = (cursor + align - 1) & ~(align - 1);
    // Across a boundary: start at the boundary instead (a multiple of any
    // alignment up to it).
    if (boundary_ != 0 && start / boundary_ != (start + size - 1) / boundary_)
      start = (start / boundary_ + 1) * boundary_;
    size_t limit = i < used_.size() ? used_[i].offset : size_;
    if (start <= limit && limit - start >= size) {
      insert_at = i;
      used_.insert(used_.begin() + static_cast<ptrdiff_t>(insert_at), Chunk{start, size});
      in_use_ += size;
      return base_ + start;
    }
    if (i < used_.size()) cursor = used_[i].offset + used_[i].size;
  }
  return nullptr;
}

void RegionAllocator::Free(uint8_t* p) {
  if (p == nullptr) return;
  size_t off = static_cast<size_t>(p - base_);
  auto it = std::lower_bound(used_.begin(), used_.end(), off, [](const Chunk& c, size_t o) { return c.offset < o; });
  if (it != used_.end() && it->offset == off) {
    in_use_ -= it->size;
    used_.erase(it);
  }
}

}  // namespace vsocket::vhost
