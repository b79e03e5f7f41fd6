// The one copy of the same-host data path.
#pragma once

#include <cstdint>

#include "vhost/region/guest_memory.h"

namespace vsocket::backend {

// Copies n bytes between two buffers with independent wrap points. A size
// of 0 means a linear buffer (no wrap; pos is a plain offset).
void RingCopy(uint8_t* dst, uint32_t dst_size, uint64_t dst_pos, const uint8_t* src, uint32_t src_size,
              uint64_t src_pos, uint64_t n);

// Marks n bytes of a ring in guest memory written from stream position pos
// on (wrapping at size, a power of two): in the frontend's dirty log while a
// live migration runs, else one branch. Call after writing them.
void MarkRingWritten(const vhost::GuestMemory& mem, const uint8_t* ring, uint32_t size, uint64_t pos, uint64_t n);

}  // namespace vsocket::backend
