#include "guest/core/epoll/set.h"

#include <sys/eventfd.h>

#include <algorithm>

#include "base/own_fd.h"
#include "guest/core/epoll/deferred.h"
#include "guest/core/poll_ops.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {
namespace epoll {
namespace {

// The epoll sets by epfd, for a look-up without a mutex on every
// epoll_ctl and epoll_wait (set.h). g_ep_mu orders creation and close.
Mutex g_ep_mu;
std::atomic<EpSet*> g_set_of[kMaxSets];
std::vector<int> g_live_sets;  // the live sets' epfds, under g_ep_mu
// How many sets hold a node (EpEntry, present or deleted) for each fd
// number, changed under the set's mutex: closing an fd no set knows (nginx
// closes a file after every response) looks at no set. Nodes exist only
// for connections (Lookup: fds below kMaxSets).
std::atomic<int> g_nodes_of[kMaxSets];
// Per fd number: the set that last took a node for it, so that closing an
// fd one set knows (the usual case) locks that set alone, not every set:
// wrk's two threads, each with its own set, contended on each other's
// mutex at every close (0.7 futex calls per connection).
std::atomic<EpSet*> g_node_set_of[kMaxSets];
// Per fd number: whether it was added to an epoll set as an fd not a
// connection (an epoll set of ours made there later is watched from birth:
// EpSet.shared).
std::atomic<bool> g_nested[kMaxSets];

}  // namespace

EpEntry& AddNode(EpSet& set, int fd, EpEntry&& e) {
  EpEntry& added = set.entries.emplace(fd, std::move(e)).first->second;
  g_nodes_of[fd].fetch_add(1, std::memory_order_relaxed);
  g_node_set_of[fd].store(&set, std::memory_order_release);
  return added;
}

void EraseNode(EpSet& set, std::unordered_map<int, EpEntry>::iterator it) {
  g_nodes_of[it->first].fetch_sub(1, std::memory_order_relaxed);
  set.entries.erase(it);
}

void ClearNodes(EpSet& set) {
  for (const auto& [fd, e] : set.entries) g_nodes_of[fd].fetch_sub(1, std::memory_order_relaxed);
  set.entries.clear();
  set.dirty_fds.clear();
}

std::vector<EpSet*> LiveSets() {
  MutexLock lock(g_ep_mu);
  std::vector<EpSet*> sets;
  sets.reserve(g_live_sets.size());
  for (int epfd : g_live_sets) sets.push_back(g_set_of[epfd].load(std::memory_order_relaxed));
  return sets;
}

EpSet* FindSet(int epfd, bool create) {
  if (epfd < 0 || epfd >= kMaxSets) return nullptr;  // beyond the table: the kernel's alone
  EpSet* set = g_set_of[epfd].load(std::memory_order_acquire);
  if (set != nullptr && set->live.load(std::memory_order_acquire)) return set;
  if (!create) return nullptr;
  MutexLock lock(g_ep_mu);
  set = g_set_of[epfd].load(std::memory_order_relaxed);
  if (set != nullptr && set->live.load(std::memory_order_relaxed)) return set;
  if (set == nullptr) {
    set = new EpSet();  // never freed (see above)
    g_set_of[epfd].store(set, std::memory_order_release);
  }
  MutexLock set_lock(set->mu);
  ClearNodes(*set);
  set->session = nullptr;
  set->epfd = epfd;
  set->shared = g_nested[epfd].load(std::memory_order_relaxed);
  set->wake_efd = OwnFd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeMarker;
  Libc().epoll_ctl(epfd, EPOLL_CTL_ADD, set->wake_efd, &ev);
  g_live_sets.push_back(epfd);
  set->live.store(true, std::memory_order_release);
  return set;
}

void NoteNested(int fd) {
  if (fd >= 0 && fd < kMaxSets && !g_nested[fd].load(std::memory_order_relaxed))
    g_nested[fd].store(true, std::memory_order_relaxed);
}

}  // namespace epoll

using namespace epoll;  // (the calls of poll_ops.h below)

void EpollNoteWatched(int fd) {
  if (fd < 0 || fd >= kMaxSets) return;
  EpSet* set = g_set_of[fd].load(std::memory_order_acquire);
  if (set == nullptr || !set->live.load(std::memory_order_acquire)) return;
  MutexLock lock(set->mu);
  set->shared = true;
  SettleSet(*set);
}

void EpollKick(const Conn& c) {
  for (EpSet* set : LiveSets()) {
    MutexLock lock(set->mu);
    if (!set->live.load(std::memory_order_relaxed)) continue;
    for (const auto& [fd, e] : set->entries) {
      if (e.conn.get() != &c) continue;
      uint64_t one = 1;
      (void)!Libc().write(set->wake_efd, &one, sizeof(one));
      break;
    }
  }
}

void EpollAfterForkInChild() {
  new (&g_ep_mu) Mutex();
  for (EpSet* set : LiveSets()) {  // (the child's one thread: the fresh lock is free)
    new (&set->mu) Mutex();
    MutexLock lock(set->mu);  // (free: the child has one thread)
    set->session = nullptr;  // re-hooked to the child's session when it has one
    set->waiters.store(0, std::memory_order_relaxed);
    // The kernel's epoll object is the parent's too: nothing on it waits.
    set->shared = true;
    SettleSet(*set);
  }
}

namespace {

// Drops set's node for fd, if it has one (set.mu held); whether it had.
bool ForgetIn(EpSet& set, int fd, bool lingering) REQUIRES(set.mu) {
  if (!set.live.load(std::memory_order_relaxed)) return false;
  auto it = set.entries.find(fd);
  if (it == set.entries.end()) return false;
  Settle(set, fd, it->second);
  // The kernel keeps an epoll registration as long as the socket: one
  // that lingers would go on reporting a closed, maybe reused, fd number.
  if (lingering && (it->second.in_kernel || it->second.feed)) Libc().epoll_ctl(set.epfd, EPOLL_CTL_DEL, fd, nullptr);
  EraseNode(set, it);
  return true;
}

}  // namespace

void EpollForget(int fd, bool lingering) {
  if (fd < 0 || fd >= kMaxSets) return;  // neither a set of ours nor in one
  // (The kernel drops a closed file's registrations: the number is new.)
  if (g_nested[fd].load(std::memory_order_relaxed)) g_nested[fd].store(false, std::memory_order_relaxed);
  EpSet* maybe_set = g_set_of[fd].load(std::memory_order_acquire);
  bool is_set = maybe_set != nullptr && maybe_set->live.load(std::memory_order_acquire);
  int nodes = g_nodes_of[fd].load(std::memory_order_relaxed);
  if (!is_set && nodes == 0) return;
  if (!is_set && nodes == 1) {
    // One set has a node for fd: the one that took the last, unless that
    // one dropped it since (then the walk below finds the other).
    if (EpSet* set = g_node_set_of[fd].load(std::memory_order_acquire)) {
      MutexLock lock(set->mu);
      if (ForgetIn(*set, fd, lingering)) return;
    }
  }
  std::vector<EpSet*> sets;
  {
    MutexLock lock(g_ep_mu);
    EpSet* own = g_set_of[fd].load(std::memory_order_relaxed);
    if (own != nullptr && own->live.load(std::memory_order_relaxed)) {
      // fd is an epoll set being closed.
      MutexLock set_lock(own->mu);
      SettleSet(*own);  // (a dup or a child may keep the epoll object)
      own->live.store(false, std::memory_order_release);
      g_live_sets.erase(std::find(g_live_sets.begin(), g_live_sets.end(), fd));
      if (own->session) own->session->RemoveWaiter(own->wake_efd);
      own->session = nullptr;
      CloseOwnFd(own->wake_efd);
      own->wake_efd = -1;
      ClearNodes(*own);
      return;
    }
    for (int epfd : g_live_sets) sets.push_back(g_set_of[epfd].load(std::memory_order_relaxed));
  }
  for (EpSet* set : sets) {
    MutexLock lock(set->mu);
    ForgetIn(*set, fd, lingering);
  }
}

}  // namespace vsocket::guest
