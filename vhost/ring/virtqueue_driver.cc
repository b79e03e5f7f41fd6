#include "vhost/ring/virtqueue_driver.h"

#include <atomic>
#include <cstring>

namespace vsocket::vhost {

VirtqueueDriver::VirtqueueDriver(SplitRing ring, bool event_idx)
    : ring_(ring), event_idx_(event_idx), next_free_(ring.size()), heads_(ring.size()), num_free_(ring.size()) {
  std::memset(ring_.desc(), 0, proto::DescTableBytes(ring.size()));
  std::memset(ring_.avail_base(), 0, proto::AvailRingBytes(ring.size()));
  std::memset(ring_.used_base(), 0, proto::UsedRingBytes(ring.size()));
  for (uint16_t i = 0; i < ring.size(); ++i) next_free_[i] = static_cast<uint16_t>(i + 1);
}

Result<uint16_t> VirtqueueDriver::Add(std::span<const Buf> out, std::span<const Buf> in, uint64_t cookie) {
  size_t n = out.size() + in.size();
  if (n == 0) return Status(Code::kInvalidArgument, "empty descriptor chain");
  if (broken()) return Status(Code::kDataLoss, std::string("virtqueue broken: ") + broken_);
  if (n > num_free_) return Status(Code::kResourceExhausted, "virtqueue full");
  uint16_t head = free_head_;
  uint16_t idx = head;
  uint32_t writable = 0;
  for (size_t i = 0; i < n; ++i) {
    const Buf& b = i < out.size() ? out[i] : in[i - out.size()];
    bool last = i + 1 == n;
    uint16_t next = next_free_[idx];
    proto::VringDesc d{
        b.gpa, b.len,
        static_cast<uint16_t>((i >= out.size() ? proto::kDescFlagWrite : 0) | (last ? 0 : proto::kDescFlagNext)),
        static_cast<uint16_t>(last ? 0 : next)};
    std::memcpy(&ring_.desc()[idx], &d, sizeof(d));
    if (i >= out.size()) writable += b.len;
    if (!last) idx = next;
  }
  free_head_ = next_free_[idx];
  num_free_ = static_cast<uint16_t>(num_free_ - n);
  heads_[head] = HeadInfo{true, static_cast<uint16_t>(n), writable, cookie};
  ring_.avail_slot(avail_shadow_) = head;
  ++avail_shadow_;
  return head;
}

bool VirtqueueDriver::Publish() {
  uint16_t old_idx = avail_published_;
  uint16_t new_idx = avail_shadow_;
  if (old_idx == new_idx) return false;
  // D1: release orders descriptor and avail-slot writes before the index;
  // pairs with the device's acquire load of avail->idx (A1).
  ring_.avail_idx().store(new_idx, std::memory_order_release);
  avail_published_ = new_idx;
  // F4: store(avail->idx) before load(avail_event/flags); pairs with the
  // device's fence F3 in EnableNotify().
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (event_idx_) return proto::NeedEvent(ring_.avail_event().load(std::memory_order_relaxed), new_idx, old_idx);
  return !(ring_.used_flags().load(std::memory_order_relaxed) & proto::kUsedFlagNoNotify);
}

std::optional<VirtqueueDriver::Used> VirtqueueDriver::PopUsed() {
  if (broken()) return std::nullopt;
  // A2: acquire pairs with the device's release store of used->idx (D2).
  uint16_t used = ring_.used_idx().load(std::memory_order_acquire);
  if (used == last_used_) return std::nullopt;
  if (static_cast<uint16_t>(used - last_used_) > ring_.size()) {
    broken_ = "used index moved further than the queue size";
    return std::nullopt;
  }
  proto::VringUsedElem e;
  std::memcpy(&e, &ring_.used_slot(last_used_), sizeof(e));
  if (e.id >= ring_.size() || !heads_[e.id].in_flight) {
    broken_ = "used entry names a descriptor that is not in flight";
    return std::nullopt;
  }
  HeadInfo& h = heads_[e.id];
  if (e.len > h.writable) {
    broken_ = "used length exceeds the chain's writable capacity";
    return std::nullopt;
  }
  ++last_used_;
  // Return the chain to the free list using our private links.
  uint16_t tail = static_cast<uint16_t>(e.id);
  // In-flight descriptors keep their free-list links, which are the chain.
  for (uint16_t i = 1; i < h.count; ++i) tail = next_free_[tail];
  next_free_[tail] = free_head_;
  free_head_ = static_cast<uint16_t>(e.id);
  num_free_ = static_cast<uint16_t>(num_free_ + h.count);
  h.in_flight = false;
  return Used{h.cookie, e.len};
}

std::vector<uint64_t> VirtqueueDriver::InFlightCookies() const {
  std::vector<uint64_t> out;
  for (const HeadInfo& h : heads_)
    if (h.in_flight) out.push_back(h.cookie);
  return out;
}

bool VirtqueueDriver::EnableInterrupts() {
  if (event_idx_) {
    ring_.used_event().store(last_used_, std::memory_order_relaxed);
  } else {
    ring_.avail_flags().store(0, std::memory_order_relaxed);
  }
  // F2: order the used_event/flags store before re-reading used->idx; pairs
  // with the device's fence F1 in PublishUsed().
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return ring_.used_idx().load(std::memory_order_acquire) != last_used_;
}

void VirtqueueDriver::DisableInterrupts() {
  if (!event_idx_) ring_.avail_flags().store(proto::kAvailFlagNoInterrupt, std::memory_order_relaxed);
}

}  // namespace vsocket::vhost
