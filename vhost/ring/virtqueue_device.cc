#include "vhost/ring/virtqueue_device.h"

#include <algorithm>
#include <atomic>
#include <cstring>

namespace vsocket::vhost {

using proto::kDescFlagIndirect;
using proto::kDescFlagNext;
using proto::kDescFlagWrite;

namespace {
// Where the device-written words of the used ring lie (split_ring.h), for
// the dirty log: flags, idx, then the slots, then avail_event.
const uint16_t* UsedFlagsWord(const SplitRing& r) { return static_cast<const uint16_t*>(r.used_base()); }
const uint16_t* UsedIdxWord(const SplitRing& r) { return UsedFlagsWord(r) + 1; }
const uint16_t* AvailEventWord(const SplitRing& r) {
  return reinterpret_cast<const uint16_t*>(reinterpret_cast<const proto::VringUsedElem*>(UsedFlagsWord(r) + 2) +
                                           r.size());
}
}  // namespace

size_t DescChain::CopyOut(std::span<uint8_t> out) const {
  size_t done = 0;
  for (uint8_t i = 0; i < num_readable && done < out.size(); ++i) {
    size_t n = std::min<size_t>(segs[i].len, out.size() - done);
    std::memcpy(out.data() + done, segs[i].data, n);
    done += n;
  }
  return done;
}

size_t DescChain::CopyIn(std::span<const uint8_t> in) const {
  size_t done = 0;
  for (uint8_t i = 0; i < num_writable && done < in.size(); ++i) {
    const Segment& s = segs[num_readable + i];
    size_t n = std::min<size_t>(s.len, in.size() - done);
    std::memcpy(s.data, in.data() + done, n);
    if (mem != nullptr) mem->MarkWritten(s.data, n);
    done += n;
  }
  return done;
}

VirtqueueDevice::VirtqueueDevice(SplitRing ring, const GuestMemory* mem, bool event_idx, uint16_t last_avail,
                                 uint16_t used_idx)
    : ring_(ring),
      mem_(mem),
      event_idx_(event_idx),
      last_avail_(last_avail),
      used_shadow_(used_idx),
      used_published_(used_idx) {}

bool VirtqueueDevice::HasAvailable() const {
  return !broken() && ring_.avail_idx().load(std::memory_order_acquire) != last_avail_;
}

PopResult VirtqueueDevice::Pop(DescChain* out) {
  if (broken()) return PopResult::kBroken;
  // A1: acquire pairs with the driver's release store of avail->idx (D1 in
  // virtqueue_driver.cc): the slot and descriptors it published are visible.
  uint16_t avail = ring_.avail_idx().load(std::memory_order_acquire);
  if (avail == last_avail_) return PopResult::kEmpty;
  if (static_cast<uint16_t>(avail - last_avail_) > ring_.size())
    return Break("avail index moved further than the queue size");

  // Read every guest-controlled word exactly once into locals (no TOCTOU).
  uint16_t head = ring_.avail_slot(last_avail_);
  if (head >= ring_.size()) return Break("avail ring names a descriptor beyond the queue");

  DescChain chain;
  chain.head = head;
  chain.mem = mem_;
  uint16_t idx = head;
  for (uint32_t count = 0;; ++count) {
    if (count >= ring_.size()) return Break("descriptor chain loops");
    proto::VringDesc d;
    std::memcpy(&d, &ring_.desc()[idx], sizeof(d));
    if (d.flags & kDescFlagIndirect) return Break("indirect descriptor (not negotiated)");
    size_t nseg = chain.num_readable + chain.num_writable;
    if (nseg >= kMaxChainSegments) return Break("descriptor chain has too many segments");
    uint8_t* p = mem_->Translate(d.addr, d.len);
    if (p == nullptr) return Break("descriptor points outside guest memory");
    if (d.flags & kDescFlagWrite) {
      chain.num_writable++;
      chain.writable_bytes += d.len;
    } else {
      if (chain.num_writable != 0) return Break("readable descriptor after a writable one");
      chain.num_readable++;
      chain.readable_bytes += d.len;
    }
    chain.segs[nseg] = Segment{p, d.len};
    if (!(d.flags & kDescFlagNext)) break;
    if (d.next >= ring_.size()) return Break("descriptor next index beyond the queue");
    idx = d.next;
  }
  ++last_avail_;
  *out = chain;
  return PopResult::kChain;
}

void VirtqueueDevice::Push(uint16_t head, uint32_t written) {
  proto::VringUsedElem e{head, written};
  proto::VringUsedElem* slot = &ring_.used_slot(used_shadow_);
  std::memcpy(slot, &e, sizeof(e));
  mem_->MarkWritten(slot, sizeof(e));
  ++used_shadow_;
}

bool VirtqueueDevice::PublishUsed() {
  if (broken()) return false;
  uint16_t old_idx = used_published_;
  uint16_t new_idx = used_shadow_;
  if (old_idx == new_idx) return false;
  // D2: release orders the used slots written by Push() before the index;
  // pairs with the driver's acquire load of used->idx (A2).
  ring_.used_idx().store(new_idx, std::memory_order_release);
  mem_->MarkWritten(UsedIdxWord(ring_), sizeof(uint16_t));
  used_published_ = new_idx;
  // F1: store(used->idx) must be ordered before load(used_event/flags); pairs
  // with the driver's fence F2 between writing used_event and re-reading
  // used->idx, so one of the two sides always sees the other (no lost call).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (event_idx_) return proto::NeedEvent(ring_.used_event().load(std::memory_order_relaxed), new_idx, old_idx);
  return !(ring_.avail_flags().load(std::memory_order_relaxed) & proto::kAvailFlagNoInterrupt);
}

bool VirtqueueDevice::EnableNotify() {
  if (broken()) return false;
  if (event_idx_) {
    // Kick me when avail->idx moves past what I have consumed.
    ring_.avail_event().store(last_avail_, std::memory_order_relaxed);
    mem_->MarkWritten(AvailEventWord(ring_), sizeof(uint16_t));
  } else {
    ring_.used_flags().fetch_and(static_cast<uint16_t>(~proto::kUsedFlagNoNotify), std::memory_order_relaxed);
    mem_->MarkWritten(UsedFlagsWord(ring_), sizeof(uint16_t));
  }
  // F3: order the avail_event/flags store before re-reading avail->idx; pairs
  // with the driver's fence F4 between publishing avail->idx and reading
  // avail_event: either we see its new buffers or it sees our request.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return ring_.avail_idx().load(std::memory_order_acquire) != last_avail_;
}

void VirtqueueDevice::DisableNotify() {
  // With event-idx a stale avail_event suppresses kicks by itself.
  if (!event_idx_ && !broken()) {
    ring_.used_flags().fetch_or(proto::kUsedFlagNoNotify, std::memory_order_relaxed);
    mem_->MarkWritten(UsedFlagsWord(ring_), sizeof(uint16_t));
  }
}

void VirtqueueDevice::SetUsedFlag(uint16_t bit, bool on) {
  if (broken()) return;
  // Atomic read-modify-writes: the flags' other bits may change meanwhile
  // on another thread (decision 130's flag is cleared by the agent's
  // LIMIT_MEMORY, on its worker).
  uint16_t was = on ? ring_.used_flags().fetch_or(bit, std::memory_order_release)
                    : ring_.used_flags().fetch_and(static_cast<uint16_t>(~bit), std::memory_order_release);
  if (((was & bit) != 0) != on) mem_->MarkWritten(UsedFlagsWord(ring_), sizeof(uint16_t));
}

}  // namespace vsocket::vhost
