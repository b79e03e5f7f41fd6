// epoll_wait, epoll_pwait and epoll_pwait2 on an application's set: the
// kernel's own wait where the kernel alone answers for the set (or the
// one-poll answer of decision 75), else the emulated wait, which reports
// the kernel's entries and the library's (emulated.h), polls briefly and
// sleeps in the kernel's wait with the session's wake-ups hooked in.
#include <errno.h>

#include <algorithm>
#include <vector>

#include "base/clock.h"
#include "guest/core/busy_loop.h"
#include "guest/core/epoll/deferred.h"
#include "guest/core/epoll/emulated.h"
#include "guest/core/epoll/one_poll.h"
#include "guest/core/epoll/set.h"
#include "guest/core/poll_ops.h"
#include "guest/core/wait.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {

using namespace epoll;

namespace {

// An epoll wait's timeout: epoll_wait/epoll_pwait's milliseconds, or
// epoll_pwait2's timespec (ts; precise), which the kernel's waits are then
// given as it is, never rounded up to a millisecond.
struct EpTimeout {
  int ms;                // the milliseconds as given (!precise)
  const timespec* ts;    // as given (precise); null: none
  bool precise;
  int64_t ns;            // -1: none
};

// The kernel's own wait on epfd until deadline (-1: none), in the unit the
// caller asked in; `first`: the caller's own timeout, as given.
int KernelEpollWait(int epfd, epoll_event* ev, int max, const EpTimeout& t, bool first, int64_t deadline,
                    const sigset_t* mask) {
  if (!t.precise) return Libc().epoll_pwait(epfd, ev, max, first ? t.ms : RemainingMs(deadline), mask);
  if (Libc().epoll_pwait2 == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  if (first || deadline < 0) return Libc().epoll_pwait2(epfd, ev, max, first ? t.ts : nullptr, mask);
  timespec ts = NsTimespec(std::max<int64_t>(0, deadline - MonotonicNs()));
  return Libc().epoll_pwait2(epfd, ev, max, &ts, mask);
}

// The start of a wait on one of our sets: from here no change to the set
// waits (CanDefer: the kernel's registrations are the application's for the
// whole wait), every deferred change is applied but those a one-poll answer
// may serve (into pending; their count returned). `alone`: the kernel alone
// answers for the set.
int BeginWait(EpSet& set, int max, const sigset_t* sigmask, PendingInterest* pending, bool* alone) {
  int n_pending = 0;
  MutexLock lock(set.mu);
  set.waiters.fetch_add(1, std::memory_order_relaxed);
  *alone = KernelAlone(set);
  // Answered by ReadyNow every other wait at most: the kernel's own wait in
  // between reports the other fds, so no entry that keeps asking for more
  // starves them.
  if (*alone && sigmask == nullptr && !set.answered_by_poll)
    n_pending = FindPendingInterest(set, pending, std::min(max, kMaxPendingInterest));
  set.answered_by_poll = false;
  int keep[kMaxPendingInterest];
  for (int i = 0; i < n_pending; ++i) keep[i] = pending[i].fd;
  SettleSet(set, keep, n_pending);
  return n_pending;
}

// The one-poll answer: what is ready now among the pending changes' fds
// (> 0: the answer; the kept changes stay deferred, for this thread's next
// wait), or 0 with every change applied (the kernel's wait, as asked).
int AnswerByOnePoll(EpSet& set, const PendingInterest* pending, int n_pending, epoll_event* events) {
  int n = ReadyNow(pending, n_pending, events);
  MutexLock lock(set.mu);
  if (n > 0) {
    set.answered_by_poll = true;
    if (set.dirty != 0) NoteDirtiedByThisThread(&set);
    return n;
  }
  SettleSet(set);
  return 0;
}

// The kernel alone answers for the set: request/response connections the
// policy keeps on kernel TCP cost one real epoll_wait, as without us.
// Returns the answer, or -2 once a connection registers under the wait (our
// wake-up, EpollKick): then the emulated wait takes over.
int WaitKernelAlone(int epfd, EpSet& set, epoll_event* events, int max, const EpTimeout& t, int64_t deadline,
                    const sigset_t* sigmask) {
  for (bool first = true;; first = false) {
    int r = KernelEpollWait(epfd, events, max, t, first, deadline, sigmask);
    if (r <= 0 || !HasMarker(events, r)) return r;
    bool session_event = false;
    MutexLock lock(set.mu);
    r = Filter(set, events, r, &session_event);
    if (r > 0) return r;
    if (!KernelAlone(set)) return -2;
  }
}

// Room for one look at the kernel's events, `max` of them: this thread's
// buffer, kept from wait to wait (an event loop's maxevents may be
// thousands: redis-benchmark asks for 10,240, and zeroing a fresh buffer of
// that size cost it ~10 µs a request), or, in a wait inside another on this
// thread (a signal handler's), one of its own.
class KernelEvents {
 public:
  explicit KernelEvents(int max) {
    if (!t_busy_) {
      t_busy_ = true;
      buf_ = &t_buf_;
    }
    if (buf_->size() < static_cast<size_t>(max)) buf_->resize(static_cast<size_t>(max));
  }
  ~KernelEvents() {
    if (buf_ == &t_buf_) t_busy_ = false;
  }
  KernelEvents(const KernelEvents&) = delete;
  KernelEvents& operator=(const KernelEvents&) = delete;
  epoll_event* data() { return buf_->data(); }

 private:
  static thread_local std::vector<epoll_event> t_buf_;
  static thread_local bool t_busy_;
  std::vector<epoll_event> own_;
  std::vector<epoll_event>* buf_ = &own_;
};
thread_local std::vector<epoll_event> KernelEvents::t_buf_;
thread_local bool KernelEvents::t_busy_ = false;

// The emulated wait: the kernel's events and the library's, polled for this
// thread's budget, then asleep in the kernel's wait on the set, where our
// wake eventfd and the session's event fd are hooked in so that ring events
// wake it too.
int WaitEmulated(int epfd, EpSet* set, epoll_event* events, int max, const EpTimeout& t, int64_t deadline,
                 const sigset_t* sigmask) {
  WaitRecorder wait;  // started once nothing was ready
  bool direct;
  {
    MutexLock lock(set->mu);
    direct = HasDirect(*set);
  }
  int64_t spin_until = MonotonicNs() + PollBudgetNs(direct);
  KernelEvents kernel(max);
  int64_t slept_from = 0, slept_until = 0;  // the last sleep (NoteLateWakeup)
  for (uint32_t iter = 0;; ++iter) {
    int n = 0;
    Session* s;
    Session* hooked;
    {
      MutexLock lock(set->mu);
      hooked = set->session;
    }
    if (hooked != nullptr && hooked->alive()) hooked->TryDrain();
    {
      MutexLock lock(set->mu);
      Refresh(epfd, *set);
      s = set->session;
    }
    if (s != nullptr && !s->alive()) s = nullptr;  // backend gone: plain kernel sleep
    bool session_event = false;
    // Kernel events first (they may mark connections in transition as
    // changed), then our own, each fd reported at most once.
    int k = 0;
    bool spinning = t.ns != 0 && s != nullptr && MonotonicNs() < spin_until;
    if (!spinning || (iter & 63) == 0) {
      k = Libc().epoll_pwait(epfd, kernel.data(), max, 0, nullptr);
      if (k < 0) return -1;
    }
    {
      // Ours after the kernel's, in the room they leave (an entry left out
      // is still ready at the next wait; a kernel event dropped here would
      // be lost for good if edge-triggered).
      MutexLock lock(set->mu);
      k = Filter(*set, kernel.data(), k, &session_event);
      n = Collect(*set, events, max - k, slept_from, slept_until);
    }
    for (int i = 0; i < k; ++i) events[n++] = kernel.data()[i];
    spinning = spinning && n == 0;
    if (session_event && s) s->Drain();
    if (n > 0 || t.ns == 0 || (deadline >= 0 && MonotonicNs() >= deadline)) return n;
    (void)wait.Waiting();
    if (s != nullptr) s->KickIfOwed();
    if (spinning) {
      SpinStep(iter);
      continue;
    }
    Session* borrowed = nullptr;
    if (s == nullptr) {
      bool unprobed;
      {
        MutexLock lock(set->mu);
        unprobed = set->session == nullptr && HasUnprobed(*set);
      }
      // (Opened now if there is none yet: decision 73.)
      if (unprobed) borrowed = SessionForWaiters();
    }
    SleepHooks hooks(epfd, *set, borrowed);
    if (borrowed != nullptr) {
      // Registered (and maybe upgraded) between our look and the hooks?
      MutexLock lock(set->mu);
      if (!HasUnprobed(*set)) continue;
    }
    Session* sleeper = s != nullptr ? s : borrowed;
    bool prepared = sleeper != nullptr && sleeper->PrepareSleep();
    if (sleeper != nullptr && !prepared) continue;
    slept_from = MonotonicNs();
    int r = KernelEpollWait(epfd, events, max, t, false, deadline, sigmask);
    int saved = errno;
    slept_until = MonotonicNs();
    if (prepared) sleeper->DoneSleeping();
    if (r < 0) {
      errno = saved;
      return -1;
    }
    {
      MutexLock lock(set->mu);
      r = Filter(*set, events, r, &session_event);
    }
    if (session_event && borrowed) borrowed->CheckBackend();  // (Filter checks the set's own)
    if (session_event && sleeper) sleeper->Drain();
    if (r > 0) {
      // Kernel events of entries the kernel owns; ours cannot repeat them.
      MutexLock lock(set->mu);
      return r + Collect(*set, events + r, max - r, slept_from, slept_until);
    }
  }
}

int EpollWaitFor(int epfd, epoll_event* events, int max, const EpTimeout& t, const sigset_t* sigmask) {
  EpSet* set = FindSet(epfd, false);
  if (set == nullptr) {
    EpollSettleMine();  // (epfd may watch a set of ours)
    return KernelEpollWait(epfd, events, max, t, true, -1, sigmask);
  }
  if (max <= 0) {
    errno = EINVAL;
    return -1;
  }
  PendingInterest pending[kMaxPendingInterest];
  bool alone = false;
  int n_pending = BeginWait(*set, max, sigmask, pending, &alone);
  // (Settled: EpollSettleMine below need not lock it again.)
  ForgetDirtiedByThisThread(set);
  struct Leave {
    EpSet* set;
    ~Leave() { set->waiters.fetch_sub(1, std::memory_order_relaxed); }
  } leave{set};
  // Sets nested in this one are never deferred (EpSet.shared); a change
  // this thread left waiting elsewhere is applied before it waits.
  EpollSettleMine();
  if (n_pending > 0) {
    int n = AnswerByOnePoll(*set, pending, n_pending, events);
    if (n > 0) return n;
  }
  // (A zero timeout's deadline is any past time: no clock read.)
  int64_t deadline = t.ns <= 0 ? t.ns : MonotonicNs() + t.ns;
  if (alone) {
    int r = WaitKernelAlone(epfd, *set, events, max, t, deadline, sigmask);
    if (r != -2) return r;
  }
  return WaitEmulated(epfd, set, events, max, t, deadline, sigmask);
}

}  // namespace

int EpollWait(int epfd, epoll_event* events, int max, int timeout_ms, const sigset_t* sigmask) {
  EpTimeout t{timeout_ms, nullptr, false, timeout_ms < 0 ? -1 : int64_t{timeout_ms} * 1000000};
  int r = EpollWaitFor(epfd, events, max, t, sigmask);
  if (r >= 0) NoteAppWait(r);  // (decision 83: how busy the application's loop is)
  return r;
}

int EpollWait2(int epfd, epoll_event* events, int max, const timespec* ts, const sigset_t* sigmask) {
  EpTimeout t{0, ts, true, -1};
  if (ts != nullptr) {
    if (!TimespecValid(*ts)) {
      errno = EINVAL;  // (the kernel's answer to a timespec it cannot read as one)
      return -1;
    }
    int64_t ns = TimespecNs(*ts);
    t.ns = ns >= kForeverNs ? -1 : ns;
  }
  int r = EpollWaitFor(epfd, events, max, t, sigmask);
  if (r >= 0) NoteAppWait(r);
  return r;
}

}  // namespace vsocket::guest
