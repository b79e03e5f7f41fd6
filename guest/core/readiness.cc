#include <poll.h>
#include <sys/ioctl.h>

#include "guest/core/direct.h"
#include "guest/core/resync.h"
#include "guest/core/socket_ops.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {

bool RingStreamRead(const Conn& c) {
  if (!(c.state.resynced() || c.state.peer_ring_ended()) || !c.state.ring_final()) return false;
  if (!c.peer_fence_known.load(std::memory_order_acquire) || c.peer_shut_wr.load(std::memory_order_acquire)) return false;
  if (!c.state.rx_on_ring() && c.kernel_received.load() != c.peer_fence.load()) return false;
  uint64_t tail = c.rx_tail.load(std::memory_order_acquire);
  return tail == c.rx_head.load() && tail == c.resync_landed.load(std::memory_order_relaxed);
}

// Whether reads come from the kernel socket again while the connection is
// still upgraded: the peer left the rings (a drain) and its ring stream is
// read (or it never wrote one).
bool RxLeftRing(const Conn& c) {
  if (c.state.rx_resync() != RxResync::kRing) return true;
  if (!c.state.peer_ring_ended()) return false;
  return !c.peer_fence_known.load() || c.rx_head.load() == c.resync_landed.load();
}

bool ProtocolAhead(const Conn& c) {
  switch (c.state.rx_resync()) {
    case RxResync::kHeader:
    case RxResync::kSkip: return true;
    case RxResync::kKernel: return false;
    case RxResync::kRing: break;
  }
  return RingStreamRead(c);
}

bool KernelFeedsReads(const Conn& c) {
  if (!c.state.accelerated()) return false;
  if (ProtocolAhead(c)) return true;
  if (c.state.draining() && !c.state.resynced() && RxLeftRing(c)) return true;
  if (c.state.rx_on_ring()) return false;
  return !(c.peer_fence_known.load() && c.kernel_received.load() == c.peer_fence.load());
}

// What poll says of a reset TCP socket (tcp_poll after tcp_reset).
constexpr int kResetEvents = POLLIN | POLLOUT | POLLERR | POLLHUP | POLLRDHUP;

namespace {

// Under rx_mu: consumes the protocol bytes ahead of the application's on
// the kernel socket, as far as they have arrived (recv.cc takes the same
// steps: the ring stream read to its end, then the header, then what the
// ring gave already). A bad header resets the connection (its next read
// says so); EAGAIN leaves the rest for later.
void SettleLocked(int fd, Conn& c) REQUIRES(c.rx_mu) {
  if (c.state.rx_resync() == RxResync::kRing) {
    if (!RingStreamRead(c)) return;
    if (!c.state.rx_on_ring()) c.state.SwitchRx();  // (at the fence: the ring follows, and it is read)
    if (!c.state.AdvanceRxResync(RxResync::kHeader)) return;
  }
  (void)ConsumeResyncLocked(fd, c);
}

// The bits, once protocol bytes were consumed where they could be: `ahead`
// if some are still to come on the kernel socket.
int ReadinessOf(int fd, Conn& c, bool ahead) {
  if (c.state.reset()) return kResetEvents;
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
    if (!ahead) return -1;
    // The peer's header (or bytes we have) still to come: not readable
    // yet, whatever the kernel socket says; writable as it is.
    pollfd p{fd, POLLOUT, 0};
    return Libc().poll(&p, 1, 0) > 0 ? p.revents & (POLLOUT | POLLERR | POLLHUP) : 0;
  }
  int r = 0;
  bool ring_rx = c.state.rx_on_ring() || (c.peer_fence_known.load() && c.kernel_received.load() == c.peer_fence.load());
  bool shut = c.peer_shut_wr.load(std::memory_order_acquire);
  if (c.state.draining() && RxLeftRing(c)) {
    // The peer left the rings: the kernel socket has the rest (after its
    // RESYNC header, consumed before this says readable), or its EOF.
    pollfd p{fd, POLLIN | POLLRDHUP, 0};
    if (!ahead && Libc().poll(&p, 1, 0) > 0) r |= p.revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR);
  } else if (ring_rx) {
    if (c.rx_tail.load(std::memory_order_acquire) != c.rx_head.load() || shut || c.shut_rd.load()) r |= POLLIN;
  } else {
    // Still reading the kernel stream up to the fence: readable when the
    // kernel socket is (bytes, or its FIN). The peer's end on the rings
    // says nothing of its kernel stream: a peer that never switched to the
    // ring (no FENCE) ends that stream on the kernel socket, and a read
    // before its FIN says EAGAIN (an Apache worker's lingering close spun
    // on poll-readable, read-EAGAIN).
    pollfd p{fd, POLLIN | POLLRDHUP, 0};
    if (Libc().poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR))) r |= POLLIN;
    // The peer's RST (an abortive close) can come before the backend's word
    // of it: the connection is reset, and the next read says ECONNRESET.
    if (p.revents & POLLERR) return kResetEvents;
  }
  if (shut) r |= POLLRDHUP;
  uint64_t used = c.tx_tail.load() - c.credit.load();
  if (c.state.tx_ring_ended()) {
    // Our ring stream ended (a drain): writable once the peer consumed it
    // (the next send moves to kernel TCP).
    if (c.credit.load() >= c.tx_ring_end.load()) r |= POLLOUT;
  } else if (!c.state.tx_on_ring() || used < c.ring_size || c.peer_gone.load()) {
    r |= POLLOUT;
  }
  if (shut && c.shut_wr.load()) r |= POLLHUP;
  return r;
}

}  // namespace

int Readiness(int fd, Conn& c) {
  if (c.state.reset()) return kResetEvents;
  if (!c.state.accelerated()) return -1;
  if (c.direct) PullDirect(c);  // (its counts are in the pair's memory)
  bool ahead = false;
  // (A reader inside consumes them itself: until it has, the kernel
  // socket says readable, and that reader is awake anyway.)
  if (ProtocolAhead(c) && c.rx_mu.try_lock()) {
    MutexLock rx(c.rx_mu, kAdoptLock);
    SettleLocked(fd, c);
    ahead = ProtocolAhead(c);
  }
  return ReadinessOf(fd, c, ahead);
}

int ReadinessRxHeld(int fd, Conn& c) {
  if (c.state.reset()) return kResetEvents;
  if (!c.state.accelerated()) return -1;
  if (c.direct) PullDirect(c);
  bool ahead = false;
  if (ProtocolAhead(c)) {
    SettleLocked(fd, c);
    ahead = ProtocolAhead(c);
  }
  return ReadinessOf(fd, c, ahead);
}

}  // namespace vsocket::guest
