// A view of one split virtqueue's three parts, wherever they are mapped.
//
// Index fields (avail->idx, used->idx, used_event, avail_event, flags) are
// shared with the other side and are only accessed through std::atomic_ref;
// ring slots and descriptors are plain memory ordered by those indices.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "proto/virtio_ring.h"

namespace vsocket::vhost {

class SplitRing {
 public:
  SplitRing() = default;
  SplitRing(void* desc, void* avail, void* used, uint16_t size)
      : desc_(static_cast<proto::VringDesc*>(desc)),
        avail_(static_cast<uint16_t*>(avail)),
        used_(static_cast<uint16_t*>(used)),
        size_(size) {}

  // Lays out a queue of `size` entries in `mem` (which must hold
  // BytesFor(size) bytes, 64-byte aligned): desc, then avail, then used,
  // each part starting on a 64-byte boundary to keep producer and consumer
  // cache lines apart.
  static size_t BytesFor(uint16_t size);
  static SplitRing LayOut(void* mem, uint16_t size);

  uint16_t size() const { return size_; }
  bool valid() const { return desc_ != nullptr; }

  proto::VringDesc* desc() const { return desc_; }
  void* avail_base() const { return avail_; }
  void* used_base() const { return used_; }

  // avail ring (written by the driver).
  std::atomic_ref<uint16_t> avail_flags() const { return std::atomic_ref<uint16_t>(avail_[0]); }
  std::atomic_ref<uint16_t> avail_idx() const { return std::atomic_ref<uint16_t>(avail_[1]); }
  uint16_t& avail_slot(uint16_t i) const { return avail_[2 + (i & (size_ - 1))]; }
  std::atomic_ref<uint16_t> used_event() const { return std::atomic_ref<uint16_t>(avail_[2 + size_]); }

  // used ring (written by the device).
  std::atomic_ref<uint16_t> used_flags() const { return std::atomic_ref<uint16_t>(used_[0]); }
  std::atomic_ref<uint16_t> used_idx() const { return std::atomic_ref<uint16_t>(used_[1]); }
  proto::VringUsedElem& used_slot(uint16_t i) const {
    return reinterpret_cast<proto::VringUsedElem*>(used_ + 2)[i & (size_ - 1)];
  }
  std::atomic_ref<uint16_t> avail_event() const {
    return std::atomic_ref<uint16_t>(
        *reinterpret_cast<uint16_t*>(reinterpret_cast<proto::VringUsedElem*>(used_ + 2) + size_));
  }

 private:
  proto::VringDesc* desc_ = nullptr;
  uint16_t* avail_ = nullptr;
  uint16_t* used_ = nullptr;
  uint16_t size_ = 0;
};

}  // namespace vsocket::vhost
