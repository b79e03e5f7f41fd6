// The entries the library answers for: upgraded connections, whose
// readiness comes from their rings (readiness.cc), moved out of the
// kernel's set; the session's wake-ups hooked into the set; the marker
// values of the library's own registrations, dropped from what the
// application sees.
#pragma once

#include <sys/epoll.h>

#include "guest/core/epoll/set.h"

namespace vsocket::guest::epoll {

// Session s's wake-ups in the epoll set epfd: its event fd, its backend's
// hang-up, and the set's wake eventfd written on every drain.
void HookSession(int epfd, const EpSet& set, Session* s);
void UnhookSession(int epfd, const EpSet& set, Session* s);
// Requires set.mu. Moves an upgraded connection out of the kernel set (and
// back once it is on kernel TCP again) and hooks the session's wake-ups in.
void RefreshEntry(int epfd, EpSet& set, int fd, EpEntry& e) REQUIRES(set.mu);
// Requires set.mu. RefreshEntry for every entry.
void Refresh(int epfd, EpSet& set) REQUIRES(set.mu);
// Requires set.mu. Appends ready emulated entries. slept_from/until: the
// sleep just ended, if any (NoteLateWakeup).
int Collect(EpSet& set, epoll_event* out, int max, int64_t slept_from = 0, int64_t slept_until = 0)
    REQUIRES(set.mu);
// Requires set.mu. Whether a connection in the set is not registered yet
// (another thread may register and upgrade it while we sleep).
bool HasUnprobed(const EpSet& set) REQUIRES(set.mu);
// Requires set.mu. Whether a connection the set emulates is a direct pair's
// end (its waits may poll: PollBudgetNs).
bool HasDirect(const EpSet& set) REQUIRES(set.mu);
// Requires set.mu. Whether the kernel alone answers for the set: no session
// hooked, and every connection in it on kernel TCP for now: for good, or
// held by the upgrade policy (such a connection registers only at its own
// I/O, and EpollKick then wakes this wait through the set's eventfd).
bool KernelAlone(const EpSet& set) REQUIRES(set.mu);
// Whether data is one of the library's marker values (never an
// application's event).
bool IsMarker(uint64_t data);
// Whether a real epoll result has one of our events (without the set's lock).
bool HasMarker(const epoll_event* ev, int n);
// Requires set.mu. Drops our marker events from a real epoll result (acting
// on each); returns the kept count.
int Filter(EpSet& set, epoll_event* ev, int n, bool* session_event) REQUIRES(set.mu);

// While a wait on a set with no session of its own sleeps, and a connection
// in it is not registered yet: the process's session wakes it too (its
// events, its backend's hang-up, and every drain by another thread). Only
// for the sleep: an epoll set nested in another must not look readable for
// wake-ups meant for our emulation.
class SleepHooks {
 public:
  SleepHooks(int epfd, EpSet& set, Session* s) : epfd_(epfd), set_(set), s_(s) {
    if (s_ != nullptr) HookSession(epfd_, set_, s_);
  }
  ~SleepHooks() {
    if (s_ != nullptr) UnhookSession(epfd_, set_, s_);
  }
  SleepHooks(const SleepHooks&) = delete;
  SleepHooks& operator=(const SleepHooks&) = delete;

 private:
  int epfd_;
  EpSet& set_;
  Session* s_;
};

}  // namespace vsocket::guest::epoll
