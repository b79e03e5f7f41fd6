#include "guest/core/fork.h"

#include <fcntl.h>
#include <poll.h>

#include <memory>
#include <vector>

#include "base/clock.h"
#include "base/log.h"
#include "guest/core/conn_state.h"
#include "guest/core/fd_table.h"
#include "guest/core/loss.h"
#include "guest/core/resync.h"
#include "guest/core/session.h"
#include "guest/core/wait.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {

using proto::Message;
using proto::MsgType;
using proto::Reason;

namespace {

// What the whole of it may take before fork() goes on: the peers' libraries
// answer within a pass or two of vsocketd; a peer that does not leaves its
// connection as it was.
constexpr int64_t kForkBudgetNs = 2'000'000'000;
constexpr int kForkCallMs = 1000;

// Writes what c owes the peer on the kernel socket (its RESYNC header and
// resend), waiting for room until the deadline. False (connection reset)
// if it could not.
bool FlushBy(Conn& c, int fd, int64_t deadline) REQUIRES(c.tx_mu) {
  for (;;) {
    Status st = FlushResendLocked(c, fd);
    if (st.ok()) return true;
    if (st.sys_errno() != EAGAIN || MonotonicNs() >= deadline) break;
    (void)WaitKernel(fd, POLLOUT, 0, &deadline);  // (the deadline is ours: no SO_SNDTIMEO)
  }
  if (!c.state.reset()) ResetKernel(fd, c);
  return false;
}

// Reads the peer's RESYNC header off the kernel socket, where it is next,
// and the part of its resend the application already read. What the
// application has not read of our RX ring is dropped: the peer resends
// from what it knew we consumed (its credit, at most what we consumed), so
// those bytes follow on the kernel socket too. False if the header is not
// next (bytes the peer sent before its FENCE are still unread) or did not
// come by the deadline.
bool RxToKernelBy(Conn& c, int fd, int64_t deadline) REQUIRES(c.rx_mu) {
  if (c.state.rx_resync() == RxResync::kRing) {
    // (A peer that never switched has no ring bytes and sends no header.)
    bool fence = c.peer_fence_known.load(std::memory_order_acquire);
    if (fence ? c.kernel_received.load() != c.peer_fence.load() : !c.state.ring_final()) return false;
    uint64_t head = c.rx_head.load(std::memory_order_relaxed);
    c.rx_tail.store(head, std::memory_order_release);
    c.resync_landed.store(head, std::memory_order_relaxed);
    if (!c.state.AdvanceRxResync(fence ? RxResync::kHeader : RxResync::kKernel)) return false;
  }
  for (;;) {
    Status st = ConsumeResyncLocked(fd, c);
    if (st.ok()) return true;
    if (st.sys_errno() != EAGAIN || MonotonicNs() >= deadline) return false;
    (void)WaitKernel(fd, POLLIN, 0, &deadline);
  }
}

// The registration ends and the connection is kernel TCP's for good.
void EndOnKernel(Session* s, Conn& c) REQUIRES(c.setup_mu) {
  (void)s->Unregister(c);
  c.session = nullptr;
  c.state.Apply(ConnEvent::kKernelForGood, Reason::kForked);
  c.gen.fetch_add(1, std::memory_order_acq_rel);
  s->WakeWaiters();
}

// One connection, its three locks held. True if it is on kernel TCP now.
bool Leave(Session* s, int fd, Conn& c, const std::shared_ptr<Conn>& cp, int64_t deadline)
    REQUIRES(c.setup_mu, c.tx_mu, c.rx_mu) {
  Phase phase = c.state.phase();
  if (phase == Phase::kPending || (phase == Phase::kUpgraded && !c.state.draining() && !c.state.resynced())) {
    uint64_t consumed = phase == Phase::kUpgraded ? c.rx_head.load(std::memory_order_relaxed) : 0;
    Message resp;
    Status st = s->Call({MsgType::kDowngrade, 0,
                         proto::Downgrade{c.id, Reason::kForked, consumed, proto::kDowngradeResendFrom}},
                        &resp, kForkCallMs);
    const auto* ack = std::get_if<proto::RegisterAck>(&resp.body);
    if (!st.ok() || ack == nullptr || ack->status != proto::WireError::kOk) {
      VS_LOG(kInfo, "conn %lu: stays on the rings across the fork (%s): the child cannot use it",
             static_cast<unsigned long>(c.id),
             !st.ok() ? st.ToString().c_str() : ack == nullptr ? "no answer" : proto::ToString(ack->status));
      return false;
    }
    // (Events already queued for it — an UPGRADE that crossed our request,
    // RX_TAILs — find it in a phase that refuses them.)
    if (c.state.phase() == Phase::kPending) {
      c.state.Apply(ConnEvent::kForked, Reason::kForked);
      (void)s->Unregister(c);
      c.session = nullptr;
      return true;
    }
    // Nothing more lands in our RX ring: what the application has not read
    // of it, the peer sends again on the kernel socket.
    c.rx_tail.store(consumed, std::memory_order_release);
    // (Our FENCE, if we switched, reached the peer's library before this
    // DOWNGRADE: it expects our RESYNC header.)
    ApplyLoss(cp, LossKind::kLinkDown, consumed, true, Reason::kForked, nullptr);
    if (c.state.phase() != Phase::kResyncing || !c.state.AdvanceRxResync(RxResync::kKernel)) return false;
    if (!FlushBy(c, fd, deadline)) return false;
    EndOnKernel(s, c);
    return true;
  }
  if (phase == Phase::kResyncing && !c.state.draining()) {
    if (!RxToKernelBy(c, fd, deadline) || !FlushBy(c, fd, deadline)) return false;
    EndOnKernel(s, c);
    return true;
  }
  return false;
}

// A connection the program marked close-on-exec (its only fd has
// FD_CLOEXEC) is one it does not mean to hand to another program: the
// common fork() then is fork-and-exec (a subprocess, a CGI, redis's BGSAVE
// child that never touches its clients), where taking every connection
// back to kernel TCP for good would cost the parent its acceleration for
// nothing. It stays on the rings; a child that uses it before an exec is
// told ECONNRESET (decision 85).
bool CloseOnExec(const Conn& c) {
  if (c.fd_refs.load(std::memory_order_relaxed) != 1) return false;  // (another fd may be inherited)
  int flags = Libc().fcntl(c.fd_hint, F_GETFD, 0);
  return flags >= 0 && (flags & FD_CLOEXEC) != 0;
}

}  // namespace

void LeaveRingsBeforeFork() {
  Session* s = Session::Existing();
  if (s == nullptr || !s->fork_resync()) return;
  int64_t deadline = MonotonicNs() + kForkBudgetNs;
  size_t left = 0, kept = 0;
  auto candidate = [&](const Conn& c) {
    Phase phase = c.state.phase();
    if (phase != Phase::kPending && phase != Phase::kUpgraded && phase != Phase::kResyncing) return false;
    return c.fd_hint >= 0 && Lookup(c.fd_hint).get() == &c && c.session == s && !CloseOnExec(c);
  };
  // Two rounds: a peer in this process that its own connection's DOWNGRADE
  // put back on kernel TCP is finished in the second. (Another thread
  // inside a call on it holds one of its locks: it stays as it is.)
  for (int round = 0; round < 2; ++round) {
    s->TryDrain();
    for (const std::shared_ptr<Conn>& cp : s->Tracked()) {
      Conn& c = *cp;
      if (!candidate(c) || !c.setup_mu.try_lock()) continue;
      MutexLock setup(c.setup_mu, kAdoptLock);
      if (!c.tx_mu.try_lock()) continue;
      MutexLock tx(c.tx_mu, kAdoptLock);
      if (!c.rx_mu.try_lock()) continue;
      MutexLock rx(c.rx_mu, kAdoptLock);
      s->TryDrain();
      if (candidate(c) && Leave(s, c.fd_hint, c, cp, deadline)) ++left;
    }
  }
  for (const std::shared_ptr<Conn>& cp : s->Tracked()) kept += candidate(*cp);
  if (left > 0 || kept > 0)
    VS_LOG(kInfo, "fork: %zu connection(s) back on kernel TCP, %zu left on the rings (the child cannot use those)",
           left, kept);
}

}  // namespace vsocket::guest
