// Virtio 1.x split virtqueue layout (virtio spec v1.2, section 2.7), the
// "ring entry" wire format shared by guest and backend. Little-endian; this
// code targets little-endian hosts only (static_assert below).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace vsocket::proto {

static_assert(std::endian::native == std::endian::little, "virtio rings are little-endian");

// Feature bits (virtio spec 6, vhost-user spec).
inline constexpr uint64_t kFeatureIndirectDesc = 1ull << 28;
inline constexpr uint64_t kFeatureEventIdx = 1ull << 29;
inline constexpr uint64_t kFeatureVhostUserProtocol = 1ull << 30;
inline constexpr uint64_t kFeatureVersion1 = 1ull << 32;
inline constexpr uint64_t kFeatureLogAll = 1ull << 26;  // VHOST_F_LOG_ALL: migration

// Descriptor flags (2.7.5).
inline constexpr uint16_t kDescFlagNext = 1;
inline constexpr uint16_t kDescFlagWrite = 2;
inline constexpr uint16_t kDescFlagIndirect = 4;
// avail->flags / used->flags (2.7.7, 2.7.10).
inline constexpr uint16_t kAvailFlagNoInterrupt = 1;
inline constexpr uint16_t kUsedFlagNoNotify = 1;
// vSocket's own use of a used->flags bit the spec reserves (decision 129):
// the device has no way to interrupt its driver on this queue (its frontend,
// QEMU, started it without a call eventfd). Only vSocket's drivers read it;
// others look at bit 0 alone.
inline constexpr uint16_t kUsedFlagNoCall = 0x8000;
// vSocket's too (decision 130): this device reaches no guest memory until
// the VM's agent limits it to the memory it gave the function; the agent,
// seeing it on a function it set up, sends LIMIT_MEMORY (again: after a
// live migration's arrival or a vsocketd restart, a device new to vsocketd).
inline constexpr uint16_t kUsedFlagNeedsLimit = 0x4000;

inline constexpr uint32_t kMaxQueueSize = 32768;

struct VringDesc {
  uint64_t addr;  // guest-physical
  uint32_t len;
  uint16_t flags;
  uint16_t next;
};
static_assert(sizeof(VringDesc) == 16);

struct VringUsedElem {
  uint32_t id;   // head of the chain (uint32 on the wire)
  uint32_t len;  // bytes written into the chain's device-writable buffers
};
static_assert(sizeof(VringUsedElem) == 8);

// Byte sizes of the three parts for a queue of `n` entries, including the
// event-idx trailers (used_event after avail->ring, avail_event after
// used->ring), which are present in memory whether or not the feature is on.
constexpr size_t DescTableBytes(uint32_t n) { return 16u * n; }
constexpr size_t AvailRingBytes(uint32_t n) { return 4u + 2u * n + 2u; }
constexpr size_t UsedRingBytes(uint32_t n) { return 4u + 8u * n + 2u; }
// Alignment the spec requires of each part.
inline constexpr size_t kDescAlign = 16;
inline constexpr size_t kAvailAlign = 2;
inline constexpr size_t kUsedAlign = 4;

constexpr bool IsValidQueueSize(uint32_t n) { return n != 0 && n <= kMaxQueueSize && (n & (n - 1)) == 0; }

// vring_need_event() from the spec (2.7.10.2): true if `event_idx` lies in
// the window (old_idx, new_idx], i.e. the other side asked to be notified
// once the index it published has been passed. Modulo-2^16 arithmetic.
constexpr bool NeedEvent(uint16_t event_idx, uint16_t new_idx, uint16_t old_idx) {
  return static_cast<uint16_t>(new_idx - event_idx - 1) < static_cast<uint16_t>(new_idx - old_idx);
}

}  // namespace vsocket::proto
