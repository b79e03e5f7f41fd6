#include "guest/core/wait.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "base/clock.h"
#include "base/log.h"
#include "base/own_fd.h"
#include "guest/core/config.h"
#include "guest/core/cpu_share.h"
#include "guest/core/errors.h"
#include "guest/core/session.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {

namespace {

struct ThreadWaiter {
  int efd = -1;
  ThreadWaiter() { efd = OwnFd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)); }
  ~ThreadWaiter() {
    if (efd >= 0) CloseOwnFd(efd);
  }
};

}  // namespace

int ThreadWaiterFd() {
  thread_local ThreadWaiter w;
  return w.efd;
}

AdaptivePoll& ThreadPoll() {
  thread_local AdaptivePoll p(int64_t{Config().poll_us} * 1000, int64_t{Config().poll_max_us} * 1000);
  return p;
}

int64_t PollBudgetNs(bool direct) {
  if (!Session::SleepAtOnce() || (direct && IdleCpuNow())) return ThreadPoll().budget_ns();
  return 0;
}

WaitRecorder::~WaitRecorder() {
  if (start_ != 0) ThreadPoll().Record(MonotonicNs() - start_);
}

int64_t WaitRecorder::Waiting(bool direct) {
  if (start_ == 0) start_ = MonotonicNs();
  // A direct pair's peer writes our ring itself (decision 97): vsocketd
  // is not the one that must run for the answer to come, so its share of
  // the CPUs says nothing against polling for it while a CPU is idle.
  return start_ + PollBudgetNs(direct);
}

namespace {
std::atomic<uint64_t> g_late_wakeups{0};
}  // namespace

void NoteLateWakeup(Conn& c, int64_t slept_from_ns, int64_t slept_until_ns) {
  if (slept_until_ns - slept_from_ns < kLateWakeupNs) return;
  int64_t ev = c.rx_event_ns.load(std::memory_order_relaxed);
  if (ev == 0 || ev >= slept_from_ns) return;
  if (c.rx_tail.load(std::memory_order_acquire) == c.rx_head.load(std::memory_order_relaxed) && !c.peer_shut_wr.load())
    return;
  c.late_wakeups.fetch_add(1, std::memory_order_relaxed);
  if (g_late_wakeups.fetch_add(1, std::memory_order_relaxed) == 0)
    VS_LOG(kWarn, "conn %lu: a wait slept %lld ms on data that had arrived %lld ms before it began (a missed wake-up)",
           static_cast<unsigned long>(c.id), static_cast<long long>((slept_until_ns - slept_from_ns) / 1000000),
           static_cast<long long>((slept_from_ns - ev) / 1000000));
}

int64_t StallLogNs() {
  static const int64_t ns = [] {
    const char* v = getenv("VSOCKET_DEBUG_STALL_S");
    return v ? int64_t{atoi(v)} * 1000000000 : int64_t{0};
  }();
  return ns;
}

void LogStalledWait(Conn& c, Session& s, int woke_by) {
  VS_LOG(kWarn, "conn %lu: a wait has slept %lld s (last woken by %d): %s, rx head %llu tail %llu, tx tail %llu "
         "credit %llu; %s",
         static_cast<unsigned long>(c.id), static_cast<long long>(StallLogNs() / 1000000000), woke_by,
         ToString(c.state.phase()), static_cast<unsigned long long>(c.rx_head.load()),
         static_cast<unsigned long long>(c.rx_tail.load()), static_cast<unsigned long long>(c.tx_tail.load()),
         static_cast<unsigned long long>(c.credit.load()), s.QueueStates().c_str());
}

uint64_t LateWakeups() { return g_late_wakeups.load(std::memory_order_relaxed); }

// True if some installed signal handler lacks SA_RESTART: then a blocking
// socket call interrupted by a signal fails with EINTR, as the kernel's
// would for that handler. (poll() cannot tell which signal interrupted it;
// see docs/socket-compatibility.md.)
bool AnyHandlerWithoutRestart() {
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction sa;
    if (sigaction(sig, nullptr, &sa) != 0) continue;
    bool handled = (sa.sa_flags & SA_SIGINFO) ? sa.sa_sigaction != nullptr
                                              : (sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN);
    if (handled && !(sa.sa_flags & SA_RESTART)) return true;
  }
  return false;
}

// SO_RCVTIMEO / SO_SNDTIMEO of the socket as a deadline (-1: none).
int64_t SocketDeadline(int fd, int opt) {
  timeval tv{};
  socklen_t len = sizeof(tv);
  if (getsockopt(fd, SOL_SOCKET, opt, &tv, &len) != 0 || (tv.tv_sec == 0 && tv.tv_usec == 0)) return -1;
  return MonotonicNs() + int64_t{tv.tv_sec} * 1000000000 + int64_t{tv.tv_usec} * 1000;
}

// Waits up to a second for the kernel socket (`events`), within the
// SO_*TIMEO deadline `opt` (looked up on first use: *deadline == -2).
Status WaitKernel(int fd, short events, int opt, int64_t* deadline) {
  if (*deadline == -2) *deadline = SocketDeadline(fd, opt);
  int timeout_ms = 1000;
  if (*deadline >= 0) {
    int64_t left = *deadline - MonotonicNs();
    if (left <= 0) return Errno(EAGAIN, "timed out");
    timeout_ms = static_cast<int>(std::min<int64_t>(1000, (left + 999999) / 1000000));
  }
  pollfd p{fd, events, 0};
  if (Libc().poll(&p, 1, timeout_ms) < 0 && errno == EINTR && AnyHandlerWithoutRestart())
    return Errno(EINTR, "interrupted");
  return Status::Ok();
}

Session* SessionForWaiters() {
  if (Session* s = Session::Existing()) return s;
  proto::Reason why;
  return Session::Get(&why);
}

}  // namespace vsocket::guest
