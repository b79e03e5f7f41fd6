#include <poll.h>
#include <sys/ioctl.h>

#include "guest/core/socket_ops.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {

bool KernelFeedsReads(const Conn& c) {
  if (!c.state.accelerated() || c.state.rx_on_ring()) return false;
  return !(c.peer_fence_known.load() && c.kernel_received.load() == c.peer_fence.load());
}

int Readiness(int fd, Conn& c) {
  if (c.state.reset()) return POLLIN | POLLOUT | POLLERR | POLLHUP;
  if (!c.state.accelerated()) return -1;
  if (c.state.resynced()) {
    // Back on kernel TCP: only bytes still in the ring (or the EOF after
    // them) are ours to report; the kernel socket says the rest.
    bool ring_rx =
        c.state.rx_on_ring() || (c.peer_fence_known.load() && c.kernel_received.load() == c.peer_fence.load());
    if (c.state.rx_resync() == RxResync::kRing && c.peer_fence_known.load() && ring_rx) {
      bool shut = c.peer_shut_wr.load(std::memory_order_acquire);
      if (shut) return POLLIN | POLLOUT | POLLRDHUP;
      if (c.rx_tail.load(std::memory_order_acquire) != c.rx_head.load()) return POLLIN | POLLOUT;
    }
    return -1;
  }
  int r = 0;
  bool ring_rx = c.state.rx_on_ring() || (c.peer_fence_known.load() && c.kernel_received.load() == c.peer_fence.load());
  bool shut = c.peer_shut_wr.load(std::memory_order_acquire);
  if (ring_rx) {
    if (c.rx_tail.load(std::memory_order_acquire) != c.rx_head.load() || shut || c.shut_rd.load()) r |= POLLIN;
  } else {
    // Still reading the kernel stream up to the fence.
    int queued = 0;
    if ((Libc().ioctl(fd, FIONREAD, &queued) == 0 && queued > 0) || shut) r |= POLLIN;
  }
  if (shut) r |= POLLRDHUP;
  uint64_t used = c.tx_tail.load() - c.credit.load();
  if (!c.state.tx_on_ring() || used < c.ring_size || c.peer_gone.load()) r |= POLLOUT;
  if (shut && c.shut_wr.load()) r |= POLLHUP;
  return r;
}

}  // namespace vsocket::guest
