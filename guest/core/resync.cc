#include "guest/core/resync.h"

#include <poll.h>
#include <sys/socket.h>

#include <mutex>
#include <span>
#include <vector>

#include "base/clock.h"
#include "base/log.h"
#include "guest/core/conn_state.h"
#include "guest/core/direct.h"
#include "guest/core/errors.h"
#include "guest/core/registration.h"
#include "guest/core/fd_table.h"
#include "guest/core/iov.h"
#include "guest/core/session.h"
#include "guest/core/wait.h"
#include "guest/core/writer.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {

using proto::Message;
using proto::MsgType;
using proto::Reason;

// Ends the kernel connection with an RST but keeps the fd (connect with
// AF_UNSPEC disconnects): the peer's next call fails with ECONNRESET, so it
// never reads anything ambiguous as data.
void ResetKernel(int fd, Conn& c) {
  sockaddr sa{};
  sa.sa_family = AF_UNSPEC;
  (void)Libc().connect(fd, &sa, sizeof(sa));
  c.state.Apply(ConnEvent::kFail, Reason::kFabricDown);
}

namespace {

// Under tx_mu: what is owed is our TX ring's bytes [from, tail), after a
// RESYNC header saying `from` if `header`.
void FillResendLocked(Conn& c, uint64_t from, uint64_t tail, bool header) REQUIRES(c.tx_mu) {
  size_t hdr = header ? proto::kResyncHeaderSize : 0;
  c.resend.resize(hdr + (tail - from));
  if (header) proto::EncodeResync(from, c.resend.data());
  iovec v{c.resend.data() + hdr, static_cast<size_t>(tail - from)};
  CopyIovRing<false>(c.tx, c.ring_size, from, &v, 1, 0, tail - from);
  c.resend_off = 0;
  c.resent_bytes.fetch_add(tail - from, std::memory_order_relaxed);
}

// Our ring stream from byte `from` goes on on the kernel socket right after
// the bytes we sent there before our FENCE, with no header: the peer reads
// its kernel socket as plain kernel TCP. Two cases: its process forked
// (decision 85: it dropped the part of our ring stream it had not read, so
// `from` is what it consumed: between our credit and our tail, still in
// our TX ring), or it never got our FENCE (decision 124: `from` is 0, and
// our credit is 0).
bool PrepareHeaderlessResendLocked(Conn& c, int fd, uint64_t from, const char* why) REQUIRES(c.tx_mu) {
  uint64_t credit = c.credit.load(std::memory_order_acquire);
  uint64_t tail = c.tx_tail.load(std::memory_order_relaxed);
  if (from < credit || from > tail || tail - from > c.ring_size || (from < tail && c.tx == nullptr) ||
      (from < tail && c.shut_wr.load() && !c.shut_after_resend)) {
    VS_LOG(kWarn, "conn %lu: cannot resend from %lu (credit %lu, tail %lu) (%s): connection reset",
           static_cast<unsigned long>(c.id), static_cast<unsigned long>(from), static_cast<unsigned long>(credit),
           static_cast<unsigned long>(tail), why);
    ResetKernel(fd, c);
    return false;
  }
  FillResendLocked(c, from, tail, /*header=*/false);
  VS_LOG(kInfo, "conn %lu: %s: back on kernel TCP, resending %lu bytes from %lu with no header",
         static_cast<unsigned long>(c.id), why, static_cast<unsigned long>(tail - from),
         static_cast<unsigned long>(from));
  return true;
}

}  // namespace

// Under tx_mu: decides, once, what this side owes the peer on the kernel
// socket. False if the connection had to be reset.
bool PrepareResendLocked(Conn& c, int fd) {
  if (c.tx_resync_started) return !c.state.reset();
  c.tx_resync_started = true;
  // Never switched: the kernel stream simply goes on, and the peer (which
  // never got our FENCE) expects no header.
  if (!c.state.tx_on_ring()) return true;
  if (Reason why = c.resend_headerless.load(std::memory_order_relaxed); why != Reason::kNone)
    return PrepareHeaderlessResendLocked(c, fd, c.resend_from.load(std::memory_order_relaxed),
                                         why == Reason::kDirectUnavailable ? "the peer could not map the direct pair"
                                                                           : "the peer forked");
  // A direct pair the peer never mapped, and now never will (decision
  // 135): it reads its kernel socket as plain kernel TCP, so our ring
  // stream follows our kernel bytes from byte 0 with no header.
  if (c.direct && c.direct->ClosePeerAttach())
    return PrepareHeaderlessResendLocked(c, fd, 0, "the peer never mapped the direct pair");
  // A direct pair: switched means our FENCE is in the pair's memory, where
  // the peer takes it before it leaves (CloseDirectFence, decision 134).
  bool acked = c.resync_fence_acked.load() || static_cast<bool>(c.direct);
  if (!acked && c.fence_unread.load(std::memory_order_relaxed))
    return PrepareHeaderlessResendLocked(c, fd, 0, "the backend went before it took our FENCE");
  if (!acked) {
    // The peer may not know where our kernel bytes end, so it could not
    // tell our header from data: reset rather than guess.
    VS_LOG(kWarn, "conn %lu: fabric link lost before the peer confirmed our fence: connection reset",
           static_cast<unsigned long>(c.id));
    ResetKernel(fd, c);
    return false;
  }
  // After our FIN nothing more can follow; a peer that misses bytes sees
  // ECONNRESET (it waits for a header that never comes).
  if (c.shut_wr.load() && !c.shut_after_resend) return true;
  // Every byte the peer has not consumed is still in our TX ring (credits
  // are consumption-based); it skips what already landed in its RX ring.
  uint64_t from = c.credit.load(std::memory_order_acquire);
  uint64_t tail = c.tx_tail.load(std::memory_order_relaxed);
  if (from > tail || tail - from > c.ring_size || c.tx == nullptr) {
    ResetKernel(fd, c);
    return false;
  }
  FillResendLocked(c, from, tail, /*header=*/true);
  VS_LOG(kInfo, "conn %lu: %s: back on kernel TCP, resending %lu bytes from %lu", static_cast<unsigned long>(c.id),
         c.state.draining() && !c.state.drain_broken() ? "drained" : "accelerated path lost",
         static_cast<unsigned long>(tail - from), static_cast<unsigned long>(from));
  return true;
}

// Under tx_mu: writes what is owed without blocking. Ok once it is all in
// the kernel, EAGAIN while the socket is full.
Status FlushResendLocked(Conn& c, int fd) {
  if (!PrepareResendLocked(c, fd)) return Errno(ECONNRESET, "connection reset (fabric link lost)");
  while (c.resend_off < c.resend.size()) {
    ssize_t w =
        Libc().send(fd, c.resend.data() + c.resend_off, c.resend.size() - c.resend_off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w > 0) {
      c.resend_off += static_cast<size_t>(w);
      // Every byte on the kernel stream counts: a later FENCE (after a
      // re-upgrade) is a position in that stream.
      c.kernel_sent.fetch_add(static_cast<uint64_t>(w), std::memory_order_relaxed);
      // (A header, or bytes the ring already counted in accel_tx.)
      c.kernel_tx_repeat.fetch_add(static_cast<uint64_t>(w), std::memory_order_relaxed);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Errno(EAGAIN, "resend pending");
    int e = w < 0 ? errno : EPIPE;
    c.state.Apply(ConnEvent::kFail, Reason::kFabricDown);
    return Errno(e, "resend");
  }
  if (!c.resend.empty()) {
    std::vector<uint8_t>().swap(c.resend);
    c.resend_off = 0;
  }
  if (c.shut_after_resend) {
    c.shut_after_resend = false;
    (void)Libc().shutdown(fd, SHUT_WR);
  }
  return Status::Ok();
}

// Under tx_mu: send() once the link is gone: the owed resend first, then
// plain kernel TCP.
Result<size_t> SendResynced(int fd, Conn& c, const iovec* iov, int iovcnt, int flags) {
  bool nonblock = c.nonblocking.load() || (flags & MSG_DONTWAIT);
  int64_t deadline = -2;
  for (;;) {
    Status st = FlushResendLocked(c, fd);
    if (st.ok()) break;
    if (st.sys_errno() != EAGAIN || nonblock) return st;
    Status w = WaitKernel(fd, POLLOUT, SO_SNDTIMEO, &deadline);
    if (!w.ok()) return w;
  }
  if (c.shut_wr.load()) return BrokenPipe(flags, "shut down for writing");
  ssize_t n = KernelSendIov(fd, iov, iovcnt, flags);
  if (n < 0) return Errno(errno, "sendmsg");
  c.kernel_sent.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
  return static_cast<size_t>(n);
}

// Under rx_mu: consumes the peer's RESYNC header and the bytes it resends
// that already landed in our ring. Ok when done; EAGAIN when the kernel has
// nothing more yet.
Status ConsumeResyncLocked(int fd, Conn& c) {
  using RxResync = RxResync;
  for (;;) {
    RxResync ph = c.state.rx_resync();
    if (ph == RxResync::kKernel) return Status::Ok();
    uint8_t scratch[4096];
    uint8_t* dst = ph == RxResync::kHeader ? c.rx_hdr + c.rx_hdr_got : scratch;
    size_t want = ph == RxResync::kHeader ? proto::kResyncHeaderSize - c.rx_hdr_got
                                          : std::min<uint64_t>(sizeof(scratch), c.rx_skip);
    ssize_t n = Libc().recv(fd, dst, want, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Errno(EAGAIN, "resync pending");
    if (n == 0 && ph == RxResync::kHeader && c.rx_hdr_got == 0 && c.state.peer_ring_ended()) {
      // The peer closed right after it left the rings (a drain): its FIN
      // where its header would be, after every byte of its ring stream
      // (all delivered: the ring end came after them). Nothing is missing:
      // the EOF is the application's.
      c.state.AdvanceRxResync(RxResync::kKernel);
      return Status::Ok();
    }
    if (n <= 0) {
      // The peer could not resend (it had shut down, or reset): bytes are
      // missing, so this is an error, never a short stream.
      c.state.Apply(ConnEvent::kFail, Reason::kFabricDown);
      return Errno(n == 0 ? ECONNRESET : errno, "fabric link lost and the peer could not resend");
    }
    c.kernel_received.fetch_add(static_cast<uint64_t>(n));  // stream position, as the peer counts it
    c.kernel_rx_repeat.fetch_add(static_cast<uint64_t>(n));  // (a header, or bytes our ring gave already)
    if (ph == RxResync::kHeader) {
      c.rx_hdr_got += static_cast<uint32_t>(n);
      if (c.rx_hdr_got < proto::kResyncHeaderSize) continue;
      auto from =
          proto::DecodeResync(std::span<const uint8_t, proto::kResyncHeaderSize>(c.rx_hdr, proto::kResyncHeaderSize));
      uint64_t landed = c.resync_landed.load();
      if (!from.ok() || *from > landed || landed - *from > c.ring_size) {
        ResetKernel(fd, c);
        return Errno(EPROTO, "bad RESYNC header from the peer");
      }
      c.rx_skip = landed - *from;
      c.state.AdvanceRxResync(c.rx_skip ? RxResync::kSkip : RxResync::kKernel);
    } else {
      c.rx_skip -= static_cast<uint64_t>(n);
      if (c.rx_skip == 0) c.state.AdvanceRxResync(RxResync::kKernel);
    }
  }
}

// A connection that finished its RESYNC both ways (our resend is in the
// kernel, the peer's header is read) leaves its old registration and
// registers again, so it re-upgrades once the link is back (the backend
// pairs it when the peer registers again too; until then it is an ordinary
// pending connection on kernel TCP). Never blocks: if another thread is
// inside a send or receive, a later call does it.
// RX is done with the old registration: on kernel TCP, or (a drain) the peer
// left the rings without ever writing into them (no header comes: a
// sender that never reads need not read to find that out).
bool RxDone(const Conn& c) {
  if (c.state.rx_resync() == RxResync::kKernel) return true;
  return c.state.rx_resync() == RxResync::kRing && c.state.peer_ring_ended() &&
         !c.peer_fence_known.load(std::memory_order_acquire);
}

void MaybeReregister(int fd, Conn& c) {
  Phase phase = c.state.phase();
  if (phase == Phase::kWithdrawn) {
    if (c.setup_mu.try_lock()) {
      MutexLock setup(c.setup_mu, kAdoptLock);
      EndWithdrawnLocked(c);
    }
    return;
  }
  if (phase != Phase::kResyncing || !RxDone(c) || c.resync_fd.load() >= 0 || c.shut_wr.load() ||
      c.shut_rd.load() || c.peer_shut_wr.load() || c.peer_gone.load())
    return;
  if (!c.setup_mu.try_lock()) return;
  MutexLock setup(c.setup_mu, kAdoptLock);
  if (!c.tx_mu.try_lock()) return;
  MutexLock tx(c.tx_mu, kAdoptLock);
  if (!c.rx_mu.try_lock()) return;
  MutexLock rx(c.rx_mu, kAdoptLock);
  if (c.state.phase() != Phase::kResyncing || !RxDone(c) || !c.tx_resync_started ||
      !c.resend.empty() || c.session == nullptr)
    return;
  Session* s = c.session;
  // A backend that went away forgot the registration with everything else
  // (also one that went while we asked: a VM that arrived elsewhere hears
  // so while its UNREGISTER waits, decision 094).
  if (s->alive() && !s->Unregister(c).ok() && s->alive()) {
    c.state.Apply(ConnEvent::kKernelForGood, Reason::kBackendUnavailable);
    return;
  }
  c.session = nullptr;
  // Off the rings both ways: a lost session may give its memory back.
  if (!s->alive()) s->ReleaseIfUnused();
  RetireDirect(c);
  // Drained because its busy loop went quiet (decision 92): held again,
  // not registered again at once (the pause before it may qualify doubles
  // with each move: no flapping).
  bool hold_again = c.held.load(std::memory_order_relaxed) &&
                    c.stream.cause() == StreamDetector::Cause::kBusyLoop &&
                    c.drain_reason.load(std::memory_order_relaxed) == Reason::kKernelFaster;
  if (Reason why = c.resend_headerless.load(std::memory_order_relaxed); why != Reason::kNone) {
    // The peer's process forked (decision 85), or it could not map our
    // direct pair (decision 135): its end stays on kernel TCP for good, so
    // ours would wait for it in vain.
    c.state.Apply(ConnEvent::kKernelForGood, why);
    VS_LOG(kInfo, "conn %lu: resynced on kernel TCP; the peer %s, so it stays there", static_cast<unsigned long>(c.id),
           why == Reason::kForked ? "forked" : "could not map the direct pair");
    return;
  }
  // A fresh accelerated state; the kernel byte counts go on (fences are
  // positions in the kernel stream). The phase changes last: a thread that
  // sees it unprobed registers the connection again.
  c.tx_tail.store(0);
  c.rx_head.store(0);
  c.consumed_reported = 0;
  c.wrote_after_peer_gone = false;
  c.peer_fence_known.store(false);
  c.peer_fence.store(0);
  c.rx_tail.store(0);
  c.credit.store(0);
  c.resync_fence_acked.store(false);
  c.fence_delivered.store(false);
  c.fence_seq.store(0);
  c.fence_unread.store(false);
  c.resync_landed.store(0);
  c.resend_headerless.store(Reason::kNone);
  c.resend_from.store(0);
  c.tx_resync_started = false;
  c.shut_after_resend = false;
  c.rx_hdr_got = 0;
  c.rx_skip = 0;
  c.tx_ring_end.store(0);  // (the drain's steps start afresh with the phase: kResynced)
  c.move_back_asked.store(false);
  c.quiet_turns_mark.store(0);
  if (hold_again) c.stream.HoldAgain(MonotonicNs());
  c.state.Apply(ConnEvent::kResynced);
  if (hold_again) {
    VS_LOG(kDebug, "conn %lu: back on kernel TCP, held again (its event loop is no longer busy)",
           static_cast<unsigned long>(c.id));
    return;
  }
  c.reupgrades.fetch_add(1, std::memory_order_relaxed);
  VS_LOG(kInfo, "conn %lu: resynced on kernel TCP; registering again to re-upgrade", static_cast<unsigned long>(c.id));
}

// Under tx_mu, while a drain is under way (connection-lifecycle.md §9):
// ends our ring stream once (SHUTDOWN ring end at the TX tail; nothing more
// goes into the ring) and, once the peer consumed all of it, moves TX to
// kernel TCP: the phase goes resyncing with nothing to resend, and the
// RESYNC header (from = our ring end) goes first on the kernel socket. The
// peer reads its ring to our end, then that header: had vsocketd died
// meanwhile, the same header would carry a resend, so the receiver never
// has to guess which one comes. True once TX is on kernel TCP.
bool DrainTxLocked(Conn& c) {
  if (c.state.resynced()) return true;
  if (!c.state.draining() || c.state.phase() != Phase::kUpgraded || c.shut_wr.load()) return false;
  if (!c.state.tx_ring_ended()) {
    Session* s = c.session;
    if (s == nullptr || !s->alive()) return false;  // BackendLost moves it on
    PublishDirectRingEnd(c, c.tx_tail.load(std::memory_order_relaxed));
    if (!s->Post({MsgType::kShutdown, 0, proto::Shutdown{c.id, proto::ShutdownHow::kRingEnd}}).ok()) return false;
    c.tx_ring_end.store(c.tx_tail.load(std::memory_order_relaxed), std::memory_order_relaxed);
    c.state.ApplyDrain(DrainEvent::kTxRingEnd);
  }
  uint64_t end = c.tx_ring_end.load(std::memory_order_relaxed);
  if (c.credit.load(std::memory_order_acquire) < end) return false;
  bool switched = c.state.tx_on_ring();
  // A header is safe only where the peer knows our fence: it consumed a
  // byte of our ring, or the backend said it has the FENCE.
  if (switched && end == 0 && !c.fence_delivered.load(std::memory_order_acquire)) return false;
  c.resync_fence_acked.store(switched, std::memory_order_relaxed);
  if (!c.state.Apply(ConnEvent::kDrained, c.drain_reason.load(std::memory_order_relaxed))) return false;
  c.gen.fetch_add(1, std::memory_order_acq_rel);
  if (c.session != nullptr) c.session->WakeWaiters();
  VS_LOG(kDebug, "conn %lu: drained: TX on kernel TCP after %lu ring bytes", static_cast<unsigned long>(c.id),
         static_cast<unsigned long>(end));
  return true;
}

void StartResync(const std::shared_ptr<Conn>& c) {
  c->resync_start_ns = MonotonicNs();
  // The application may close and reuse fd numbers: the fd must name c on
  // both sides of the dup.
  int fd = c->fd_hint;
  if (fd < 0 || Lookup(fd).get() != c.get()) return;  // its sends (or its close) flush it
  HandToWriter(c, fd);
  if (Lookup(fd).get() != c.get()) {
    int mine = c->resync_fd.exchange(-1);
    if (mine >= 0) CloseWriterFd(mine);  // the writer drops a conn without fd
  }
}

}  // namespace vsocket::guest
