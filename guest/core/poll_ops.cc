// poll(), ppoll(), select() and pselect() over connections the library
// follows; the epoll emulation is in guest/core/epoll/.
#include "guest/core/poll_ops.h"

#include <errno.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "base/clock.h"
#include "base/own_fd.h"
#include "guest/core/config.h"
#include "guest/core/fd_table.h"
#include "guest/core/session.h"
#include "guest/core/socket_ops.h"
#include "guest/core/wait.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {
namespace {

// This thread's wake-up eventfd, registered with the session for as long as
// the object lives. A poll registers before its first look at its
// connections: a drain by another thread after that look (which takes the
// events meant for ours, and consumes the queue's kick) writes our eventfd;
// registered only once asleep, we slept through it (pgbench, two threads on
// one session, stalled for good).
class ThreadWaiterScope {
 public:
  explicit ThreadWaiterScope(Session* s) : s_(s), efd_(ThreadWaiterFd()) { s_->AddWaiter(efd_); }
  ~ThreadWaiterScope() { s_->RemoveWaiter(efd_); }
  ThreadWaiterScope(const ThreadWaiterScope&) = delete;
  ThreadWaiterScope& operator=(const ThreadWaiterScope&) = delete;
  int efd() const { return efd_; }

 private:
  Session* s_;
  int efd_;
};

// Sleeps on the kernel fds in `kfds` plus the session's wake-ups (efd: this
// thread's waiter, registered by the caller). Returns the real poll's
// result (kfds' revents filled), -1 with errno on error.
int SleepWith(Session* s, int efd, std::vector<pollfd>& kfds, int64_t deadline, const sigset_t* sigmask) {
  if (!s->alive()) {
    // The backend is gone: the connections are the kernel's again.
    int ms = RemainingMs(deadline);
    timespec ts{ms / 1000, (ms % 1000) * 1000000L};
    return Libc().ppoll(kfds.data(), kfds.size(), ms < 0 ? nullptr : &ts, sigmask);
  }
  int r = 0;
  if (s->PrepareSleep()) {
    size_t base = kfds.size();
    kfds.push_back({efd, POLLIN, 0});
    kfds.push_back({s->event_fd(), POLLIN, 0});
    kfds.push_back({s->request_fd(), POLLIN, 0});
    kfds.push_back({s->liveness_fd(), POLLIN, 0});  // hangs up if the backend dies
    int ms = RemainingMs(deadline);
    timespec ts{ms / 1000, (ms % 1000) * 1000000L};
    r = Libc().ppoll(kfds.data(), kfds.size(), ms < 0 ? nullptr : &ts, sigmask);
    int saved = errno;
    s->DoneSleeping();
    bool events = r > 0 && (kfds[base + 1].revents || kfds[base + 2].revents);
    bool backend = r > 0 && kfds[base + 3].revents;
    uint64_t v;
    (void)!Libc().read(efd, &v, sizeof(v));
    kfds.resize(base);
    if (backend) s->CheckBackend();
    if (events) s->Drain();
    errno = saved;
  }
  return r;
}

}  // namespace

bool KernelWait::Add(int fd) {
  auto c = Lookup(fd);
  if (!c) return true;
  if (c->session != nullptr) return false;  // registered (its rings may be ready) or once was
  if (c->listening.load(std::memory_order_relaxed)) return true;
  switch (c->state.phase()) {
    case Phase::kKernel: return true;  // for good
    case Phase::kUnprobed:
      if (n_ == kMaxHeld || !c->held.load(std::memory_order_relaxed) || !c->EnterKernelSleep()) return false;
      held_[n_++] = std::move(c);
      return true;
    default: return false;
  }
}

KernelWait::~KernelWait() {
  int saved = errno;
  for (size_t i = 0; i < n_; ++i) held_[i]->LeaveKernelSleep();
  errno = saved;
}

int Poll(pollfd* fds, nfds_t n, int timeout_ms, const sigset_t* sigmask) {
  for (nfds_t i = 0; i < n; ++i) EpollNoteWatched(fds[i].fd);
  EpollSettleMine();
  // Any registered connection (pending or upgraded) ties this call to the
  // session: its events may upgrade a pending connection or make an
  // upgraded one ready, so we must drain them and wake on them.
  std::vector<std::shared_ptr<Conn>> conns(n);
  // Connections not registered yet: another thread may register and
  // upgrade one while we sleep (its bytes then come by the ring, not the
  // kernel socket we watch), so we watch the process's session too.
  std::vector<std::shared_ptr<Conn>> unprobed(n);
  Session* session = nullptr;
  bool registered = false, any_unprobed = false, any_reset = false;
  // Held connections (the policy keeps them on kernel TCP until they
  // stream) need no session: they do not register while we sleep on them
  // (Conn::EnterKernelSleep).
  std::vector<Conn*> sleeping;
  for (nfds_t i = 0; i < n; ++i) {
    auto c = Lookup(fds[i].fd);
    // (A connection that lost its backend still reports what is left in
    // its ring: SleepWith then sleeps in the kernel alone.)
    Session* cs = c ? c->session : nullptr;  // (once: another thread may clear it)
    if (cs != nullptr && (cs->alive() || c->state.resynced())) {
      session = cs;
      conns[i] = std::move(c);
      registered = true;
    } else if (c && c->state.reset()) {
      // Reset with no session (in a fork child: the parent's accelerated
      // connection): ready at once, its answer ECONNRESET. Polling its
      // kernel socket instead waited for bytes that go to the parent's ring.
      conns[i] = std::move(c);
      any_reset = true;
    } else if (c && c->state.phase() == Phase::kUnprobed && !c->listening.load(std::memory_order_relaxed)) {
      if (c->held.load(std::memory_order_relaxed) && c->EnterKernelSleep()) {
        sleeping.push_back(c.get());
      } else {
        any_unprobed = true;
      }
      unprobed[i] = std::move(c);
    }
  }
  auto kernel_poll = [&] {
    if (sigmask == nullptr) return Libc().poll(fds, n, timeout_ms);
    timespec ts{timeout_ms / 1000, (timeout_ms % 1000) * 1000000L};
    return Libc().ppoll(fds, n, timeout_ms < 0 ? nullptr : &ts, sigmask);
  };
  if (any_reset && session == nullptr) {
    // The reset ones are ready; the others get one look, no wait.
    std::vector<pollfd> kfds(fds, fds + n);
    for (nfds_t i = 0; i < n; ++i)
      if (conns[i]) kfds[i].fd = -1;
    int r = Libc().poll(kfds.data(), n, 0);
    int saved = errno;
    for (Conn* c : sleeping) c->LeaveKernelSleep();
    if (r < 0) {
      errno = saved;
      return -1;
    }
    int count = 0;
    for (nfds_t i = 0; i < n; ++i) {
      fds[i].revents = conns[i] ? static_cast<short>(Readiness(fds[i].fd, *conns[i]) & (fds[i].events | POLLERR | POLLHUP))
                                : kfds[i].revents;
      if (fds[i].revents) ++count;
    }
    return count;
  }
  if (session == nullptr && !any_unprobed) {
    int r = kernel_poll();
    int saved = errno;
    for (Conn* c : sleeping) c->LeaveKernelSleep();
    errno = saved;
    return r;
  }
  for (Conn* c : sleeping) c->LeaveKernelSleep();  // (unprobed[] keeps them alive)
  // No session yet (the process's first connections): it is opened now, or
  // another thread's first I/O could register and upgrade a connection we
  // sleep on unseen (decision 73). None to be had: the kernel alone (no
  // registration can happen then either).
  if (session == nullptr) session = SessionForWaiters();
  if (session == nullptr) return kernel_poll();
  int64_t deadline = Deadline(timeout_ms);
  WaitRecorder wait;  // started once nothing was ready
  ThreadWaiterScope waiter(session);
  bool direct = false;
  for (nfds_t i = 0; i < n; ++i) direct |= conns[i] && conns[i]->direct;
  int64_t spin_until = MonotonicNs() + PollBudgetNs(direct);
  std::vector<pollfd> kfds(fds, fds + n);
  std::vector<bool> emulated(n, false);
  int64_t slept_from = 0, slept_until = 0;  // the last sleep (NoteLateWakeup)
  for (uint32_t iter = 0;; ++iter) {
    // Dispatch what the backend reported, even for a zero-timeout poll:
    // an application that only ever polls with timeout 0 must see progress.
    session->TryDrain();
    for (nfds_t i = 0; i < n; ++i) {
      if (!unprobed[i] || unprobed[i]->session != session) continue;
      conns[i] = std::move(unprobed[i]);  // registered meanwhile (by another thread)
      registered = true;
    }
    int count = 0;
    bool any_kernel = false;
    for (nfds_t i = 0; i < n; ++i) {
      int r = conns[i] ? Readiness(fds[i].fd, *conns[i]) : -1;
      emulated[i] = r >= 0;
      // The kernel ignores negative fds; a connection still reading the
      // kernel stream up to its fence keeps its kernel fd for wake-ups, if
      // the caller waits for reads at all (else its EOF would wake us again
      // and again for nothing we report).
      bool feeds = emulated[i] && (fds[i].events & POLLIN) && KernelFeedsReads(*conns[i]);
      kfds[i].fd = emulated[i] && !feeds ? -1 : fds[i].fd;
      kfds[i].events = feeds ? POLLIN : fds[i].events;
      any_kernel |= !emulated[i] && fds[i].fd >= 0;
      if (!emulated[i]) continue;
      fds[i].revents = static_cast<short>(r & (fds[i].events | POLLERR | POLLHUP));
      if (fds[i].revents) ++count;
      if ((fds[i].revents & POLLIN) && slept_from != 0) NoteLateWakeup(*conns[i], slept_from, slept_until);
    }
    bool spinning = registered && count == 0 && timeout_ms != 0 && MonotonicNs() < spin_until;
    if (!spinning || (any_kernel && (iter & 63) == 0)) {
      for (auto& k : kfds) k.revents = 0;
      if (Libc().poll(kfds.data(), n, 0) < 0) return -1;
      for (nfds_t i = 0; i < n; ++i) {
        if (emulated[i]) continue;
        fds[i].revents = kfds[i].revents;
        if (fds[i].revents) ++count;
      }
    }
    if (count > 0 || timeout_ms == 0 || (deadline >= 0 && MonotonicNs() >= deadline)) return count;
    (void)wait.Waiting();
    session->KickIfOwed();
    if (spinning) {
      SpinStep(iter);
      continue;
    }
    slept_from = MonotonicNs();
    int r = SleepWith(session, waiter.efd(), kfds, deadline, sigmask);
    slept_until = MonotonicNs();
    if (r < 0 && errno == EINTR) return -1;
  }
}

int Select(int nfds, fd_set* rd, fd_set* wr, fd_set* ex, int timeout_ms, const sigset_t* sigmask) {
  if (nfds < 0 || nfds > FD_SETSIZE) {
    errno = EINVAL;
    return -1;
  }
  std::vector<pollfd> p;
  for (int fd = 0; fd < nfds; ++fd) {
    short ev = 0;
    if (rd && FD_ISSET(fd, rd)) ev |= POLLIN;
    if (wr && FD_ISSET(fd, wr)) ev |= POLLOUT;
    if (ex && FD_ISSET(fd, ex)) ev |= POLLPRI;
    if (ev) p.push_back({fd, ev, 0});
  }
  int r = Poll(p.data(), p.size(), timeout_ms, sigmask);
  if (r < 0) return r;
  for (const pollfd& q : p) {
    if (q.revents & POLLNVAL) {
      errno = EBADF;
      return -1;
    }
  }
  if (rd) FD_ZERO(rd);
  if (wr) FD_ZERO(wr);
  if (ex) FD_ZERO(ex);
  int count = 0;
  for (const pollfd& q : p) {
    // As the kernel does: errors and hang-ups make an fd readable/writable.
    if (rd && (q.events & POLLIN) && (q.revents & (POLLIN | POLLHUP | POLLERR))) FD_SET(q.fd, rd), ++count;
    if (wr && (q.events & POLLOUT) && (q.revents & (POLLOUT | POLLERR))) FD_SET(q.fd, wr), ++count;
    if (ex && (q.events & POLLPRI) && (q.revents & POLLPRI)) FD_SET(q.fd, ex), ++count;
  }
  return count;
}

}  // namespace vsocket::guest
