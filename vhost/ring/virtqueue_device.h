// Device (backend) side of a split virtqueue. The driver is untrusted: every
// index, descriptor, length and address read from the ring is validated, and
// any violation latches the queue broken (it is never processed again) with a
// reason, instead of touching memory outside the guest's regions.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "vhost/region/guest_memory.h"
#include "vhost/ring/split_ring.h"

namespace vsocket::vhost {

// The most segments one chain may have on this device. The virtio spec only
// bounds chains by the queue size; vSocket's messages use 1-4 segments.
inline constexpr size_t kMaxChainSegments = 16;

struct Segment {
  uint8_t* data;  // validated pointer into guest memory
  uint32_t len;
};

// A validated descriptor chain: readable segments first, then writable ones.
// Whoever writes into a writable segment other than through CopyIn calls
// mem->MarkWritten for it.
struct DescChain {
  uint16_t head = 0;
  uint8_t num_readable = 0;
  uint8_t num_writable = 0;
  uint64_t readable_bytes = 0;
  uint64_t writable_bytes = 0;
  std::array<Segment, kMaxChainSegments> segs;
  const GuestMemory* mem = nullptr;  // where segs lie (CopyIn marks what it writes)

  const Segment* readable() const { return segs.data(); }
  const Segment* writable() const { return segs.data() + num_readable; }
  // Gathers up to out.size() readable bytes; returns bytes copied.
  size_t CopyOut(std::span<uint8_t> out) const;
  // Scatters `in` into the writable segments; returns bytes copied. (Marked
  // in the dirty log: GuestMemory::MarkWritten.)
  size_t CopyIn(std::span<const uint8_t> in) const;
};

enum class PopResult { kEmpty, kChain, kBroken };

class VirtqueueDevice {
 public:
  VirtqueueDevice() = default;
  // `last_avail` / `used_idx`: where to resume (vhost-user SET_VRING_BASE).
  VirtqueueDevice(SplitRing ring, const GuestMemory* mem, bool event_idx, uint16_t last_avail, uint16_t used_idx);

  // Takes the next available chain into *out.
  PopResult Pop(DescChain* out);
  // Returns a chain; becomes visible to the driver at PublishUsed().
  void Push(uint16_t head, uint32_t written);
  // Publishes pushed entries. True if the driver asked to be notified.
  bool PublishUsed();

  // Asks the driver to kick on new buffers. Returns true if buffers became
  // available meanwhile: the caller must process them rather than sleep.
  bool EnableNotify();
  void DisableNotify();
  bool HasAvailable() const;
  // Sets or clears one of vSocket's own used->flags bits (proto::kUsedFlag*:
  // NoCall, NeedsLimit), atomically: safe beside the worker's own flag
  // changes, kept across EnableNotify / DisableNotify; written (into the
  // dirty log) only when it changes.
  void SetUsedFlag(uint16_t bit, bool on);

  bool broken() const { return broken_ != nullptr; }
  const char* broken_reason() const { return broken_ ? broken_ : ""; }
  uint16_t last_avail_idx() const { return last_avail_; }
  uint16_t used_idx() const { return used_shadow_; }
  const SplitRing& ring() const { return ring_; }

 private:
  PopResult Break(const char* why) {
    broken_ = why;
    return PopResult::kBroken;
  }

  SplitRing ring_;
  const GuestMemory* mem_ = nullptr;
  bool event_idx_ = false;
  uint16_t last_avail_ = 0;      // next avail slot to consume
  uint16_t used_shadow_ = 0;     // next used slot to fill (private until published)
  uint16_t used_published_ = 0;  // used->idx as last published
  const char* broken_ = nullptr;
};

}  // namespace vsocket::vhost
