#include "guest/core/poll_ops.h"

#include <errno.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
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

static_assert(POLLIN == EPOLLIN && POLLOUT == EPOLLOUT && POLLERR == EPOLLERR && POLLHUP == EPOLLHUP &&
              POLLRDHUP == EPOLLRDHUP && POLLPRI == EPOLLPRI);

int RemainingMs(int64_t deadline_ns) {
  if (deadline_ns < 0) return -1;
  int64_t left = deadline_ns - MonotonicNs();
  return left <= 0 ? 0 : static_cast<int>((left + 999999) / 1000000);
}

int64_t Deadline(int timeout_ms) { return timeout_ms < 0 ? -1 : MonotonicNs() + int64_t{timeout_ms} * 1000000; }

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

namespace {

// The session a wait on connections not registered yet watches: the
// process's, opened now if there is none yet (a process's first connection
// registers at another thread's first I/O while this one sleeps on it: its
// answer then comes by the ring, and only the session's wake-ups tell).
// Null where acceleration is off or no backend answers (tried again at most
// once a second): then no registration can happen under the wait either.
Session* SessionForWaiters() {
  if (Session* s = Session::Existing()) return s;
  proto::Reason why;
  return Session::Get(&why);
}

}  // namespace

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
  bool registered = false, any_unprobed = false;
  // Held connections (the policy keeps them on kernel TCP until they
  // stream) need no session: they do not register while we sleep on them
  // (Conn::EnterKernelSleep).
  std::vector<Conn*> sleeping;
  for (nfds_t i = 0; i < n; ++i) {
    auto c = Lookup(fds[i].fd);
    // (A connection that lost its backend still reports what is left in
    // its ring: SleepWith then sleeps in the kernel alone.)
    if (c && c->session != nullptr && (c->session->alive() || c->state.resynced())) {
      session = c->session;
      conns[i] = std::move(c);
      registered = true;
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
  int64_t spin_until = MonotonicNs() + PollBudgetNs();
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

// ---- epoll ------------------------------------------------------------------

namespace {

// data.u64 values we use for our own fds in an application's epoll set.
constexpr uint64_t kWakeMarker = 0x7653776b6d61726bull;     // "vSwkmark"
constexpr uint64_t kSessionMarker = 0x7653736573736e6dull;  // "vSsessnm"
constexpr uint64_t kBackendMarker = 0x7653626b656e6420ull;  // "vSbkend ": the vhost-user socket hung up
// | fd: an upgraded connection still reading its kernel stream up to the
// fence: kernel data arriving must wake the waiter and count as a change.
constexpr uint64_t kFeedMarker = 0x7653666400000000ull;  // "vSfd"
constexpr uint64_t kFeedMask = 0xffffffff00000000ull;

// An entry whose conn is null was deleted (EPOLL_CTL_DEL): applications
// such as redis delete and add the same fd around every request, so the
// node stays for the next ADD (no allocation); closing the fd erases it.
struct EpEntry {
  uint32_t events = 0;
  epoll_data_t data{};
  std::shared_ptr<Conn> conn;  // null: deleted
  bool in_kernel = true;    // the application's registration is the kernel's
  bool feed = false;        // kFeedMarker registration active (see above)
  bool kicked = false;      // kernel data arrived since the last report
  uint32_t last_gen = ~0u;  // edge-triggered: last change reported
  bool disarmed = false;    // EPOLLONESHOT fired
  // The kernel's registration of fd for the application (not a feed), as
  // last applied; while dirty, events/data (or conn null: deleted) are the
  // application's newer wish, applied before any wait (Deferred changes).
  bool kern_present = false;
  uint32_t kern_events = 0;
  epoll_data_t kern_data{};
  bool dirty = false;
};

struct EpSet {
  std::mutex mu;
  std::unordered_map<int, EpEntry> entries;
  int epfd = -1;
  int wake_efd = -1;
  Session* session = nullptr;  // once an entry has one
  std::atomic<bool> live{false};  // epfd names this set (until its close)
  // Deferred changes: dirty entries; waits under way on this set (none may
  // be deferred then); shared: watched by another epoll set, poll or select,
  // or inherited across fork (never deferred).
  int dirty = 0;
  std::vector<int> dirty_fds;  // every dirty entry's fd (and maybe settled ones)
  std::atomic<int> waiters{0};
  bool shared = false;
  // The last wait was answered by ReadyNow (the next goes to the kernel).
  bool answered_by_poll = false;
};

// ---- Deferred changes ----
// Event loops such as redis's (ae) and hiredis clients delete and add a
// socket's registration around every request (MOD, DEL, ADD for a write,
// DEL, ADD for the reply): five epoll_ctl system calls per request, each
// 1-3 us in a VM. For a connection on kernel TCP (held by the policy), a
// DEL and an ADD or MOD of a level-triggered registration are kept here and
// applied, as one MOD or DEL or nothing, before the next wait of this
// process on any fd set; an ADD that is not the undoing of a deferred DEL
// always reaches the kernel at once (it is the only change that can fail
// for want of resources). No change is deferred while another thread waits
// on the set, for an edge-triggered, one-shot or exclusive registration,
// nor on a set another epoll set, poll or select watches or that a fork
// shared; everything deferred is applied before fork, exec, close and
// dup2/dup3. Decision 61.
std::atomic<int> g_dirty_sets{0};

// Per fd number (entries exist only for connections, Lookup: below kTableFds):
// how many sets have a dirty entry for it (a close settles only those);
std::atomic<int> g_dirty_of[kTableFds];
// whether it was added to an epoll set as an fd not a connection (an
// epoll set of ours made there later is watched from birth: EpSet.shared).
std::atomic<bool> g_nested[kTableFds];
// The sets this thread left changes waiting in (a thread's next wait
// settles them: another thread's sets are its own business, or shared).
thread_local std::vector<EpSet*> t_dirtied;

constexpr uint32_t kNotPlain = EPOLLET | EPOLLONESHOT | EPOLLEXCLUSIVE | EPOLLWAKEUP;

// Requires set.mu. Whether a change of entry e, of connection c (held on
// kernel TCP), to `events` may wait.
bool CanDefer(const EpSet& set, const EpEntry& e, const Conn& c, uint32_t events) {
  return c.KernelUntilOwnIo() && !set.shared && set.waiters.load(std::memory_order_relaxed) == 0 &&
         e.kern_present && !e.feed && !(e.kern_events & kNotPlain) && !(events & kNotPlain);
}

// Requires set.mu.
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

// Requires set.mu. Applies e's deferred change, if any.
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

// A deferred change that asks a level-triggered registration the kernel
// has for more than it has: wrk and every ae client ask for writing once an
// answer is in (MOD to IN|OUT, or redis-benchmark's DEL and ADD for OUT),
// wait, write the next request and ask for reading again: two epoll_ctl
// per request, each 1-3 us in a VM. A wait while such changes are pending
// may be answered by one poll() of those sockets (ReadyNow), the kernel's
// registrations left as they are, if one of them is ready; the next wait
// of the set is the kernel's own, with every change applied (decision 75).
struct PendingInterest {
  int fd;
  uint32_t events;  // the application's
  epoll_data_t data;
};
constexpr int kMaxPendingInterest = 16;
constexpr uint32_t kPollable = EPOLLIN | EPOLLOUT | EPOLLPRI | EPOLLRDHUP | EPOLLERR | EPOLLHUP;
constexpr uint32_t kAskable = EPOLLIN | EPOLLOUT | EPOLLPRI | EPOLLRDHUP;

// Requires set.mu.
bool AsksForMore(const EpEntry& e) {
  return e.dirty && e.conn && e.in_kernel && e.kern_present && (e.events & ~kPollable) == 0 &&
         (e.events & ~e.kern_events & kAskable) != 0;
}

// Requires set.mu. Settles every deferred change of the set but those in
// keep (fds, sorted).
void SettleSet(EpSet& set, const int* keep = nullptr, int n_keep = 0) {
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

// Requires set.mu. The entries whose deferred change asks for more, into
// out (at most `limit`, sorted by fd), if every one of them fits; 0 when
// there are none or too many.
int FindPendingInterest(const EpSet& set, PendingInterest* out, int limit) {
  int n = 0;
  for (int fd : set.dirty_fds) {
    auto it = set.entries.find(fd);
    if (it == set.entries.end() || !AsksForMore(it->second)) continue;
    bool seen = false;  // (dirty_fds may name an fd twice)
    for (int i = 0; i < n && !seen; ++i) seen = out[i].fd == fd;
    if (seen) continue;
    if (n == limit) return 0;
    out[n++] = PendingInterest{fd, it->second.events, it->second.data};
  }
  std::sort(out, out + n, [](const PendingInterest& a, const PendingInterest& b) { return a.fd < b.fd; });
  return n;
}

// What the kernel's wait would report now for the pending entries, by one
// poll() of their sockets (no sleep); the count reported into ev.
int ReadyNow(const PendingInterest* p, int n, epoll_event* ev) {
  // (poll's bits are epoll's: the static_assert above.)
  pollfd pf[kMaxPendingInterest];
  for (int i = 0; i < n; ++i) pf[i] = pollfd{p[i].fd, static_cast<short>(p[i].events & kAskable), 0};
  if (Libc().poll(pf, static_cast<nfds_t>(n), 0) <= 0) return 0;
  int k = 0;
  for (int i = 0; i < n; ++i) {
    auto r = static_cast<uint16_t>(pf[i].revents);
    if (r == 0 || (r & POLLNVAL)) continue;  // (POLLNVAL: closed meanwhile, gone from the set)
    ev[k].events = r & kPollable & (p[i].events | EPOLLERR | EPOLLHUP);
    ev[k].data = p[i].data;
    ++k;
  }
  return k;
}

// The epoll sets by epfd, for a look-up without a mutex on every
// epoll_ctl and epoll_wait. A set is never freed: closing its epfd empties
// it and marks it not live, and the next epoll set with that number reuses
// it (at most one per fd number). g_ep_mu orders creation and close.
constexpr int kMaxSets = kTableFds;
std::mutex g_ep_mu;
std::atomic<EpSet*> g_set_of[kMaxSets];
std::vector<int> g_live_sets;  // the live sets' epfds, under g_ep_mu
// How many sets hold a node (EpEntry, present or deleted) for each fd
// number, changed under the set's mutex: closing an fd no set knows (nginx
// closes a file after every response) looks at no set. Nodes exist only
// for connections (Lookup: fds below kMaxSets).
std::atomic<int> g_nodes_of[kMaxSets];

// Requires set.mu.
EpEntry& AddNode(EpSet& set, int fd, EpEntry&& e) {
  EpEntry& added = set.entries.emplace(fd, std::move(e)).first->second;
  g_nodes_of[fd].fetch_add(1, std::memory_order_relaxed);
  return added;
}

// Requires set.mu.
void EraseNode(EpSet& set, std::unordered_map<int, EpEntry>::iterator it) {
  g_nodes_of[it->first].fetch_sub(1, std::memory_order_relaxed);
  set.entries.erase(it);
}

// Requires set.mu.
void ClearNodes(EpSet& set) {
  for (const auto& [fd, e] : set.entries) g_nodes_of[fd].fetch_sub(1, std::memory_order_relaxed);
  set.entries.clear();
  set.dirty_fds.clear();
}

// Requires g_ep_mu.
std::vector<EpSet*> LiveSets() {
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
  std::lock_guard<std::mutex> lock(g_ep_mu);
  set = g_set_of[epfd].load(std::memory_order_relaxed);
  if (set != nullptr && set->live.load(std::memory_order_relaxed)) return set;
  if (set == nullptr) {
    set = new EpSet();  // never freed (see above)
    g_set_of[epfd].store(set, std::memory_order_release);
  }
  std::lock_guard<std::mutex> set_lock(set->mu);
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

// Session s's wake-ups in the epoll set epfd: its event fd, its backend's
// hang-up, and the set's wake eventfd written on every drain.
void HookSession(int epfd, const EpSet& set, Session* s) {
  s->AddWaiter(set.wake_efd);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLET;
  ev.data.u64 = kSessionMarker;
  Libc().epoll_ctl(epfd, EPOLL_CTL_ADD, s->event_fd(), &ev);
  ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
  ev.data.u64 = kBackendMarker;
  Libc().epoll_ctl(epfd, EPOLL_CTL_ADD, s->liveness_fd(), &ev);
}

void UnhookSession(int epfd, const EpSet& set, Session* s) {
  s->RemoveWaiter(set.wake_efd);
  Libc().epoll_ctl(epfd, EPOLL_CTL_DEL, s->event_fd(), nullptr);
  Libc().epoll_ctl(epfd, EPOLL_CTL_DEL, s->liveness_fd(), nullptr);
}

// Requires set.mu. Moves an upgraded connection out of the kernel set and
// hooks the session's wake-ups in.
void RefreshEntry(int epfd, EpSet& set, int fd, EpEntry& e) {
  Settle(set, fd, e);
  // An upgraded connection's readiness comes from us (its kernel socket
  // no longer says when it is writable); while it still reads the kernel
  // stream up to the fence, a private edge-triggered registration turns
  // kernel data into a wake-up and a change.
  if (Readiness(fd, *e.conn) != -1) {
    if (e.in_kernel) {
      Libc().epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
      e.in_kernel = false;
      e.kern_present = false;
      e.kicked = true;
    }
    bool feeds = KernelFeedsReads(*e.conn);
    if (feeds && !e.feed) {
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
      ev.data.u64 = kFeedMarker | static_cast<uint32_t>(fd);
      e.feed = Libc().epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) == 0;
    } else if (!feeds && e.feed) {
      Libc().epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
      e.feed = false;
    }
  } else if (!e.in_kernel) {
    // Back on kernel TCP (a downgrade after a link loss): the kernel
    // reports this fd again, with the application's registration.
    if (e.feed) Libc().epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
    e.feed = false;
    epoll_event ev{};
    ev.events = e.disarmed ? 0 : e.events;
    ev.data = e.data;
    e.in_kernel = Libc().epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) == 0;
    e.kern_present = e.in_kernel;
    e.kern_events = ev.events;
    e.kern_data = ev.data;
  }
  // A backend that went away and came back: the connections registered
  // again with a new session, whose wake-ups replace the dead one's.
  if (set.session != nullptr && !set.session->alive() && e.conn->session != nullptr &&
      e.conn->session != set.session && e.conn->session->alive()) {
    UnhookSession(epfd, set, set.session);
    set.session = nullptr;
  }
  // Pending connections need the session's wake-ups too: their UPGRADE
  // arrives as an event, not on the kernel socket. (Connections not
  // registered yet get them only while a wait sleeps: EpollWait.)
  if (set.session == nullptr && e.conn->session != nullptr) {
    set.session = e.conn->session;
    HookSession(epfd, set, set.session);
  }
}

// Requires set.mu. RefreshEntry for every entry.
void Refresh(int epfd, EpSet& set) {
  for (auto& [fd, e] : set.entries)
    if (e.conn) RefreshEntry(epfd, set, fd, e);
}

// Requires set.mu. Appends ready emulated entries. slept_from/until: the
// sleep just ended, if any (NoteLateWakeup).
int Collect(EpSet& set, epoll_event* out, int max, int64_t slept_from = 0, int64_t slept_until = 0) {
  int n = 0;
  for (auto& [fd, e] : set.entries) {
    if (n >= max) break;
    if (!e.conn || e.in_kernel || e.disarmed) continue;
    int r = Readiness(fd, *e.conn);
    if (r < 0) continue;
    uint32_t mask = static_cast<uint32_t>(r) & (e.events | EPOLLERR | EPOLLHUP);
    if (mask == 0) continue;
    if (e.events & EPOLLET) {
      uint32_t gen = e.conn->gen.load(std::memory_order_acquire);
      if (gen == e.last_gen && !e.kicked) continue;
      e.last_gen = gen;
      e.kicked = false;
    }
    if (e.events & EPOLLONESHOT) e.disarmed = true;
    if ((mask & EPOLLIN) && slept_from != 0) NoteLateWakeup(*e.conn, slept_from, slept_until);
    out[n].events = mask;
    out[n].data = e.data;
    ++n;
  }
  return n;
}

// Requires set.mu. Whether a connection in the set is not registered yet
// (another thread may register and upgrade it while we sleep).
bool HasUnprobed(const EpSet& set) {
  for (const auto& [fd, e] : set.entries)
    if (e.conn && e.conn->session == nullptr && e.conn->state.phase() == Phase::kUnprobed && !e.conn->KernelUntilOwnIo())
      return true;
  return false;
}

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

// Requires set.mu. Whether the kernel alone answers for the set: no session
// hooked, and every connection in it on kernel TCP for now: for good, or
// held by the upgrade policy (such a connection registers only at its own
// I/O, and EpollKick then wakes this wait through the set's eventfd).
bool KernelAlone(const EpSet& set) {
  if (set.session != nullptr) return false;
  for (const auto& [fd, e] : set.entries)
    if (e.conn && (!e.in_kernel || !e.conn->KernelUntilOwnIo())) return false;
  return true;
}

bool IsMarker(uint64_t data) {
  return data == kBackendMarker || data == kWakeMarker || data == kSessionMarker || (data & kFeedMask) == kFeedMarker;
}

// Whether a real epoll result has one of our events (without the set's lock).
bool HasMarker(const epoll_event* ev, int n) {
  for (int i = 0; i < n; ++i)
    if (IsMarker(ev[i].data.u64)) return true;
  return false;
}

// Drops our marker events from a real epoll result; returns the kept count.
int Filter(EpSet& set, epoll_event* ev, int n, bool* session_event) {
  int kept = 0;
  for (int i = 0; i < n; ++i) {
    if (ev[i].data.u64 == kBackendMarker) {
      if (set.session != nullptr) set.session->CheckBackend();
      *session_event = true;
      continue;
    }
    if (ev[i].data.u64 == kWakeMarker) {
      uint64_t v;
      (void)!Libc().read(set.wake_efd, &v, sizeof(v));
      continue;
    }
    if (ev[i].data.u64 == kSessionMarker) {
      *session_event = true;
      continue;
    }
    if ((ev[i].data.u64 & kFeedMask) == kFeedMarker) {
      auto it = set.entries.find(static_cast<int>(ev[i].data.u64 & ~kFeedMask));
      if (it != set.entries.end() && it->second.conn) it->second.kicked = true;
      continue;
    }
    ev[kept++] = ev[i];
  }
  return kept;
}

}  // namespace

void EpollNoteWatched(int fd) {
  if (fd < 0 || fd >= kMaxSets) return;
  EpSet* set = g_set_of[fd].load(std::memory_order_acquire);
  if (set == nullptr || !set->live.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(set->mu);
  set->shared = true;
  SettleSet(*set);
}

bool EpollHasDeferred() { return g_dirty_sets.load(std::memory_order_relaxed) != 0; }

void EpollSettleMine() {
  if (t_dirtied.empty()) return;
  std::vector<EpSet*> sets;
  sets.swap(t_dirtied);
  for (EpSet* set : sets) {
    std::lock_guard<std::mutex> lock(set->mu);
    SettleSet(*set);
  }
  sets.clear();
  if (t_dirtied.empty()) t_dirtied.swap(sets);  // (keeps the capacity)
}

void EpollSettleFd(int fd) {
  if (fd < 0 || fd >= kTableFds || g_dirty_of[fd].load(std::memory_order_relaxed) == 0) return;
  for (EpSet* set : t_dirtied) {  // (the usual case: this thread's own change)
    std::lock_guard<std::mutex> lock(set->mu);
    auto it = set->entries.find(fd);
    if (it != set->entries.end()) Settle(*set, fd, it->second);
  }
  if (g_dirty_of[fd].load(std::memory_order_relaxed) != 0) EpollSettleAll();
}

void EpollSettleAll() {
  if (!EpollHasDeferred()) return;
  std::vector<EpSet*> sets;
  {
    std::lock_guard<std::mutex> lock(g_ep_mu);
    sets = LiveSets();
  }
  for (EpSet* set : sets) {
    std::lock_guard<std::mutex> lock(set->mu);
    SettleSet(*set);
  }
}

int EpollCtl(int epfd, int op, int fd, epoll_event* ev) {
  auto conn = Lookup(fd);
  if (!conn) {
    if (op == EPOLL_CTL_ADD) {
      // Maybe an epoll set nested in another, now or once it is ours.
      if (fd >= 0 && fd < kTableFds && !g_nested[fd].load(std::memory_order_relaxed))
        g_nested[fd].store(true, std::memory_order_relaxed);
      EpollNoteWatched(fd);
    }
    return Libc().epoll_ctl(epfd, op, fd, ev);
  }
  EpSet* set = FindSet(epfd, true);
  if (set == nullptr) return Libc().epoll_ctl(epfd, op, fd, ev);
  std::lock_guard<std::mutex> lock(set->mu);
  auto it = set->entries.find(fd);
  bool present = it != set->entries.end() && it->second.conn;
  switch (op) {
    case EPOLL_CTL_ADD: {
      if (present) {
        errno = EEXIST;
        return -1;
      }
      if (ev == nullptr) {
        errno = EFAULT;
        return -1;
      }
      if (it != set->entries.end() && it->second.kern_present) {
        // Added again after a deferred DEL: the kernel still has it.
        EpEntry& e = it->second;
        if (CanDefer(*set, e, *conn, ev->events)) {
          e.conn = std::move(conn);
          e.events = ev->events;
          e.data = ev->data;
          e.in_kernel = true;
          e.kicked = false;
          e.last_gen = ~0u;
          e.disarmed = false;
          MarkDirty(*set, fd, e);  // (still dirty from the DEL: Settle sees what changed)
          return 0;
        }
        Settle(*set, fd, e);  // the DEL first
      }
      if (Libc().epoll_ctl(epfd, EPOLL_CTL_ADD, fd, ev) != 0) return -1;
      EpEntry e{ev->events, ev->data, std::move(conn)};
      e.kern_present = true;
      e.kern_events = ev->events;
      e.kern_data = ev->data;
      EpEntry& added = it != set->entries.end() ? (it->second = std::move(e)) : AddNode(*set, fd, std::move(e));
      const Conn& c = *added.conn;
      // (The others did not change; a connection on kernel TCP until its
      // own next I/O has nothing to refresh.)
      if (!c.KernelUntilOwnIo()) RefreshEntry(epfd, *set, fd, added);
      return 0;
    }
    case EPOLL_CTL_MOD: {
      if (!present) {
        errno = ENOENT;
        return -1;
      }
      if (ev == nullptr) {
        errno = EFAULT;
        return -1;
      }
      EpEntry& e = it->second;
      if (e.in_kernel) {
        if (CanDefer(*set, e, *e.conn, ev->events)) {
          e.events = ev->events;
          e.data = ev->data;
          MarkDirty(*set, fd, e);
          return 0;
        }
        Settle(*set, fd, e);
        if (Libc().epoll_ctl(epfd, EPOLL_CTL_MOD, fd, ev) != 0) return -1;
        e.kern_events = ev->events;
        e.kern_data = ev->data;
      }
      e.events = ev->events;
      e.data = ev->data;
      e.disarmed = false;
      e.last_gen = ~0u;
      if (!e.in_kernel) {
        // Re-arming may make the fd ready at once: wake a sleeping waiter.
        uint64_t one = 1;
        (void)!Libc().write(set->wake_efd, &one, sizeof(one));
      }
      return 0;
    }
    case EPOLL_CTL_DEL: {
      if (!present) {
        errno = ENOENT;
        return -1;
      }
      EpEntry& e = it->second;
      // (For an entry present, kern_present is in_kernel: CanDefer checks it.)
      bool defer = CanDefer(*set, e, *e.conn, e.kern_events);
      if (!defer) {
        Settle(*set, fd, e);
        if (e.in_kernel || e.feed) Libc().epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
      }
      // conn null: deleted, the node kept (EpEntry); with the kernel's
      // registration still there if the DEL waits.
      EpEntry gone;
      gone.in_kernel = false;
      gone.kern_present = defer;
      gone.kern_events = e.kern_events;
      gone.kern_data = e.kern_data;
      gone.dirty = e.dirty;
      e = std::move(gone);
      if (defer) MarkDirty(*set, fd, e);
      return 0;
    }
    default: errno = EINVAL; return -1;
  }
}

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

int EpollWaitFor(int epfd, epoll_event* events, int max, const EpTimeout& t, const sigset_t* sigmask);

}  // namespace

int EpollWait(int epfd, epoll_event* events, int max, int timeout_ms, const sigset_t* sigmask) {
  EpTimeout t{timeout_ms, nullptr, false, timeout_ms < 0 ? -1 : int64_t{timeout_ms} * 1000000};
  return EpollWaitFor(epfd, events, max, t, sigmask);
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
  return EpollWaitFor(epfd, events, max, t, sigmask);
}

namespace {

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
  // From here no change to this set waits (CanDefer): the kernel's
  // registrations are the application's for the whole wait.
  PendingInterest pending[kMaxPendingInterest];
  int n_pending = 0;
  set->mu.lock();
  set->waiters.fetch_add(1, std::memory_order_relaxed);
  bool alone = KernelAlone(*set);
  // Answered by ReadyNow every other wait at most: the kernel's own wait in
  // between reports the other fds, so no entry that keeps asking for more
  // starves them.
  if (alone && sigmask == nullptr && !set->answered_by_poll)
    n_pending = FindPendingInterest(*set, pending, std::min(max, kMaxPendingInterest));
  set->answered_by_poll = false;
  int keep[kMaxPendingInterest];
  for (int i = 0; i < n_pending; ++i) keep[i] = pending[i].fd;
  SettleSet(*set, keep, n_pending);
  set->mu.unlock();
  // (Settled: EpollSettleMine below need not lock it again.)
  t_dirtied.erase(std::remove(t_dirtied.begin(), t_dirtied.end(), set), t_dirtied.end());
  struct Leave {
    EpSet* set;
    ~Leave() { set->waiters.fetch_sub(1, std::memory_order_relaxed); }
  } leave{set};
  // Sets nested in this one are never deferred (EpSet.shared); a change
  // this thread left waiting elsewhere is applied before it waits.
  EpollSettleMine();
  if (n_pending > 0) {
    int n = ReadyNow(pending, n_pending, events);
    std::lock_guard<std::mutex> lock(set->mu);
    if (n > 0) {
      // The kept changes stay deferred, for this thread's next wait.
      set->answered_by_poll = true;
      if (set->dirty != 0) t_dirtied.push_back(set);
      return n;
    }
    SettleSet(*set);  // none ready: the kernel's wait, as asked
  }
  // (A zero timeout's deadline is any past time: no clock read.)
  int64_t deadline = t.ns <= 0 ? t.ns : MonotonicNs() + t.ns;
  for (bool first = true; alone; first = false) {
    // Request/response connections the policy keeps on kernel TCP cost one
    // real epoll_wait, as without us.
    int r = KernelEpollWait(epfd, events, max, t, first, deadline, sigmask);
    if (r <= 0 || !HasMarker(events, r)) return r;
    bool session_event = false;
    std::lock_guard<std::mutex> lock(set->mu);
    r = Filter(*set, events, r, &session_event);
    if (r > 0) return r;
    // Only our wake-up: a connection is registering (EpollKick).
    alone = KernelAlone(*set);
  }
  WaitRecorder wait;  // started once nothing was ready
  int64_t spin_until = MonotonicNs() + PollBudgetNs();
  std::vector<epoll_event> kernel(static_cast<size_t>(max));
  int64_t slept_from = 0, slept_until = 0;  // the last sleep (NoteLateWakeup)
  for (uint32_t iter = 0;; ++iter) {
    int n = 0;
    Session* s;
    if (set->session && set->session->alive()) set->session->TryDrain();
    {
      std::lock_guard<std::mutex> lock(set->mu);
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
      std::lock_guard<std::mutex> lock(set->mu);
      k = Filter(*set, kernel.data(), k, &session_event);
      n = Collect(*set, events, max, slept_from, slept_until);
    }
    for (int i = 0; i < k && n < max; ++i) events[n++] = kernel[i];
    spinning = spinning && n == 0;
    if (session_event && s) s->Drain();
    if (n > 0 || t.ns == 0 || (deadline >= 0 && MonotonicNs() >= deadline)) return n;
    (void)wait.Waiting();
    if (s != nullptr) s->KickIfOwed();
    if (spinning) {
      SpinStep(iter);
      continue;
    }
    // Sleep in the real epoll_wait: our wake eventfd and the session's event
    // fd are in the set, so ring events wake us too.
    Session* borrowed = nullptr;
    if (s == nullptr) {
      bool unprobed;
      {
        std::lock_guard<std::mutex> lock(set->mu);
        unprobed = set->session == nullptr && HasUnprobed(*set);
      }
      // (Opened now if there is none yet: decision 73.)
      if (unprobed) borrowed = SessionForWaiters();
    }
    SleepHooks hooks(epfd, *set, borrowed);
    if (borrowed != nullptr) {
      // Registered (and maybe upgraded) between our look and the hooks?
      std::lock_guard<std::mutex> lock(set->mu);
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
      std::lock_guard<std::mutex> lock(set->mu);
      r = Filter(*set, events, r, &session_event);
    }
    if (session_event && borrowed) borrowed->CheckBackend();  // (Filter checks the set's own)
    if (session_event && sleeper) sleeper->Drain();
    if (r > 0) {
      // Kernel events of entries the kernel owns; ours cannot repeat them.
      std::lock_guard<std::mutex> lock(set->mu);
      return r + Collect(*set, events + r, max - r, slept_from, slept_until);
    }
  }
}

}  // namespace

void EpollKick(const Conn& c) {
  std::vector<EpSet*> sets;
  {
    std::lock_guard<std::mutex> lock(g_ep_mu);
    sets = LiveSets();
  }
  for (EpSet* set : sets) {
    std::lock_guard<std::mutex> lock(set->mu);
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
  new (&g_ep_mu) std::mutex();
  for (EpSet* set : LiveSets()) {
    new (&set->mu) std::mutex();
    set->session = nullptr;  // re-hooked to the child's session when it has one
    set->waiters.store(0, std::memory_order_relaxed);
    // The kernel's epoll object is the parent's too: nothing on it waits.
    set->shared = true;
    SettleSet(*set);
  }
}

void EpollForget(int fd, bool lingering) {
  if (fd < 0 || fd >= kMaxSets) return;  // neither a set of ours nor in one
  // (The kernel drops a closed file's registrations: the number is new.)
  if (g_nested[fd].load(std::memory_order_relaxed)) g_nested[fd].store(false, std::memory_order_relaxed);
  EpSet* maybe_set = g_set_of[fd].load(std::memory_order_acquire);
  bool is_set = maybe_set != nullptr && maybe_set->live.load(std::memory_order_acquire);
  if (!is_set && g_nodes_of[fd].load(std::memory_order_relaxed) == 0) return;
  std::vector<std::pair<int, EpSet*>> sets;
  {
    std::lock_guard<std::mutex> lock(g_ep_mu);
    EpSet* own = g_set_of[fd].load(std::memory_order_relaxed);
    if (own != nullptr && own->live.load(std::memory_order_relaxed)) {
      // fd is an epoll set being closed.
      std::lock_guard<std::mutex> set_lock(own->mu);
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
    for (int epfd : g_live_sets) sets.emplace_back(epfd, g_set_of[epfd].load(std::memory_order_relaxed));
  }
  for (auto& [epfd, set] : sets) {
    std::lock_guard<std::mutex> lock(set->mu);
    if (!set->live.load(std::memory_order_relaxed)) continue;
    auto it = set->entries.find(fd);
    if (it == set->entries.end()) continue;
    Settle(*set, fd, it->second);
    // The kernel keeps an epoll registration as long as the socket: one
    // that lingers would go on reporting a closed, maybe reused, fd number.
    if (lingering && (it->second.in_kernel || it->second.feed)) Libc().epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
    EraseNode(*set, it);
  }
}

}  // namespace vsocket::guest
