// Events owed to guests, coalesced and written into their event queues.
#include "host-backend/conn/conn_manager.h"

#include <array>
#include <cstring>

namespace vsocket::backend {

using proto::Message;
using proto::MsgType;

namespace {
// One connection's events at most: eleven messages of up to 40 bytes.
constexpr size_t kMaxEventBytes = 11 * 40;
}  // namespace

void ConnManager::Raise(BackendConn& c, uint32_t bits) {
  if (c.gone || c.device == nullptr) return;
  c.pending_events |= bits;
  if (!c.in_event_list) {
    DeviceConns* dc = Find(*c.device);
    if (dc == nullptr) return;
    c.in_event_list = true;
    dc->events.push_back(&c);
  }
}

bool ConnManager::EmitEvents(vhost::BackendDevice& device) {
  DeviceConns* dc = Find(device);
  if (dc == nullptr || (dc->events.empty() && dc->released.empty()) || device.broken()) return false;
  vhost::VirtqueueDevice& q = device.queue(1);
  bool wrote = false;
  while (!dc->events.empty() || !dc->released.empty()) {
    vhost::DescChain chain;
    vhost::PopResult r = q.Pop(&chain);
    if (r == vhost::PopResult::kBroken) {
      device.MarkBroken(std::string("event queue: ") + q.broken_reason());
      return wrote;
    }
    if (r == vhost::PopResult::kEmpty) {
      counters_.event_stalls.fetch_add(1, std::memory_order_relaxed);
      return wrote;  // the guest will kick when it posts buffers
    }
    if (chain.num_readable != 0) {
      // An event buffer is device-writable only; one with bytes for us to
      // read is a network driver's transmit packet: not vSocket's driver.
      device.MarkBroken(
          "event queue: a buffer with bytes to read (a transmit packet: a foreign driver, such as the guest "
          "kernel's virtio_net, owns this device)");
      return wrote;
    }
    // Pack as many events as fit into this buffer.
    std::array<uint8_t, 4096> buf;
    size_t cap = std::min<uint64_t>(chain.writable_bytes, buf.size());
    size_t used = 0;
    // Rings of closed connections first (no ordering with any other event).
    while (!dc->released.empty()) {
      Message m{MsgType::kRingsReleased, 0, proto::ConnCounter{dc->released.front(), 0}};
      auto len = proto::Encode(m, {buf.data() + used, cap - used});
      if (!len.ok()) break;
      used += *len;
      dc->released.pop_front();
      counters_.events.fetch_add(1, std::memory_order_relaxed);
    }
    while (!dc->events.empty()) {
      BackendConn& c = *dc->events.front();
      std::array<Message, 11> out;
      size_t n = 0;
      uint32_t bits = c.pending_events;
      if (bits & kEvDirect) out[n++] = {MsgType::kDirect, 0, proto::ConnCounter{c.conn_id, c.ev_direct_token}};
      if (bits & kEvUpgrade) out[n++] = {MsgType::kUpgrade, 0, proto::Upgrade{c.conn_id, c.ev_peer_rx_window, 64}};
      if (bits & kEvFence) out[n++] = {MsgType::kFence, 0, proto::ConnCounter{c.conn_id, c.ev_peer_fence}};
      if (bits & kEvRxTail) out[n++] = {MsgType::kRxTail, 0, proto::ConnCounter{c.conn_id, c.rx_tail}};
      if (bits & kEvCredit) out[n++] = {MsgType::kCredit, 0, proto::ConnCounter{c.conn_id, c.ev_credit}};
      if (bits & kEvPeerShutWr)
        out[n++] = {MsgType::kShutdown, 0, proto::Shutdown{c.conn_id, proto::ShutdownHow::kWrite}};
      // (A drain's reason before the ring end that would otherwise start it.)
      if (bits & kEvDrain)
        out[n++] = {MsgType::kDowngrade, 0, proto::Downgrade{c.conn_id, c.ev_drain_reason, 0, proto::kDowngradeDrain}};
      if (bits & kEvPeerRingEnd)
        out[n++] = {MsgType::kShutdown, 0, proto::Shutdown{c.conn_id, proto::ShutdownHow::kRingEnd}};
      if (bits & kEvPeerGone) out[n++] = {MsgType::kShutdown, 0, proto::Shutdown{c.conn_id, proto::ShutdownHow::kRead}};
      if (bits & kEvFenceDelivered)
        out[n++] = {MsgType::kFenceDelivered, 0, proto::ConnCounter{c.conn_id, c.fence_bytes}};
      if ((bits & kEvDowngrade) && c.ev_resend)
        out[n++] = {MsgType::kDowngrade, 0,
                    proto::Downgrade{c.conn_id, ForGuest(c.reason, c.knows_directory), c.ev_resend_from,
                                     proto::kDowngradeResendFrom}};
      else if (bits & kEvDowngrade)
        out[n++] = {
            MsgType::kDowngrade, 0,
            proto::Downgrade{c.conn_id, ForGuest(c.reason, c.knows_directory), c.rx_tail,
                             c.remote.fence_acked || c.ev_fence_acked ? proto::kDowngradeFenceAcked : uint8_t{0}}};
      // All of one connection's events go in one buffer, in order.
      size_t need = 0;
      std::array<uint8_t, kMaxEventBytes> tmp;
      bool fits = true;
      for (size_t i = 0; i < n; ++i) {
        auto len = proto::Encode(out[i], {tmp.data() + need, tmp.size() - need});
        if (!len.ok()) {
          fits = false;
          break;
        }
        need += *len;
      }
      if (!fits || used + need > cap) break;
      std::memcpy(buf.data() + used, tmp.data(), need);
      used += need;
      if (bits & kEvDowngrade) CountFallback(c.vm_index, c.reason);
      if ((bits & kEvFence) && c.fence_ack_pending) {
        // Goes out on the link after this buffer is published (next pass).
        c.fence_ack_pending = false;
        if (c.remote.paired()) Owe(c, kOweFenceAck);
      }
      // The peer's FENCE is in this buffer, published below: its sender may
      // now resend on kernel TCP with a RESYNC header if this daemon dies.
      if ((bits & kEvFence) && c.peer != nullptr && c.peer->fence_delivered) Raise(*c.peer, kEvFenceDelivered);
      c.pending_events = 0;
      c.in_event_list = false;
      dc->events.pop_front();
      counters_.events.fetch_add(n, std::memory_order_relaxed);
    }
    if (used == 0 && (!dc->events.empty() || !dc->released.empty()) && cap < kMaxEventBytes) {
      // A buffer too small for any event set is a guest bug: skip it.
      q.Push(chain.head, 0);
      continue;
    }
    chain.CopyIn({buf.data(), used});
    q.Push(chain.head, static_cast<uint32_t>(used));
    wrote = true;
  }
  return wrote;
}

bool ConnManager::HasEventsWaiting(vhost::BackendDevice& device) {
  DeviceConns* dc = Find(device);
  return dc != nullptr && (!dc->events.empty() || !dc->released.empty());
}

}  // namespace vsocket::backend
