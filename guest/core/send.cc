#include <sys/sendfile.h>
#include <sys/socket.h>

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

Result<size_t> Send(int fd, Conn& c, const iovec* iov, int iovcnt, int flags) {
  if ((flags & MSG_OOB) && !NoteUrgent(c)) return Errno(EOPNOTSUPP, "MSG_OOB on a registered connection");
  MaybeReregister(fd, c);
  MaybeMoveBack(c);
  EnsureRegistered(fd, c);
  MutexLock lock(c.tx_mu);
  if (c.state.reset()) return Errno(ECONNRESET, "connection reset");
  // A sender that never reads must still hear what ends its resync: the
  // peer's ring end (a drain: the peer left the rings without writing
  // into them) and its session's loss (a VM that arrived at another host,
  // decision 094). Without it such a connection never registered again and
  // stayed on kernel TCP until it closed (the next send registers it).
  if (c.state.phase() == Phase::kResyncing && c.session != nullptr && !RxDone(c)) c.session->TryDrain();
  if (c.state.resynced()) return SendResynced(fd, c, iov, iovcnt, flags);
  // A sender that never reads must still hear its UPGRADE.
  if (c.state.phase() == Phase::kPending && c.session) c.session->TryDrain();
  // A drain: our ring stream ends; kernel TCP once the peer consumed it.
  if (c.state.draining() && DrainTxLocked(c)) return SendResynced(fd, c, iov, iovcnt, flags);
  if (c.state.accelerated() && !c.state.tx_on_ring() && !c.state.tx_ring_ended()) {
    // Switch-over: from here on this direction uses the ring; the peer reads
    // exactly kernel_sent bytes from its kernel socket first.
    Status sw = SwitchTxLocked(c);
    // (A direct peer that left the pair first: the kernel stream goes on.)
    if (!sw.ok() && sw.code() != Code::kAlreadyExists) {
      // Not switched: if the backend is gone, the kernel stream just goes on.
      if (!c.session->CheckBackend() && c.state.resynced()) return SendResynced(fd, c, iov, iovcnt, flags);
      c.state.Apply(ConnEvent::kFail, Reason::kBackendUnavailable);
      return Errno(ECONNRESET, "connection reset");
    }
  }
  if (!c.state.tx_on_ring()) {
    ssize_t n = KernelSendIov(fd, iov, iovcnt, flags);
    if (n < 0) {
      VS_LOG(kDebug, "fd %d conn %lu (%s): kernel send: %m", fd, static_cast<unsigned long>(c.id),
             ToString(c.state.phase()));
      return Errno(errno, "sendmsg");
    }
    c.kernel_sent.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    NoteKernelIo(c, StreamDetector::Dir::kOut, static_cast<size_t>(n));
    return static_cast<size_t>(n);
  }
  size_t total = IovLen(iov, iovcnt);
  if (c.shut_wr.load()) return BrokenPipe(flags, "shut down for writing");  // even for 0 bytes
  bool nonblock = c.nonblocking.load() || (flags & MSG_DONTWAIT);
  size_t sent = 0;
  const uint32_t size = c.ring_size;
  int64_t deadline = -2;  // looked up when we first have to block
  StallWatch stall;  // (VSOCKET_DEBUG_STALL_S: wait.h)
  while (sent < total) {
    if (stall.Due()) {
      VS_LOG(kWarn, "conn %lu: a send has gone on for %lld s: %s, %zu of %zu bytes sent, tx %s, ring %u, credit %llu",
             static_cast<unsigned long>(c.id), static_cast<long long>(StallLogNs() / 1000000000),
             ToString(c.state.phase()), sent, total, c.state.tx_on_ring() ? "on the ring" : "on the kernel socket",
             size, static_cast<unsigned long long>(c.credit.load()));
      if (c.session != nullptr) LogStalledWait(c, *c.session);
    }
    if (c.state.reset()) return sent ? Result<size_t>(sent) : Errno(ECONNRESET, "connection reset");
    if (c.state.resynced()) return sent ? Result<size_t>(sent) : SendResynced(fd, c, iov, iovcnt, flags);
    if (c.shut_wr.load()) return sent ? Result<size_t>(sent) : BrokenPipe(flags, "shut down for writing");
    if (c.peer_gone.load(std::memory_order_acquire)) {
      if (sent) return sent;
      // As over TCP: the first write after the peer closed still "succeeds"
      // (the kernel would send it and get an RST back); later ones fail.
      if (!c.wrote_after_peer_gone) {
        c.wrote_after_peer_gone = true;
        return total;
      }
      return BrokenPipe(flags, "peer closed");
    }
    uint32_t gen = c.gen.load(std::memory_order_acquire);
    if (c.state.draining()) {
      if (DrainTxLocked(c)) return sent ? Result<size_t>(sent) : SendResynced(fd, c, iov, iovcnt, flags);
      if (c.state.reset()) continue;
    }
    uint64_t tail = c.tx_tail.load(std::memory_order_relaxed);
    uint64_t credit = c.credit.load(std::memory_order_acquire);
    if (credit > tail) {
      c.state.Apply(ConnEvent::kFail, Reason::kProtocolError);
      return Errno(EPROTO, "credit beyond what was sent");
    }
    // (Our ring stream ended: wait for the peer to consume it, as for room.)
    bool ended = c.state.tx_ring_ended();
    uint64_t space = ended ? 0 : size - (tail - credit);
    if (space == 0) {
      if (c.session->TryDrain()) continue;  // a credit may be waiting
      if (nonblock) return sent ? Result<size_t>(sent) : Errno(EAGAIN, "ring full");
      if (deadline == -2) deadline = SocketDeadline(fd, SO_SNDTIMEO);
      Status st = WaitUntil(
          c,
          [&] {
            return c.credit.load(std::memory_order_acquire) != credit || c.state.reset() || c.peer_gone.load() ||
                   c.shut_wr.load() || c.state.resynced() || (ended && c.gen.load(std::memory_order_acquire) != gen);
          },
          -1, 0, deadline);
      if (!st.ok() && sent > 0) return sent;
      if (!st.ok()) return st;
      continue;
    }
    size_t n = std::min<uint64_t>(space, total - sent);
    CopyIovRing<true>(c.tx, size, tail, iov, iovcnt, sent, n);
    // Release: the ring bytes are written before the tail is published.
    c.tx_tail.store(tail + n, std::memory_order_release);
    Status st = Announce(c, &proto::DoorbellBlock::tx_tail, &proto::DoorbellBlock::want_tx, MsgType::kTxTail, tail + n);
    if (!st.ok()) {
      // The bytes are in the TX ring: if the backend is gone they are
      // resent from there (RESYNC), so they count as sent.
      if (!c.session->CheckBackend() && c.state.resynced()) return sent + n;
      c.state.Apply(ConnEvent::kFail, Reason::kBackendUnavailable);
      return sent ? Result<size_t>(sent) : Errno(ECONNRESET, "connection reset");
    }
    if (!c.direct) c.session->NoteProduced();  // (a direct pair's count is in the pair's memory, not vsocketd's)
    // (Written under tx_mu alone: no locked add, which would wait for the
    // ring and count stores above to reach the peer's CPU.)
    c.accel_tx.store(c.accel_tx.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    if (BusyLoop* loop = ActiveBusyLoop()) c.stream.NoteRingIo(StreamDetector::Dir::kOut, loop);
    sent += n;
  }
  return sent;
}

bool KernelSendFile(int fd, Conn& c, int in, off_t* offset, size_t count, Result<size_t>* out) {
  MaybeReregister(fd, c);
  MaybeMoveBack(c);
  EnsureRegistered(fd, c);
  MutexLock lock(c.tx_mu);
  // Unprobed (held by the policy, or not connected yet), kernel TCP for
  // good, or withdrawn before any upgrade. A registration racing this is
  // harmless: an upgrade's FENCE is posted under tx_mu, after every kernel
  // byte counted here.
  Phase p = c.state.phase();
  if ((p != Phase::kUnprobed && p != Phase::kKernel && p != Phase::kWithdrawn) || c.state.resynced()) return false;
  ssize_t n = Libc().sendfile(fd, in, offset, count);
  if (n < 0) {
    *out = Errno(errno, "sendfile");
    return true;
  }
  c.kernel_sent.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
  NoteKernelIo(c, StreamDetector::Dir::kOut, static_cast<size_t>(n));
  *out = static_cast<size_t>(n);
  return true;
}

}  // namespace vsocket::guest
