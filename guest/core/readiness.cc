#include <poll.h>
#include <sys/ioctl.h>

#include "guest/core/socket_ops.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {

bool KernelFeedsReads(const Conn& c) {
  if (c.mode.load(std::memory_order_acquire) != Mode::kAccel || c.rx_switched.load()) return false;
  return !(c.peer_fence_known.load() && c.kernel_received.load() == c.peer_fence.load());
}

int Readiness(int fd, Conn& c) {
  if (c.reset.load()) return POLLIN | POLLOUT | POLLERR | POLLHUP;
  if (c.mode.load(std::memory_order_acquire) != Mode::kAccel) return -1;
  if (c.resync.load(std::memory_order_acquire)) {
    // Back on kernel TCP: only bytes still in the ring (or the EOF after
    // them) are ours to report; the kernel socket says the rest.
    bool ring_rx = c.rx_switched.load() ||
                   (c.peer_fence_known.load() && c.kernel_received.load() == c.peer_fence.load());
    if (c.rx_resync.load() == Conn::RxResync::kRing && c.peer_fence_known.load() && ring_rx) {
      bool shut = c.peer_shut_wr.load(std::memory_order_acquire);
      if (shut) return POLLIN | POLLOUT | POLLRDHUP;
      if (c.rx_tail.load(std::memory_order_acquire) != c.rx_head.load()) return POLLIN | POLLOUT;
    }
    return -1;
  }
  int r = 0;
  bool ring_rx = c.rx_switched.load() ||
                 (c.peer_fence_known.load() && c.kernel_received.load() == c.peer_fence.load());
  bool shut = c.peer_shut_wr.load(std::memory_order_acquire);
  if (ring_rx) {
    if (c.rx_tail.load(std::memory_order_acquire) != c.rx_head.load() || shut || c.shut_rd.load())
      r |= POLLIN;
  } else {
    // Still reading the kernel stream up to the fence.
    int queued = 0;
    if ((Libc().ioctl(fd, FIONREAD, &queued) == 0 && queued > 0) || shut) r |= POLLIN;
  }
  if (shut) r |= POLLRDHUP;
  uint64_t used = c.tx_tail.load() - c.credit.load();
  if (!c.tx_switched.load() || used < c.ring_size || c.peer_gone.load()) r |= POLLOUT;
  if (shut && c.shut_wr.load()) r |= POLLHUP;
  return r;
}

}  // namespace vsocket::guest
