// Test helper: a split ring plus data buffers in one heap arena, with an
// identity guest-physical mapping (gpa == local address), as process-mode
// guests use.
#pragma once

#include <cstdlib>
#include <cstring>
#include <memory>

#include "vhost/region/guest_memory.h"
#include "vhost/ring/split_ring.h"

namespace vsocket::vhost::testing {

struct RingArena {
  explicit RingArena(uint16_t qsize, size_t data_bytes = 1 << 20)
      : size(SplitRing::BytesFor(qsize) + data_bytes),
        mem(static_cast<uint8_t*>(std::aligned_alloc(4096, (size + 4095) & ~size_t{4095}))) {
    std::memset(mem.get(), 0, size);
    ring = SplitRing::LayOut(mem.get(), qsize);
    data = mem.get() + SplitRing::BytesFor(qsize);
    guest = std::move(GuestMemory::Create({{Gpa(mem.get()), size, mem.get()}}).value());
  }
  static uint64_t Gpa(const void* p) { return reinterpret_cast<uint64_t>(p); }

  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  size_t size;
  std::unique_ptr<uint8_t, Free> mem;
  SplitRing ring;
  uint8_t* data;
  GuestMemory guest;
};

}  // namespace vsocket::vhost::testing
