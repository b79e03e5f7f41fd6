#include "proto/direct.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "proto/control.h"

namespace vsocket::proto {

Result<UniqueFd> MakeDirectMemory(uint32_t ring_bytes, uint64_t conn_id0, uint64_t conn_id1) {
  if (!IsValidRingSize(ring_bytes)) return Status(Code::kInvalidArgument, "direct ring size not a power of two in range");
  UniqueFd fd(memfd_create("vsocket-direct", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return Status::FromErrno("memfd_create");
  size_t bytes = DirectBytes(ring_bytes);
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) return Status::FromErrno("ftruncate");
  // Only the first page is written: the rings' pages come as they are touched.
  DirectHeader h{};
  h.magic = kDirectMagic;
  h.version = kDirectVersion;
  h.ring_bytes = ring_bytes;
  h.conn_id[0] = conn_id0;
  h.conn_id[1] = conn_id1;
  DirectSide side{};
  side.ring_end = kDirectOpen;
  uint8_t page[kDirectRingsOffset] = {};
  std::memcpy(page, &h, sizeof(h));
  std::memcpy(page + kDirectSideOffset[0], &side, sizeof(side));
  std::memcpy(page + kDirectSideOffset[1], &side, sizeof(side));
  if (pwrite(fd.get(), page, sizeof(page), 0) != static_cast<ssize_t>(sizeof(page))) return Status::FromErrno("pwrite");
  if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return Status::FromErrno("F_ADD_SEALS");
  return fd;
}

}  // namespace vsocket::proto
