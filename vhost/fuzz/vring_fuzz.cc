// libFuzzer target for the device-side descriptor walk (VirtqueueDevice::Pop),
// the decoder of everything a guest writes into a split ring. The input is
// laid out as: queue size selector, avail idx, avail slots, descriptors.
// Property: every chain produced lies inside guest memory; anything else
// latches the queue broken. ASan catches any stray access.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "vhost/region/guest_memory.h"
#include "vhost/ring/virtqueue_device.h"

using namespace vsocket::vhost;
namespace proto = vsocket::proto;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const uint16_t qsize = uint16_t{1} << (data[0] % 6);  // 1..32
  const bool event_idx = data[1] & 1;
  constexpr size_t kData = 4096;
  size_t ring_bytes = SplitRing::BytesFor(qsize);
  std::vector<uint8_t> mem(ring_bytes + kData + 64);
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(mem.data()) + 63) & ~uintptr_t{63});
  SplitRing ring = SplitRing::LayOut(base, qsize);
  // Fill desc table, then avail ring, from the input.
  size_t off = 2;
  size_t n = std::min(size - off, proto::DescTableBytes(qsize));
  std::memcpy(ring.desc(), data + off, n);
  off += n;
  n = std::min(size - off, proto::AvailRingBytes(qsize));
  std::memcpy(ring.avail_base(), data + off, n);
  // Descriptor addresses are interpreted relative to a fixed guest base so
  // the fuzzer can reach both valid and invalid ones.
  constexpr uint64_t kGpa = 0x100000;
  for (uint16_t i = 0; i < qsize; ++i) {
    uint64_t a = ring.desc()[i].addr;
    if (a < (1u << 24)) ring.desc()[i].addr = kGpa + a;
  }
  auto gm = GuestMemory::Create({{kGpa, kData, base + ring_bytes}});
  if (!gm.ok()) std::abort();
  VirtqueueDevice dev(ring, &gm.value(), event_idx, 0, 0);
  DescChain c;
  for (int i = 0; i < 64; ++i) {
    PopResult r = dev.Pop(&c);
    if (r != PopResult::kChain) break;
    for (size_t s = 0; s < size_t{c.num_readable} + c.num_writable; ++s) {
      if (!gm->ContainsLocal(c.segs[s].data, c.segs[s].len)) std::abort();
      volatile uint8_t sink = c.segs[s].len ? c.segs[s].data[c.segs[s].len - 1] : 0;
      (void)sink;
    }
    dev.Push(c.head, 0);
    dev.PublishUsed();
  }
  return 0;
}
