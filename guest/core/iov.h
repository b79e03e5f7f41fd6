// Copies between an application's iovec and a byte ring.
#pragma once

#include <sys/uio.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace vsocket::guest {

// Copies n bytes between iov (starting `skip` bytes in) and the ring at
// pos, in the direction ToRing says.
template <bool ToRing>
inline void CopyIovRing(uint8_t* ring, uint32_t size, uint64_t pos, const iovec* iov, int iovcnt, size_t skip,
                        size_t n) {
  for (int i = 0; i < iovcnt && n > 0; ++i) {
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    uint8_t* buf = static_cast<uint8_t*>(iov[i].iov_base) + skip;
    size_t len = std::min(iov[i].iov_len - skip, n);
    skip = 0;
    while (len > 0) {
      uint32_t off = static_cast<uint32_t>(pos & (size - 1));
      size_t chunk = std::min<size_t>(len, size - off);
      if (ToRing) {
        std::memcpy(ring + off, buf, chunk);
      } else {
        std::memcpy(buf, ring + off, chunk);
      }
      pos += chunk;
      buf += chunk;
      len -= chunk;
      n -= chunk;
    }
  }
}

inline size_t IovLen(const iovec* iov, int iovcnt) {
  size_t n = 0;
  for (int i = 0; i < iovcnt; ++i) n += iov[i].iov_len;
  return n;
}

// At most `limit` bytes of iov starting `skip` bytes in, as up to 64 parts.
inline int SliceIov(const iovec* iov, int iovcnt, size_t skip, size_t limit, iovec (&part)[64]) {
  int np = 0;
  for (int i = 0; i < iovcnt && limit > 0 && np < 64; ++i) {
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    size_t len = std::min(iov[i].iov_len - skip, limit);
    part[np++] = {static_cast<uint8_t*>(iov[i].iov_base) + skip, len};
    limit -= len;
    skip = 0;
  }
  return np;
}

}  // namespace vsocket::guest
