#include "guest/core/doorbell.h"

#include <atomic>

#include "guest/core/direct.h"
#include "guest/core/session.h"

namespace vsocket::guest {

using proto::MsgType;

// Tells the backend a new count (TX tail or RX consumed). Without the
// doorbell: one message per count. With it: the count goes to the block,
// and a message only if the backend asked for one (it stopped polling the
// block). The fence orders our store before our look at the flag, as the
// backend's orders its flag store before its look at the count: one of
// the two always sees the other's (proto/control.h).
Status Announce(Conn& c, uint64_t proto::DoorbellBlock::*count, uint32_t proto::DoorbellBlock::*want, MsgType type,
                uint64_t value) {
  if (c.direct) {
    // A direct pair: the count goes to the pair's memory (direct.h).
    AnnounceDirect(c, count == &proto::DoorbellBlock::tx_tail, value);
    return Status::Ok();
  }
  if (c.db == nullptr) return c.session->Post({type, 0, proto::ConnCounter{c.id, value}});
  std::atomic_ref<uint64_t>(c.db->*count).store(value, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::atomic_ref<uint32_t> flag(c.db->*want);
  if (flag.load(std::memory_order_relaxed) == 0 || flag.exchange(0, std::memory_order_acq_rel) == 0)
    return Status::Ok();
  return c.session->Post({type, 0, proto::ConnCounter{c.id, value}});
}

}  // namespace vsocket::guest
