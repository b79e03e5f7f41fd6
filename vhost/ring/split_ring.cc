#include "vhost/ring/split_ring.h"

namespace vsocket::vhost {
namespace {
constexpr size_t AlignUp(size_t v, size_t a) { return (v + a - 1) & ~(a - 1); }
}  // namespace

size_t SplitRing::BytesFor(uint16_t size) {
  size_t desc = AlignUp(proto::DescTableBytes(size), 64);
  size_t avail = AlignUp(proto::AvailRingBytes(size), 64);
  size_t used = AlignUp(proto::UsedRingBytes(size), 64);
  return desc + avail + used;
}

SplitRing SplitRing::LayOut(void* mem, uint16_t size) {
  auto* base = static_cast<uint8_t*>(mem);
  size_t desc = AlignUp(proto::DescTableBytes(size), 64);
  size_t avail = AlignUp(proto::AvailRingBytes(size), 64);
  return SplitRing(base, base + desc, base + desc + avail, size);
}

}  // namespace vsocket::vhost
