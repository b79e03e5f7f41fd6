// The one copy of the same-host data path.
#pragma once

#include <cstdint>

namespace vsocket::backend {

// Copies n bytes between two buffers with independent wrap points. A size
// of 0 means a linear buffer (no wrap; pos is a plain offset).
void RingCopy(uint8_t* dst, uint32_t dst_size, uint64_t dst_pos, const uint8_t* src, uint32_t src_size,
              uint64_t src_pos, uint64_t n);

}  // namespace vsocket::backend
