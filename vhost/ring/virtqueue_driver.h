// Driver (guest) side of a split virtqueue. The device is not trusted either:
// the free list and chain bookkeeping live in private memory, and a used
// entry naming a descriptor that is not an in-flight head, or claiming more
// bytes than the chain could hold, latches the queue broken.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "base/status.h"
#include "vhost/ring/split_ring.h"

namespace vsocket::vhost {

class VirtqueueDriver {
 public:
  struct Buf {
    uint64_t gpa;
    uint32_t len;
  };
  struct Used {
    uint64_t cookie;  // what Add() was given
    uint32_t len;     // bytes the device wrote
  };

  VirtqueueDriver() = default;
  // Zeroes the ring and builds the free list.
  VirtqueueDriver(SplitRing ring, bool event_idx);

  // Queues a chain: `out` device-readable buffers then `in` device-writable.
  // Visible to the device at Publish(). kResourceExhausted if descriptors run
  // out.
  Result<uint16_t> Add(std::span<const Buf> out, std::span<const Buf> in, uint64_t cookie);
  // Publishes added chains. True if the device asked to be kicked.
  bool Publish();

  std::optional<Used> PopUsed();
  // Asks for a call on the next used entry. True if entries are already
  // pending (the caller must drain instead of sleeping).
  bool EnableInterrupts();
  void DisableInterrupts();
  // The device says it cannot interrupt this driver (proto::kUsedFlagNoCall,
  // decision 129): a sleep waiting for its call would end only at its timeout.
  bool DeviceCannotCall() const {
    return ring_.used_flags().load(std::memory_order_acquire) & proto::kUsedFlagNoCall;
  }
  // The device waits for its memory limit (proto::kUsedFlagNeedsLimit).
  bool DeviceNeedsLimit() const {
    return ring_.used_flags().load(std::memory_order_acquire) & proto::kUsedFlagNeedsLimit;
  }

  // Cookies of chains added but not yet returned by PopUsed().
  std::vector<uint64_t> InFlightCookies() const;

  uint16_t num_free() const { return num_free_; }
  uint16_t size() const { return ring_.size(); }
  bool broken() const { return broken_ != nullptr; }
  const char* broken_reason() const { return broken_ ? broken_ : ""; }
  const SplitRing& ring() const { return ring_; }
  uint16_t avail_idx() const { return avail_shadow_; }
  uint16_t last_used_idx() const { return last_used_; }

 private:
  struct HeadInfo {
    bool in_flight = false;
    uint16_t count = 0;     // descriptors in the chain
    uint32_t writable = 0;  // capacity the device may write
    uint64_t cookie = 0;
  };

  SplitRing ring_;
  bool event_idx_ = false;
  std::vector<uint16_t> next_free_;  // private free list (device can't corrupt it)
  std::vector<HeadInfo> heads_;
  uint16_t free_head_ = 0;
  uint16_t num_free_ = 0;
  uint16_t avail_shadow_ = 0;  // next avail slot (private until published)
  uint16_t avail_published_ = 0;
  uint16_t last_used_ = 0;
  const char* broken_ = nullptr;
};

}  // namespace vsocket::vhost
