#include "guest/core/close.h"

#include <errno.h>
#include <sys/socket.h>

#include "base/clock.h"
#include "guest/core/conn_state.h"
#include "guest/core/direct.h"
#include "guest/core/errors.h"
#include "guest/core/registration.h"
#include "guest/core/report.h"
#include "guest/core/resync.h"
#include "guest/core/session.h"
#include "guest/core/socket_ops.h"
#include "guest/core/writer.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {

using proto::Message;
using proto::MsgType;
using proto::Reason;

void Teardown(int fd, const std::shared_ptr<Conn>& self, bool still_open, const char* event) {
  Conn& c = *self;
  MutexLock lock(c.setup_mu);
  EndWithdrawnLocked(c);
  Session* s = c.session;
  // A backend that went away unnoticed: its connections resync first (the
  // FIN must not overtake bytes only the backend had).
  if (s != nullptr && c.state.registered()) s->CheckBackend();
  bool registered = c.state.registered() && s != nullptr;
  bool abortive = false, lingering = false, awaiting_fin = false;
  if (registered && s->alive() && c.state.upgraded()) {
    // The kernel answers close() with RST when unread data is discarded or
    // SO_LINGER is {on, 0}: the peer then sees ECONNRESET, not EOF.
    linger lg{};
    socklen_t len = sizeof(lg);
    abortive =
        (still_open && getsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, &len) == 0 && lg.l_onoff && lg.l_linger == 0) ||
        c.rx_tail.load() != c.rx_head.load();
    // (After dup2/dup3 onto it the socket is gone already: no linger.)
    if (!abortive && still_open) lingering = Linger(fd, c);
    if (!abortive && !lingering) {
      MutexLock tx(c.tx_mu);
      FenceBeforeEndLocked(c);
    }
    if (!abortive && !lingering && still_open) awaiting_fin = AwaitPeerFin(fd, c);
  }
  // Now, even for a connection that lingers (the process may exit first),
  // and before its linger starts: the writer changes what it reports.
  Report(c, event);
  if (lingering || awaiting_fin) Enqueue(self);
  if (still_open && !lingering && c.state.resynced()) {
    // Back on kernel TCP after a link loss: the bytes still owed to the
    // peer leave the TX ring before it is freed, and the writer finishes
    // sending them after this close (as the kernel does with its buffer).
    MutexLock tx(c.tx_mu);
    if (PrepareResendLocked(c, fd) && c.resend_off < c.resend.size()) HandToWriter(self, fd);
  }
  if (!registered || lingering) return;  // (a linger unregisters when it ends)
  if (abortive) Aborted(c);
  else Unregistered(c);
}

// close() of a connection whose peer has not consumed all we wrote
// accelerated. The kernel goes on sending its buffer after close(); here
// the backend delivers those bytes, and a link loss before they are
// consumed needs a resend on the kernel socket (RESYNC), which the FIN of
// a plain close() would forbid. So the connection lingers: the EOF goes
// the accelerated way (SHUTDOWN), the registration stays, and the
// background writer keeps a dup of the socket (no FIN yet) until the peer
// consumed everything; then UNREGISTER and the FIN. If the link dies
// first, the writer resends through the dup, FIN after it. Bounded by
// kResendLimitNs; ends at once if the peer is gone or the session lost.
// A process that exits meanwhile closes the dup (as before: the backend
// still delivers over a live link), but first its exit handler waits a
// little for what only this process can still send: a resend after the
// backend died (FinishLingersAtExit, decision 136).
bool Linger(int fd, Conn& c) {
  if (c.direct && c.state.accelerated() && !c.state.reset() && !c.state.resynced() && c.direct->PeerAttached()) {
    // A direct pair's bytes are in memory the peer maps as long as it
    // lives: nothing to keep the registration for. Our EOF follows them.
    // (A peer that has not mapped it yet may never: it could not (decision
    // 135), and then our bytes go on the kernel socket, before our FIN.
    // That case lingers as through vsocketd, until the peer mapped it.)
    PublishDirectShutWr(c);
    return false;
  }
  if (c.state.reset() || c.state.resynced() || c.peer_gone.load() || !c.state.accelerated() || !c.state.tx_on_ring())
    return false;
  if (c.credit.load(std::memory_order_acquire) >= c.tx_tail.load(std::memory_order_relaxed)) return false;
  if (!c.shut_wr.load() && !ShutdownSetupHeld(fd, c, SHUT_WR).ok()) return false;
  {
    MutexLock tx(c.tx_mu);
    // The FIN went out already (everything consumed meanwhile), or follows
    // a resend already under way: nothing to wait for.
    if (!c.shut_after_resend || c.tx_resync_started) return false;
  }
  int mine = DupForWriter(fd);
  if (mine < 0) return false;
  c.linger_start_ns = MonotonicNs();
  if (!c.state.Apply(ConnEvent::kLinger)) {
    CloseWriterFd(mine);  // the link was lost meanwhile: the resend path takes it
    return false;
  }
  c.linger_fd.store(mine);
  return true;  // the caller hands it to the writer
}

// close() of a connection whose peer closed first: its EOF came by the ring,
// its kernel FIN is on its way (a peer library sends it once we consumed
// its bytes, or at once when we unregister). Closing the socket now would
// send our FIN first and leave TIME_WAIT here instead of at the peer (a
// client of short connections runs out of ephemeral ports): the writer
// keeps a dup until the peer's FIN arrives, at most kAwaitFinNs, and
// closes it then.
bool AwaitPeerFin(int fd, Conn& c) {
  if (!c.peer_shut_wr.load() || c.shut_wr.load() || c.state.resynced() || !c.state.rx_on_ring()) return false;
  char b;
  ssize_t r = Libc().recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  if (r >= 0 || errno != EAGAIN) return false;  // the FIN (or data, or an error) is here: nothing to wait for
  int mine = DupForWriter(fd);
  if (mine < 0) return false;
  c.await_fin_start_ns = MonotonicNs();
  c.await_fin_fd.store(mine);
  return true;
}

namespace {

// shutdown(2) up to the SHUTDOWN to the backend: true (and *out) if that is
// all; else *defer_fin says whether the kernel FIN waits.
bool ShutdownKernel(int fd, Conn& c, int how, Status* out, bool* defer_fin) EXCLUDES(c.tx_mu) {
  *out = Status::Ok();
  bool wr = how == SHUT_WR || how == SHUT_RDWR;
  if (wr && c.state.resynced()) {
    // Bytes still owed to the peer after a link loss go before our FIN.
    MutexLock lock(c.tx_mu);
    if (!c.shut_wr.load() && PrepareResendLocked(c, fd) && c.resend_off < c.resend.size()) {
      c.shut_after_resend = true;
      c.shut_wr.store(true);
      if (how == SHUT_RDWR) {
        c.shut_rd.store(true);
        if (Libc().shutdown(fd, SHUT_RD) != 0) {
          *out = Errno(errno, "shutdown");
          return true;
        }
      }
      if (c.session != nullptr) c.session->WakeWaiters();
      return true;
    }
  }
  bool first_wr = wr && !c.shut_wr.exchange(true);
  if (how == SHUT_RD || how == SHUT_RDWR) c.shut_rd.store(true);
  // Writing accelerated: the kernel FIN may wait. Until the peer has
  // consumed what we wrote, a link loss makes us resend it on the kernel
  // socket (RESYNC), which a FIN already sent would forbid; the peer
  // learns our EOF on the accelerated path meanwhile.
  *defer_fin = first_wr && c.state.tx_on_ring() && c.state.accelerated() && !c.state.resynced();
  int kernel_how = *defer_fin ? (how == SHUT_RDWR ? SHUT_RD : -1) : how;
  // The kernel shutdown first: it also ends a sender blocked in the kernel,
  // and the flags end one waiting for ring space, so tx_mu frees up.
  if (kernel_how >= 0 && Libc().shutdown(fd, kernel_how) != 0) {
    *out = Errno(errno, "shutdown");
    return true;
  }
  if (Session* s = c.session; s != nullptr) s->WakeWaiters();
  return !first_wr;
}

// The SHUTDOWN (write) to the backend of a registered connection. A
// registration another thread has under way says "registered" before its
// REGISTER_CONN leaves (its socket proof goes first): a SHUTDOWN posted
// meanwhile would reach vsocketd ahead of it, be dropped as naming no
// connection, and the peer, once paired, would wait on the rings for an EOF
// that never comes. It waits for the registration's answer: the caller
// holds setup_mu.
void ShutWrToBackendLocked(int fd, Conn& c, bool defer_fin) REQUIRES(c.setup_mu) EXCLUDES(c.tx_mu) {
  Session* s = c.session;
  if (c.state.registered() && s != nullptr) {
    // Under tx_mu: after every TX_TAIL a concurrent sender may still post.
    MutexLock lock(c.tx_mu);
    if (defer_fin) {
      if (c.tx_resync_started) {
        // A link loss came first: the FIN follows its resend, if any is owed.
        if (c.resend_off < c.resend.size()) c.shut_after_resend = true;
        else (void)Libc().shutdown(fd, SHUT_WR);
      } else if (c.credit.load(std::memory_order_acquire) >= c.tx_tail.load(std::memory_order_relaxed)) {
        (void)Libc().shutdown(fd, SHUT_WR);  // all consumed: nothing could need a resend
      } else {
        c.shut_after_resend = true;  // FIN after a RESYNC's resend, or at close()
        c.fin_deferred.store(true, std::memory_order_relaxed);
      }
    }
    FenceBeforeEndLocked(c);
    PostShutWr(c);
  } else if (defer_fin) {
    (void)Libc().shutdown(fd, SHUT_WR);
  }
}

}  // namespace

Status Shutdown(int fd, Conn& c, int how) {
  Status st;
  bool defer_fin = false;
  if (ShutdownKernel(fd, c, how, &st, &defer_fin)) return st;
  MutexLock registering(c.setup_mu);
  ShutWrToBackendLocked(fd, c, defer_fin);
  return Status::Ok();
}

Status ShutdownSetupHeld(int fd, Conn& c, int how) {
  Status st;
  bool defer_fin = false;
  if (ShutdownKernel(fd, c, how, &st, &defer_fin)) return st;
  ShutWrToBackendLocked(fd, c, defer_fin);
  return Status::Ok();
}

}  // namespace vsocket::guest
