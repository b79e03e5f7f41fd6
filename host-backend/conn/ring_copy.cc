// The one copy of the same-host data path.
#include "host-backend/conn/ring_copy.h"

#include <algorithm>
#include <cstring>

namespace vsocket::backend {

void RingCopy(uint8_t* dst, uint32_t dst_size, uint64_t dst_pos, const uint8_t* src, uint32_t src_size,
              uint64_t src_pos, uint64_t n) {
  auto offset = [](uint64_t pos, uint32_t size) { return size ? pos & (size - 1) : pos; };
  auto room = [](uint64_t off, uint32_t size) { return size ? size - off : UINT64_MAX; };
  while (n > 0) {
    uint64_t d = offset(dst_pos, dst_size), s = offset(src_pos, src_size);
    uint64_t chunk = std::min<uint64_t>({n, room(d, dst_size), room(s, src_size)});
    std::memcpy(dst + d, src + s, chunk);
    dst_pos += chunk;
    src_pos += chunk;
    n -= chunk;
  }
}

void MarkRingWritten(const vhost::GuestMemory& mem, const uint8_t* ring, uint32_t size, uint64_t pos, uint64_t n) {
  if (!mem.logging()) [[likely]]
    return;
  n = std::min<uint64_t>(n, size);
  uint64_t off = pos & (size - 1);
  uint64_t first = std::min<uint64_t>(n, size - off);
  mem.MarkWritten(ring + off, first);
  if (first < n) mem.MarkWritten(ring, n - first);
}

}  // namespace vsocket::backend
