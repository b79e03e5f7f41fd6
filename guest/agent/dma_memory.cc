#include "guest/agent/dma_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace vsocket::agent {
namespace {

constexpr uint64_t kPagemapPresent = 1ull << 63;
constexpr uint64_t kPagemapPfnMask = (1ull << 55) - 1;

// The physical address behind virtual address v (resident), from
// /proc/self/pagemap (the frame number is visible to CAP_SYS_ADMIN only;
// anyone else reads 0).
Result<uint64_t> PhysicalAddress(int pagemap, const void* v) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t addr = reinterpret_cast<uint64_t>(v);
  uint64_t entry = 0;
  if (pread(pagemap, &entry, sizeof(entry), static_cast<off_t>(addr / page * sizeof(entry))) != sizeof(entry))
    return Status::FromErrno("read /proc/self/pagemap");
  if (!(entry & kPagemapPresent)) return Status(Code::kInternal, "page not resident after touching it");
  uint64_t pfn = entry & kPagemapPfnMask;
  if (pfn == 0) return Status(Code::kPermissionDenied, "pagemap hides frame numbers (the agent must run as root)");
  return pfn * page + addr % page;
}

}  // namespace

Result<std::unique_ptr<DmaMemory>> DmaMemory::Create(size_t pages) {
  if (pages == 0) return Status(Code::kInvalidArgument, "no pages asked for");
  int fd = memfd_create("vsocket-guestd-dma", MFD_CLOEXEC | MFD_HUGETLB | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::FromErrno("memfd_create(MFD_HUGETLB) (is hugetlbfs in the kernel?)");
  UniqueFd owned(fd);
  const size_t bytes = pages * kHugePage;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return Status::FromErrno("size the huge-page memfd");
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED)
    return Status::FromErrno("mmap " + std::to_string(pages) + " huge pages (too few free? vm.nr_hugepages)");
  auto* base = static_cast<uint8_t*>(p);
  // A hugetlb mapping without reserved pages faults with SIGBUS on touch;
  // MAP_SHARED reserves at mmap time, so a shortage is the mmap's ENOMEM
  // above. Touch every page anyway (MAP_POPULATE is best effort).
  for (size_t i = 0; i < pages; ++i) std::memset(base + i * kHugePage, 0, kHugePage);
  if (mlock(base, bytes) != 0) {
    munmap(base, bytes);
    return Status::FromErrno("mlock huge pages");
  }
  int pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (pagemap < 0) {
    munmap(base, bytes);
    return Status::FromErrno("open /proc/self/pagemap");
  }
  std::vector<uint64_t> gpas;
  Status st = Status::Ok();
  for (size_t i = 0; i < pages && st.ok(); ++i) {
    auto pa = PhysicalAddress(pagemap, base + i * kHugePage);
    if (!pa.ok()) st = pa.status();
    else if (*pa % kHugePage != 0) st = Status(Code::kInternal, "a huge page that is not 2 MiB aligned physically");
    else gpas.push_back(*pa);
  }
  close(pagemap);
  if (!st.ok()) {
    munmap(base, bytes);
    return st;
  }
  // The agent hands this memfd to processes later: its size is fixed.
  fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  return std::unique_ptr<DmaMemory>(new DmaMemory(std::move(owned), base, std::move(gpas)));
}

DmaMemory::~DmaMemory() { munmap(base_, size()); }

uint8_t* DmaMemory::Allocate(size_t size, size_t align) {
  if (size == 0 || size > kHugePage || align == 0 || (align & (align - 1)) != 0) return nullptr;
  size_t at = (next_ + align - 1) & ~(align - 1);
  // Never across a huge-page boundary: the next page is elsewhere physically.
  if (at / kHugePage != (at + size - 1) / kHugePage) at = (at / kHugePage + 1) * kHugePage;
  if (at + size > this->size()) return nullptr;
  next_ = at + size;
  return base_ + at;
}

uint64_t DmaMemory::Gpa(const void* p) const {
  size_t off = static_cast<size_t>(static_cast<const uint8_t*>(p) - base_);
  return pages_[off / kHugePage] + off % kHugePage;
}

}  // namespace vsocket::agent
