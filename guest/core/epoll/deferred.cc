#include "guest/core/epoll/deferred.h"

#include <algorithm>

#include "guest/core/poll_ops.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {
namespace epoll {
namespace {

// Sets with a deferred change (deferred.h).
std::atomic<int> g_dirty_sets{0};

// Per fd number (entries exist only for connections, Lookup: below kTableFds):
// how many sets have a dirty entry for it (a close settles only those).
std::atomic<int> g_dirty_of[kTableFds];
// The sets this thread left changes waiting in (a thread's next wait
// settles them: another thread's sets are its own business, or shared).
thread_local std::vector<EpSet*> t_dirtied;

constexpr uint32_t kNotPlain = EPOLLET | EPOLLONESHOT | EPOLLEXCLUSIVE | EPOLLWAKEUP;

}  // namespace

bool CanDefer(const EpSet& set, const EpEntry& e, const Conn& c, uint32_t events) {
  return c.KernelUntilOwnIo() && !set.shared && set.waiters.load(std::memory_order_relaxed) == 0 &&
         e.kern_present && !e.feed && !(e.kern_events & kNotPlain) && !(events & kNotPlain);
}

void MarkDirty(EpSet& set, int fd, EpEntry& e) {
  if (e.dirty) return;
  e.dirty = true;
  g_dirty_of[fd].fetch_add(1, std::memory_order_relaxed);
  if (set.dirty++ == 0) g_dirty_sets.fetch_add(1, std::memory_order_relaxed);
  if (std::find(t_dirtied.begin(), t_dirtied.end(), &set) == t_dirtied.end()) t_dirtied.push_back(&set);
  if (set.dirty_fds.size() >= set.entries.size() + 64) {
    // Entries settled one by one while others stayed dirty: start afresh.
    set.dirty_fds.clear();
    for (const auto& [other, o] : set.entries)
      if (o.dirty && other != fd) set.dirty_fds.push_back(other);
  }
  set.dirty_fds.push_back(fd);
}

void Settle(EpSet& set, int fd, EpEntry& e) {
  if (!e.dirty) return;
  e.dirty = false;
  g_dirty_of[fd].fetch_sub(1, std::memory_order_relaxed);
  if (--set.dirty == 0) {
    g_dirty_sets.fetch_sub(1, std::memory_order_relaxed);
    set.dirty_fds.clear();
  }
  if (!e.kern_present) return;
  if (!e.conn) {
    Libc().epoll_ctl(set.epfd, EPOLL_CTL_DEL, fd, nullptr);
    e.kern_present = false;
  } else if (e.in_kernel && (e.events != e.kern_events || e.data.u64 != e.kern_data.u64)) {
    // (A level-triggered registration changed back to what the kernel has
    // needs nothing: its readiness is looked at by every wait.)
    epoll_event ev{};
    ev.events = e.events;
    ev.data = e.data;
    Libc().epoll_ctl(set.epfd, EPOLL_CTL_MOD, fd, &ev);
    e.kern_events = e.events;
    e.kern_data = e.data;
  }
}

void SettleSet(EpSet& set, const int* keep, int n_keep) {
  if (set.dirty == 0) return;
  std::vector<int> fds;
  fds.swap(set.dirty_fds);
  for (int fd : fds) {
    if (n_keep > 0 && std::binary_search(keep, keep + n_keep, fd)) {
      set.dirty_fds.push_back(fd);
      continue;
    }
    auto it = set.entries.find(fd);
    if (it != set.entries.end()) Settle(set, fd, it->second);
  }
  fds.clear();
  if (set.dirty_fds.empty()) set.dirty_fds.swap(fds);  // (keeps the capacity)
}

void ForgetDirtiedByThisThread(EpSet* set) {
  t_dirtied.erase(std::remove(t_dirtied.begin(), t_dirtied.end(), set), t_dirtied.end());
}

void NoteDirtiedByThisThread(EpSet* set) {
  if (std::find(t_dirtied.begin(), t_dirtied.end(), set) == t_dirtied.end()) t_dirtied.push_back(set);
}

}  // namespace epoll

using namespace epoll;  // (the calls of poll_ops.h below)

bool EpollHasDeferred() { return g_dirty_sets.load(std::memory_order_relaxed) != 0; }

void EpollSettleMine() {
  if (t_dirtied.empty()) return;
  std::vector<EpSet*> sets;
  sets.swap(t_dirtied);
  for (EpSet* set : sets) {
    MutexLock lock(set->mu);
    SettleSet(*set);
  }
  sets.clear();
  if (t_dirtied.empty()) t_dirtied.swap(sets);  // (keeps the capacity)
}

void EpollSettleFd(int fd) {
  if (fd < 0 || fd >= kTableFds || g_dirty_of[fd].load(std::memory_order_relaxed) == 0) return;
  for (EpSet* set : t_dirtied) {  // (the usual case: this thread's own change)
    MutexLock lock(set->mu);
    auto it = set->entries.find(fd);
    if (it != set->entries.end()) Settle(*set, fd, it->second);
  }
  if (g_dirty_of[fd].load(std::memory_order_relaxed) != 0) EpollSettleAll();
}

void EpollSettleAll() {
  if (!EpollHasDeferred()) return;
  for (EpSet* set : LiveSets()) {
    MutexLock lock(set->mu);
    SettleSet(*set);
  }
}

}  // namespace vsocket::guest
