#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <mutex>

#include "base/log.h"
#include "guest/core/conn_state.h"
#include "guest/core/doorbell.h"
#include "guest/core/errors.h"
#include "guest/core/iov.h"
#include "guest/core/registration.h"
#include "guest/core/resync.h"
#include "guest/core/session.h"
#include "guest/core/socket_ops.h"
#include "guest/core/wait.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {

using proto::Message;
using proto::MsgType;
using proto::Reason;


Result<size_t> Recv(int fd, Conn& c, const iovec* iov, int iovcnt, int flags) {
  MaybeReregister(fd, c);
  MaybeMoveBack(c);
  EnsureRegistered(fd, c);
  if (!c.state.registered()) {
    // Not registered: the kernel socket alone, exactly as without us. A
    // held connection may block here only while it cannot register.
    bool sleeper = false;
    if (c.held.load(std::memory_order_relaxed) && !c.nonblocking.load() && !(flags & MSG_DONTWAIT)) {
      sleeper = c.EnterKernelSleep();
      if (!sleeper && c.state.phase() == Phase::kUnprobed) {
        EnsureRegistered(fd, c);  // another thread is registering it: wait for that
        if (c.state.registered()) return Recv(fd, c, iov, iovcnt, flags);
        sleeper = c.EnterKernelSleep();
      }
    }
    MutexLock lock(c.rx_mu);
    ssize_t n = KernelRecvIov(fd, iov, iovcnt, flags);
    if (sleeper) c.LeaveKernelSleep();
    if (n < 0) return Errno(errno, "recvmsg");
    if (!(flags & MSG_PEEK)) {
      c.kernel_received.fetch_add(static_cast<uint64_t>(n));
      NoteKernelIo(c, StreamDetector::Dir::kIn, static_cast<size_t>(n));
    }
    return static_cast<size_t>(n);
  }
  UniqueLock lock(c.rx_mu);
  size_t want = IovLen(iov, iovcnt);
  if (want == 0) {
    // As the kernel: a zero-length recv() still waits until the socket is
    // readable (read() of 0 bytes returns at once; the wrapper handles it).
    if (ReadinessRxHeld(fd, c) < 0) {
      ssize_t n = Libc().recv(fd, nullptr, 0, flags);
      return n < 0 ? Result<size_t>(Errno(errno, "recv")) : Result<size_t>(size_t{0});
    }
    if (c.nonblocking.load() || (flags & MSG_DONTWAIT)) {
      if (ReadinessRxHeld(fd, c) & POLLIN) return size_t{0};
      if (c.session->TryDrain() && (ReadinessRxHeld(fd, c) & POLLIN)) return size_t{0};
      return Errno(EAGAIN, "no data");
    }
    Status st = WaitUntil(
        c,
        // (Run by WaitUntil on this thread, which holds rx_mu throughout;
        // the analysis does not follow a lambda's caller.)
        [&]() NO_THREAD_SAFETY_ANALYSIS {
          int r = ReadinessRxHeld(fd, c);
          return r < 0 || (r & POLLIN);
        },
        -1, 0, -1, true);
    if (!st.ok()) return st;
    return size_t{0};
  }
  bool nonblock = c.nonblocking.load() || (flags & MSG_DONTWAIT);
  bool peek = flags & MSG_PEEK;
  bool waitall = (flags & MSG_WAITALL) && !peek && !nonblock;
  size_t got = 0;
  int64_t deadline = -2;  // SO_RCVTIMEO, looked up when we first have to block
  StallWatch stall;  // (VSOCKET_DEBUG_STALL_S: wait.h)
  for (;;) {
    if (stall.Due()) {
      VS_LOG(kWarn,
             "conn %lu: a recv has gone on for %lld s: %s, rx %s (resync %s), upgraded %d, peer fence %s %llu, kernel "
             "received %llu, gen %u",
             static_cast<unsigned long>(c.id), static_cast<long long>(StallLogNs() / 1000000000),
             ToString(c.state.phase()), c.state.rx_on_ring() ? "on the ring" : "on the kernel socket",
             ToString(c.state.rx_resync()), c.state.upgraded() ? 1 : 0,
             c.peer_fence_known.load() ? "known" : "unknown", static_cast<unsigned long long>(c.peer_fence.load()),
             static_cast<unsigned long long>(c.kernel_received.load()), c.gen.load());
      if (c.session != nullptr) LogStalledWait(c, *c.session);
    }
    if (c.state.reset()) return got ? Result<size_t>(got) : Errno(ECONNRESET, "connection reset");
    if (c.state.resynced() || c.state.rx_resync() != RxResync::kRing) {
      // The link is gone (or the peer left the rings: a drain): the fenced
      // kernel bytes and the ring come first (kRing, below), then the peer's
      // RESYNC header, then kernel TCP.
      RxResync ph = c.state.rx_resync();
      if (ph == RxResync::kRing && !c.peer_fence_known.load(std::memory_order_acquire) && c.state.ring_final()) {
        // The peer never switched (or will reset): all its bytes are on the
        // kernel stream, no header comes.
        c.state.AdvanceRxResync(RxResync::kKernel);
        continue;
      }
      if (ph == RxResync::kHeader || ph == RxResync::kSkip) {
        Status st = ConsumeResyncLocked(fd, c);
        if (st.ok()) continue;
        if (st.sys_errno() != EAGAIN || got || nonblock) return got ? Result<size_t>(got) : Result<size_t>(st);
        Status w = WaitKernel(fd, POLLIN, SO_RCVTIMEO, &deadline);
        if (!w.ok()) return w;
        continue;
      }
      if (ph == RxResync::kKernel) {
        if (got && !waitall) return got;
        iovec part[64];
        int np = SliceIov(iov, iovcnt, got, want - got, part);
        ssize_t n = KernelRecvIov(fd, part, np, flags);
        if (n < 0) return got ? Result<size_t>(got) : Errno(errno, "recvmsg");
        if (!peek) c.kernel_received.fetch_add(static_cast<uint64_t>(n));
        return got + static_cast<size_t>(n);
      }
    }
    if (!c.state.rx_on_ring()) {
      // Snapshot before looking at anything: an event dispatched by another
      // thread after this point changes gen and ends the wait below.
      uint32_t gen = c.gen.load(std::memory_order_acquire);
      bool upgraded = c.state.accelerated();
      bool fence_known = c.peer_fence_known.load(std::memory_order_acquire);
      // Pending, or upgraded with the fence not known: the UPGRADE, FENCE
      // or DOWNGRADE event may be waiting in the event queue, and past the
      // peer's fence the kernel stream can hold a RESYNC header, never data.
      // Look before reading the kernel.
      if (!fence_known && c.state.registered() && c.session != nullptr) {
        Mode before = c.state.mode();
        c.session->Drain();  // waits for a drain another thread is doing, too
        if (c.state.mode() != before || c.peer_fence_known.load(std::memory_order_acquire) || c.state.resynced() ||
            c.state.reset())
          continue;
        if (c.state.peer_ring_ended() && c.state.AdvanceRxResync(RxResync::kKernel)) {
          // The peer left the rings without ever writing into them (a
          // drain): its whole stream is on the kernel socket, no header.
          continue;
        }
      }
      uint64_t limit = want - got;
      if (upgraded && fence_known) {
        uint64_t fence = c.peer_fence.load(std::memory_order_relaxed);
        uint64_t rcvd = c.kernel_received.load();
        if (rcvd > fence) {
          c.state.Apply(ConnEvent::kFail, Reason::kProtocolError);
          return Errno(EPROTO, "peer fence behind bytes received");
        }
        if (rcvd == fence) {
          c.state.SwitchRx();
          continue;
        }
        limit = std::min<uint64_t>(limit, fence - rcvd);
      }
      // Never block inside the kernel here: the peer may switch to the ring
      // at any moment, and only our own wait sees both.
      iovec part[64];
      int np = SliceIov(iov, iovcnt, got, limit, part);
      ssize_t n = KernelRecvIov(fd, part, np, (flags & MSG_PEEK) | MSG_DONTWAIT);
      if (n > 0) {
        if (!peek) c.kernel_received.fetch_add(static_cast<uint64_t>(n));
        got += static_cast<size_t>(n);
        if (!waitall || got == want) return got;
        continue;
      }
      bool kernel_eof = false;
      if (n == 0) {
        if (!upgraded) {
          // Registered, not upgraded: the peer may have switched to the ring
          // and shut down its kernel side before our UPGRADE arrived (across
          // hosts it learns of the pairing first). The backend knows.
          if (!c.state.registered() || c.session == nullptr) return got;
          if (c.session->TryDrain()) continue;
          if (!PairingInFlight(c)) {
            // The backend may have gone while we asked, its last events
            // upgrading (and resyncing) the connection: look again.
            if (c.state.phase() != Phase::kPending || !c.session->alive()) continue;
            return got;  // plain kernel EOF
          }
          kernel_eof = true;  // wait for the UPGRADE (or DOWNGRADE) event
        } else {
          // Another thread may have dispatched the FENCE meanwhile: read the
          // flags again, shutdown first (the backend sends FENCE before it,
          // and the dispatcher's release orders them).
          bool shut = c.peer_shut_wr.load(std::memory_order_acquire);
          if (c.peer_fence_known.load(std::memory_order_acquire)) {
            if (c.kernel_received.load() < c.peer_fence.load()) {
              c.state.Apply(ConnEvent::kFail, Reason::kProtocolError);
              return got ? Result<size_t>(got) : Errno(EPROTO, "kernel stream ended before the fence");
            }
            continue;  // exactly at the fence: the ring follows
          }
          if (shut) return got;  // peer closed without switching: final
          // The peer upgraded: its FENCE or its orderly shutdown is on the way.
          kernel_eof = true;
        }
      } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        if (got) return got;
        return Errno(errno, "recvmsg");
      }
      if (got && !waitall) return got;
      // Events not yet dispatched may already have the fence or shutdown.
      if (c.session->TryDrain()) continue;
      if (c.shut_rd.load()) return got;  // queued data first, then EOF, never block
      if (nonblock) return got ? Result<size_t>(got) : Errno(EAGAIN, "no data");
      if (deadline == -2) deadline = SocketDeadline(fd, SO_RCVTIMEO);
      Status st = WaitUntil(
          c,
          [&] {
            if (c.gen.load(std::memory_order_acquire) != gen || c.state.reset()) return true;
            if (kernel_eof) return false;
            pollfd p{fd, POLLIN, 0};
            return Libc().poll(&p, 1, 0) > 0;
          },
          kernel_eof ? -1 : fd, POLLIN, deadline);
      if (!st.ok() && !c.state.upgraded() && !c.session->alive()) {
        // The backend went away before the upgrade: plain kernel TCP from
        // here on, exactly as if we had never registered.
        lock.unlock();
        if (got) return got;
        ssize_t n = KernelRecvIov(fd, iov, iovcnt, flags);
        if (n < 0) return Errno(errno, "recvmsg");
        if (!peek) c.kernel_received.fetch_add(static_cast<uint64_t>(n));
        return static_cast<size_t>(n);
      }
      if (!st.ok()) return got ? Result<size_t>(got) : Result<size_t>(st);
      continue;
    }
    // Accelerated receive.
    const uint32_t size = c.ring_size;
    uint64_t head = c.rx_head.load(std::memory_order_relaxed);
    bool shut = c.peer_shut_wr.load(std::memory_order_acquire);
    // Acquire pairs with the dispatcher's release of rx_tail, which follows
    // the backend's copy into the ring (ordered by the event queue).
    uint64_t tail = c.rx_tail.load(std::memory_order_acquire);
    if (tail - head > size) {
      c.state.Apply(ConnEvent::kFail, Reason::kProtocolError);
      return Errno(EPROTO, "peer claims more bytes than the ring holds");
    }
    if (tail > head) {
      size_t n = std::min<uint64_t>(tail - head, want - got);
      CopyIovRing<false>(c.rx, size, head, iov, iovcnt, got, n);
      if (peek) return got + n;
      head += n;
      c.rx_head.store(head, std::memory_order_release);
      c.accel_rx.store(c.accel_rx.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);  // (rx_mu's alone)
      if (BusyLoop* loop = ActiveBusyLoop()) c.stream.NoteRingIo(StreamDetector::Dir::kIn, loop);
      // (A direct pair's peer reads our count from the pair's memory:
      // vsocketd has nothing to learn, and a kick would wake it for nothing.)
      if (!c.direct) c.session->NoteConsumed(n, size);
      got += n;
      // Return credit in quarters of the ring, and whenever we caught up, so
      // a sender waiting for space always hears of it. With the doorbell,
      // every count goes to the block (free while the backend polls), and
      // a direct pair's to its memory (direct.h).
      if (c.db != nullptr || c.direct) {
        (void)Announce(c, &proto::DoorbellBlock::consumed, &proto::DoorbellBlock::want_consumed, MsgType::kConsumed,
                       head);
      } else if (head - c.consumed_reported >= size / 4 || head == tail) {
        c.consumed_reported = head;
        (void)c.session->Post({MsgType::kConsumed, 0, proto::ConnCounter{c.id, head}});
      }
      if (!waitall || got == want) return got;
      continue;
    }
    if (shut) return got;  // EOF: every byte before it was delivered
    // Every byte that landed before the link loss, or that the peer wrote
    // before it left the rings (a drain: whether or not our own TX has left
    // them yet), is delivered: the rest follows the peer's RESYNC header on
    // the kernel stream. (RingStreamRead compares the landed count with the
    // tail and head as they are now: an RX_TAIL and the loss dispatched by
    // another thread since `tail` was read must not skip the bytes it
    // brought.)
    if (RingStreamRead(c) && c.state.AdvanceRxResync(RxResync::kHeader)) continue;
    if (got && !waitall) return got;
    if (c.session->TryDrain()) continue;
    if (c.shut_rd.load()) return got;
    if (nonblock) return got ? Result<size_t>(got) : Errno(EAGAIN, "no data");
    if (deadline == -2) deadline = SocketDeadline(fd, SO_RCVTIMEO);
    Status st = WaitUntil(
        c,
        [&] {
          return c.rx_tail.load(std::memory_order_acquire) != tail || c.peer_shut_wr.load() || c.state.reset() ||
                 c.shut_rd.load() || (c.state.resynced() && c.state.ring_final()) ||
                 c.state.peer_ring_ended();
        },
        -1, 0, deadline, true);
    if (!st.ok()) return got ? Result<size_t>(got) : Result<size_t>(st);
  }
}

Result<int> Readable(int fd, Conn& c) {
  int kernel = 0;
  if (!c.state.accelerated()) {
    if (Libc().ioctl(fd, FIONREAD, &kernel) != 0) return Errno(errno, "ioctl FIONREAD");
    return kernel;
  }
  if (c.session) c.session->TryDrain();
  int ready = Readiness(fd, c);  // (consumes protocol bytes ahead on the kernel socket, if it can)
  if (Libc().ioctl(fd, FIONREAD, &kernel) != 0) return Errno(errno, "ioctl FIONREAD");
  // None of the application's bytes before the peer's RESYNC header.
  if (ProtocolAhead(c)) return 0;
  // Its stream goes on on the kernel socket (a drain or a loss, the ring
  // read to its end and the header consumed).
  if (c.state.rx_resync() == RxResync::kKernel || (c.state.resynced() && ready < 0)) return kernel;
  if (!c.state.rx_on_ring()) {
    if (c.peer_fence_known.load()) {
      uint64_t left = c.peer_fence.load() - std::min(c.peer_fence.load(), c.kernel_received.load());
      if (left > 0) return static_cast<int>(std::min<uint64_t>(left, kernel));
    } else {
      return kernel;
    }
  }
  return static_cast<int>(c.rx_tail.load() - c.rx_head.load());
}

}  // namespace vsocket::guest
