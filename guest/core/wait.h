// Waiting in the library: poll briefly, then sleep on eventfds (the
// session's calls, this thread's wake-up eventfd and, where it matters, the
// kernel socket), never spin for long.
#pragma once

#include <poll.h>

#include <algorithm>
#include <cstdint>

#include "base/adaptive_poll.h"
#include "base/clock.h"
#include "base/status.h"
#include "guest/core/conn.h"
#include "guest/core/session.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {

// Milliseconds left until deadline_ns (-1: none), rounded up; 0 once past.
inline int RemainingMs(int64_t deadline_ns) {
  if (deadline_ns < 0) return -1;
  int64_t left = deadline_ns - MonotonicNs();
  return left <= 0 ? 0 : static_cast<int>((left + 999999) / 1000000);
}
// The deadline of a wait of timeout_ms (-1: none).
inline int64_t Deadline(int timeout_ms) {
  return timeout_ms < 0 ? -1 : MonotonicNs() + int64_t{timeout_ms} * 1000000;
}

// The session a wait on connections not registered yet watches: the
// process's, opened now if there is none yet (a process's first connection
// registers at another thread's first I/O while this one sleeps on it: its
// answer then comes by the ring, and only the session's wake-ups tell).
// Null where acceleration is off or no backend answers (tried again at most
// once a second): then no registration can happen under the wait either.
Session* SessionForWaiters();

// This thread's wake-up eventfd (written whenever the session dispatched
// events), for poll/epoll emulation.
int ThreadWaiterFd();

// This thread's poll budget (VSOCKET_POLL_US .. VSOCKET_POLL_MAX_US, learned
// from its waits: base/adaptive_poll.h).
AdaptivePoll& ThreadPoll();
// How long this thread polls before sleeping now: ThreadPoll()'s budget, or
// 0 where the backend shares this process's few CPUs (cpu_share.h) — unless
// `direct` (the wait is for a direct pair's peer, which writes our ring
// itself: decision 97) and a CPU is idle now (cpu_share.h: IdleCpuNow):
// polling then takes from nobody and saves a sleep and a wake-up
// (decision 113).
int64_t PollBudgetNs(bool direct = false);
// Times one wait for ThreadPoll(): from Waiting() (nothing was ready) to
// the end of the scope.
class WaitRecorder {
 public:
  WaitRecorder() = default;
  WaitRecorder(const WaitRecorder&) = delete;
  WaitRecorder& operator=(const WaitRecorder&) = delete;
  ~WaitRecorder();
  // Starts the clock (once) and returns the time to poll until.
  // `direct`: for a direct pair's peer (decision 97), which polling can
  // see without vsocketd (PollBudgetNs).
  int64_t Waiting(bool direct = false);

 private:
  int64_t start_ = 0;
};

// True if some installed signal handler lacks SA_RESTART: then a blocking
// socket call interrupted by a signal fails with EINTR, as the kernel's
// would for that handler.
bool AnyHandlerWithoutRestart();
// SO_RCVTIMEO / SO_SNDTIMEO of the socket as a deadline (-1: none).
int64_t SocketDeadline(int fd, int opt);
// Waits up to a second for the kernel socket (`events`), within the
// SO_*TIMEO deadline `opt` (looked up on first use: *deadline == -2).
Status WaitKernel(int fd, short events, int opt, int64_t* deadline);

// A missed wake-up, noticed after the fact: a sleep that began after the
// event that brought c's ring data (or EOF) had been dispatched, and still
// lasted kLateWakeupNs or more, then found that data. Every dispatch after
// a waiter's last look wakes it at once, so a correct wait never does this
// (however slow the machine: the bound is long); one that does waited on a
// timeout or an unrelated event for data that had arrived. Counted per
// connection (report: late_wakeups) and per process; logged once.
inline constexpr int64_t kLateWakeupNs = 200'000'000;
void NoteLateWakeup(Conn& c, int64_t slept_from_ns, int64_t slept_until_ns);
uint64_t LateWakeups();

// VSOCKET_DEBUG_STALL_S (a diagnostic, 0/unset: off): a wait, a receive or
// a send on an accelerated connection that has gone on that long logs,
// once, the connection's counts and its session's queues (LogStalledWait;
// woke_by: which of the last poll's fds were ready, 1 waiter, 2 events, 4
// requests, 8 liveness).
int64_t StallLogNs();
void LogStalledWait(Conn& c, Session& s, int woke_by = 0);

// The clock of one such call: Due() is true once, the first time it is
// asked after StallLogNs() went by (never with the diagnostic off).
class StallWatch {
 public:
  StallWatch() : start_ns_(StallLogNs() > 0 ? MonotonicNs() : 0) {}
  bool Due() {
    if (start_ns_ == 0 || MonotonicNs() - start_ns_ < StallLogNs()) return false;
    start_ns_ = 0;
    return true;
  }

 private:
  int64_t start_ns_;
};

// Blocks until ready() (checked after every change), polling briefly first.
// kernel_fd/kernel_events: also wake when the kernel socket is ready.
// deadline_ns (-1: none) gives EAGAIN, as an expired SO_*TIMEO does.
// for_ring_data: ready() means data (or EOF) in c's RX ring (for
// NoteLateWakeup).
template <typename Ready>
Status WaitUntil(Conn& c, Ready ready, int kernel_fd = -1, short kernel_events = 0, int64_t deadline_ns = -1,
                 bool for_ring_data = false) {
  Session* s = c.session;
  if (s == nullptr) return Status(Code::kUnavailable, "no backend session", ECONNRESET);
  if (ready()) return Status::Ok();
  WaitRecorder wait;
  int64_t spin_until = wait.Waiting(static_cast<bool>(c.direct));
  s->KickIfOwed();
  for (uint32_t i = 0; MonotonicNs() < spin_until; ++i) {
    if (ready()) return Status::Ok();
    s->TryDrain();
    SpinStep(i);
  }
  int efd = ThreadWaiterFd();
  s->AddWaiter(efd);
  Status result;
  int64_t slept_from = 0, slept_until = 0;
  StallWatch stall;
  for (;;) {
    if (ready()) {
      if (for_ring_data && slept_from != 0) NoteLateWakeup(c, slept_from, slept_until);
      break;
    }
    int timeout_ms = 1000;
    if (deadline_ns >= 0) {
      int64_t left = deadline_ns - MonotonicNs();
      if (left <= 0) {
        result = Status(Code::kResourceExhausted, "timed out", EAGAIN);
        break;
      }
      timeout_ms = static_cast<int>(std::min<int64_t>(1000, (left + 999999) / 1000000));
    }
    if (!s->alive()) {
      // The backend is gone (its connections moved on: resyncing or back to
      // probing). Only the kernel socket can still bring what we wait for.
      if (kernel_fd < 0) {
        result = Status(Code::kUnavailable, "backend session lost", ECONNRESET);
        break;
      }
      pollfd k{kernel_fd, kernel_events, 0};
      if (Libc().poll(&k, 1, timeout_ms) < 0 && errno == EINTR && AnyHandlerWithoutRestart()) {
        result = Status(Code::kUnavailable, "interrupted", EINTR);
        break;
      }
      continue;
    }
    if (!s->PrepareSleep()) continue;  // work arrived: re-check
    // The vhost-user socket too: a backend that dies sends no event, it
    // hangs up (then the connection goes on without it, Session::BackendLost).
    pollfd p[5] = {{efd, POLLIN, 0},
                   {s->event_fd(), POLLIN, 0},
                   {s->request_fd(), POLLIN, 0},
                   {s->liveness_fd(), POLLIN, 0},
                   {kernel_fd, kernel_events, 0}};
    slept_from = MonotonicNs();
    int r = Libc().poll(p, kernel_fd >= 0 ? 5 : 4, timeout_ms);
    int poll_errno = errno;
    slept_until = MonotonicNs();
    if (r == 0) s->NoteTimedOutSleep();  // (before DoneSleeping's drain)
    s->DoneSleeping();
    if (stall.Due()) {
      LogStalledWait(c, *s, r > 0 ? (p[0].revents ? 1 : 0) | (p[1].revents ? 2 : 0) | (p[2].revents ? 4 : 0) |
                                        (p[3].revents ? 8 : 0)
                                  : 0);
    }
    if (r < 0 && poll_errno == EINTR && AnyHandlerWithoutRestart()) {
      result = Status(Code::kUnavailable, "interrupted", EINTR);
      break;
    }
    uint64_t v;
    (void)!Libc().read(efd, &v, sizeof(v));
    if (r > 0 && p[3].revents) s->CheckBackend();
    if (r > 0 && (p[1].revents || p[2].revents)) s->Drain();
  }
  s->RemoveWaiter(efd);
  return result;
}

}  // namespace vsocket::guest
