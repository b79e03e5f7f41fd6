#include "guest/core/fd_table.h"

#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>

#include <atomic>
#include <mutex>
#include <new>

#include "base/log.h"
#include "base/mutex.h"
#include "guest/core/close.h"
#include "guest/core/conn_state.h"
#include "guest/core/poll_ops.h"
#include "guest/core/session.h"
#include "guest/core/writer.h"

namespace vsocket::guest {

using proto::Reason;

namespace {

// Every wrapped call looks its fd up, so a look-up takes no mutex: each slot
// has a one-word lock held only while its pointer is copied (or replaced).
// Writers (Adopt, Duplicate, Forget) also hold g_fd_mu, which orders them.
// A fork child resets every slot lock, as it resets g_fd_mu
// (AfterForkInChild): the forking thread is the child's only thread.
struct Slot {
  std::atomic<bool> has{false};  // conn is set: the fast "not ours" answer
  std::atomic<bool> busy{false};
  // Bumped (under busy) at every change of conn: LookupForCall's check.
  std::atomic<uint64_t> version{0};
  std::shared_ptr<Conn> conn;
};

Mutex g_fd_mu;
Slot g_slots[kTableFds];

class SlotLock {
 public:
  explicit SlotLock(Slot& s) : s_(s) {
    for (int spins = 0; s_.busy.exchange(true, std::memory_order_acquire); ++spins) {
      // Held for a pointer copy: another thread preempted inside it is the
      // only long wait, so yield after a few tries rather than spin.
      if (spins > 64) sched_yield();
    }
  }
  ~SlotLock() { s_.busy.store(false, std::memory_order_release); }
  SlotLock(const SlotLock&) = delete;
  SlotLock& operator=(const SlotLock&) = delete;

 private:
  Slot& s_;
};

// Puts c under fd; returns what was there (to drop outside g_fd_mu).
std::shared_ptr<Conn> Store(int fd, std::shared_ptr<Conn> c) REQUIRES(g_fd_mu) {
  Slot& s = g_slots[fd];
  std::shared_ptr<Conn> old;
  {
    SlotLock lock(s);
    old = std::move(s.conn);
    s.conn = std::move(c);
    s.has.store(s.conn != nullptr, std::memory_order_release);
    s.version.fetch_add(1, std::memory_order_release);
  }
  return old;
}

// The calling thread's last LookupForCall: the fd, the slot's version then,
// and a reference to its connection (heap-held, so the TLS block stays
// trivial; freed by the key's destructor when the thread exits). `borrows`
// counts the ConnRefs borrowing it: the entry is replaced only when none do
// (a nested call, a signal handler's, takes its own reference instead).
struct CallCache {
  int fd = -1;
  uint64_t version = 0;
  int borrows = 0;
  bool keyed = false;  // held is registered with g_cache_key on this thread
  std::shared_ptr<Conn>* held = nullptr;
};
constinit thread_local CallCache t_cache;

pthread_key_t g_cache_key;
pthread_once_t g_cache_key_once = PTHREAD_ONCE_INIT;

void CacheKeyInit() {
  pthread_key_create(&g_cache_key, [](void* p) {
    delete static_cast<std::shared_ptr<Conn>*>(p);
    t_cache.held = nullptr;
    t_cache.keyed = false;
    t_cache.fd = -1;
  });
}

// Drops the thread's cached reference if it is fd's and nothing borrows it.
void Uncache(int fd) {
  CallCache& tc = t_cache;
  if (tc.fd != fd || tc.borrows != 0 || tc.held == nullptr) return;
  tc.fd = -1;
  tc.held->reset();
}

std::atomic<uint64_t> g_stale_reclaimed{0};

// fd named `old` until the library found it naming something else: the
// connection's fd was closed (a raw close()) without our seeing it. If no
// other fd names it, it ends as after a close of a socket already gone
// (its rings given back), reported "reclaimed"; fd's epoll nodes go too.
void DropStale(int fd, const std::shared_ptr<Conn>& old) {
  if (!old) return;
  if (old->fd_refs.fetch_sub(1) == 1) {
    uint64_t n = g_stale_reclaimed.fetch_add(1, std::memory_order_relaxed) + 1;
    if (n == 1)
      VS_LOG(kWarn, "fd %d was closed without the library seeing it (a raw system call?): its connection is "
             "reclaimed (the first; later ones are logged at debug level)", fd);
    else
      VS_LOG(kDebug, "fd %d closed unseen: connection reclaimed (%lu so far)", fd, static_cast<unsigned long>(n));
    Teardown(fd, old, /*still_open=*/false, "reclaimed");
  }
  EpollForget(fd);
}

}  // namespace

std::shared_ptr<Conn> Lookup(int fd) {
  if (fd < 0 || fd >= kTableFds) return nullptr;
  Slot& s = g_slots[fd];
  if (!s.has.load(std::memory_order_acquire)) return nullptr;
  SlotLock lock(s);
  return s.conn;
}

// p is t_cache's, and LookupForCall has counted the borrow already.
ConnRef ConnRef::Borrowed(Conn* p) {
  ConnRef r;
  r.p_ = p;
  r.borrowed_ = true;
  return r;
}

ConnRef::~ConnRef() {
  if (!borrowed_) return;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  --t_cache.borrows;
}

ConnRef LookupForCall(int fd) {
  if (fd < 0 || fd >= kTableFds) return ConnRef();
  Slot& s = g_slots[fd];
  CallCache& tc = t_cache;
  if (tc.fd != fd && !s.has.load(std::memory_order_acquire)) return ConnRef();
  // Counted first: a signal handler's look-up on this thread, from here on,
  // leaves the entry alone and takes a reference of its own.
  const int outer = tc.borrows++;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  // The cached reference keeps the connection alive; the version says the
  // fd still names it (a change after this load is a close racing the call,
  // as with Lookup's copy).
  if (tc.fd == fd && s.version.load(std::memory_order_acquire) == tc.version) return ConnRef::Borrowed(tc.held->get());
  std::shared_ptr<Conn> c;
  uint64_t version;
  {
    SlotLock lock(s);
    c = s.conn;
    version = s.version.load(std::memory_order_relaxed);
  }
  if (c == nullptr || outer != 0) {  // not ours, or a nested call: the entry stays
    std::atomic_signal_fence(std::memory_order_seq_cst);
    --tc.borrows;
    return c ? ConnRef(std::move(c)) : ConnRef();
  }
  if (tc.held == nullptr) {
    tc.held = new std::shared_ptr<Conn>();
    tc.keyed = false;
  }
  if (!tc.keyed) {
    pthread_once(&g_cache_key_once, CacheKeyInit);
    tc.keyed = pthread_setspecific(g_cache_key, tc.held) == 0;
  }
  tc.fd = -1;  // (not valid while it changes)
  *tc.held = std::move(c);
  tc.version = version;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  tc.fd = fd;
  return ConnRef::Borrowed(tc.held->get());
}

void Adopt(int fd, bool nonblocking, bool accepted) {
  if (fd < 0 || fd >= kTableFds) return;
  auto c = std::make_shared<Conn>();
  c->role = accepted ? proto::Role::kServer : proto::Role::kClient;
  c->eligible = true;
  c->nonblocking.store(nonblocking);
  c->fd_refs.store(1);
  // Where the policy holds request/response traffic on kernel TCP (decision
  // 51), a new connection is held from birth: an epoll or poll wait on it
  // before its first I/O is then one real wait, as without us (nginx
  // accepts, adds and waits before it reads). The policy may be a parent's,
  // learnt before it forked this worker (decision 132).
  if (Session::RegistersStreamsOnly() && Session::PolicyKnown()) c->held.store(true, std::memory_order_relaxed);
  std::shared_ptr<Conn> old;
  {
    MutexLock lock(g_fd_mu);
    old = Store(fd, std::move(c));
  }
  // A new socket under the number of a connection we never saw closed.
  DropStale(fd, old);
}

void Duplicate(int fd1, int fd2) {
  if (fd2 < 0 || fd2 >= kTableFds) return;
  std::shared_ptr<Conn> c = Lookup(fd1);
  Forget(fd2, false);  // dup2 onto an open fd closes it first
  if (!c) return;
  c->fd_refs.fetch_add(1);
  std::shared_ptr<Conn> old;
  {
    MutexLock lock(g_fd_mu);
    old = Store(fd2, std::move(c));
  }
  DropStale(fd2, old);
}

void Forget(int fd, bool still_open) {
  if (fd < 0 || fd >= kTableFds || !g_slots[fd].has.load()) return;
  std::shared_ptr<Conn> c;
  {
    MutexLock lock(g_fd_mu);
    Slot& s = g_slots[fd];
    SlotLock slot(s);
    c = std::move(s.conn);
    s.has.store(false, std::memory_order_release);
    s.version.fetch_add(1, std::memory_order_release);
  }
  Uncache(fd);
  // Runs before the real close(): fd still names the socket here.
  if (c && c->fd_refs.fetch_sub(1) == 1) Teardown(fd, c, still_open);
}

void AfterForkInChild() {
  ForgetWriterAfterFork();
  Session::ForgetAfterFork();
  EpollAfterForkInChild();
  new (&g_fd_mu) Mutex();
  for (Slot& s : g_slots) s.busy.store(false, std::memory_order_relaxed);
  for (int fd = 0; fd < kTableFds; ++fd) {
    if (!g_slots[fd].has.load()) continue;
    Conn& c = *g_slots[fd].conn;
    // Only this thread exists in the child: locks another thread held at
    // fork time would never be released.
    new (&c.tx_mu) Mutex();
    new (&c.rx_mu) Mutex();
    new (&c.setup_mu) Mutex();
    c.state.AfterForkInChild();
    // One the parent upgraded and that now waits to register again is the
    // parent's too (its byte counts are the parent's).
    bool was_parents = c.state.phase() == Phase::kUnprobed && (c.lost_backend.load() || c.reupgrades.load() > 0);
    if (!c.state.registered() && !was_parents && c.state.phase() != Phase::kWithdrawn) continue;
    // The parent's session owns this registration. A connection that never
    // upgraded is still exact on kernel TCP; an upgraded one is not (reset).
    c.session = nullptr;
    c.state.Apply(ConnEvent::kForked, Reason::kForked);
  }
}

size_t ReclaimStale() {
  size_t n = 0;
  for (int fd = 0; fd < kTableFds; ++fd) {
    if (!g_slots[fd].has.load(std::memory_order_acquire)) continue;
    std::shared_ptr<Conn> c = Lookup(fd);
    if (!c || c->sock_ino == 0) continue;  // (never registered: it holds no rings)
    struct stat st{};
    if (fstat(fd, &st) == 0 && st.st_dev == c->sock_dev && st.st_ino == c->sock_ino) continue;
    std::shared_ptr<Conn> gone;
    {
      MutexLock lock(g_fd_mu);
      Slot& s = g_slots[fd];
      SlotLock slot(s);
      if (s.conn != c) continue;  // changed meanwhile
      gone = std::move(s.conn);
      s.has.store(false, std::memory_order_release);
      s.version.fetch_add(1, std::memory_order_release);
    }
    DropStale(fd, gone);
    ++n;
  }
  return n;
}

uint64_t StaleReclaimed() { return g_stale_reclaimed.load(std::memory_order_relaxed); }

void ForEachConn(const std::function<void(int fd, Conn& c)>& fn) {
  for (int fd = 0; fd < kTableFds; ++fd) {
    if (!g_slots[fd].has.load()) continue;
    std::shared_ptr<Conn> c = Lookup(fd);
    if (c) fn(fd, *c);
  }
}

}  // namespace vsocket::guest
