#include "guest/core/writer.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include "base/clock.h"
#include "base/log.h"
#include "base/own_fd.h"
#include "guest/core/close.h"
#include "guest/core/registration.h"
#include "guest/core/resync.h"
#include "guest/core/session.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {

namespace {

// The background writer: finishes owed resends for applications that do
// not write again (a reader waiting for a reply to bytes we must resend).
// It works on its own dup of the socket, so it also finishes after the
// application closed its fd, and gives up (RST) after kResendLimitNs.
struct ResyncWriter {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::shared_ptr<Conn>> incoming;
  bool started = false;
  // Ends the writer's poll early: new work, or a lingering connection whose
  // peer consumed everything (WakeWriter). Created with the thread.
  std::atomic<int> wake_fd{-1};
  // For the process's exit (FinishLingersAtExit): the writer's passes so
  // far, what the last one found an exit must wait for (bytes only this
  // process can still put on a kernel socket), and whether it sleeps with
  // nothing at all (under mu).
  std::atomic<uint64_t> passes{0};
  std::atomic<size_t> exit_owed{0};
  bool idle = false;
};

// Never destroyed (the thread outlives exit handlers); replaced in a forked
// child, which has no writer thread (and maybe a mutex locked at the fork).
std::atomic<ResyncWriter*> g_writer{nullptr};

ResyncWriter& Writer() {
  ResyncWriter* w = g_writer.load(std::memory_order_acquire);
  if (w != nullptr) return *w;
  auto* fresh = new ResyncWriter;
  if (g_writer.compare_exchange_strong(w, fresh)) return *fresh;
  delete fresh;
  return *w;
}

// The writer's dups of sockets: a forked child must not keep them open
// (the parent's FIN would wait for the child).
std::mutex g_writer_fds_mu;
std::vector<int> g_writer_fds;

// Serializes the steps of lingering connections (the writer's, and
// ReclaimLingering's): their Conn::session is read and cleared there.
std::mutex g_linger_mu;

int DupHigh(int fd);

void WriterLoop();

// Our own dup of an application's socket, numbered high: out of the way of
// the application's low fd numbers (select()'s FD_SETSIZE, close-all loops
// that start low), and one of the library's own fds (base/own_fd.h).
int DupHigh(int fd) {
  int d = Libc().fcntl(fd, F_DUPFD_CLOEXEC, OwnFdFloor());
  if (d < 0) d = Libc().fcntl(fd, F_DUPFD_CLOEXEC, 3);
  MarkOwnFd(d);
  return d;
}

}  // namespace

// A dup of fd for the writer, recorded at once: fork() holds the same lock
// (BeforeFork), so no child gets a dup it does not know of.
int DupForWriter(int fd) {
  std::lock_guard<std::mutex> lock(g_writer_fds_mu);
  int d = DupHigh(fd);
  if (d >= 0) g_writer_fds.push_back(d);
  return d;
}

void CloseWriterFd(int fd) {
  {
    std::lock_guard<std::mutex> lock(g_writer_fds_mu);
    std::erase(g_writer_fds, fd);
  }
  CloseOwnFd(fd);
}

void ForgetWriterAfterFork() {
  if (ResyncWriter* old = g_writer.load(); old != nullptr) {
    if (int efd = old->wake_fd.load(); efd >= 0) CloseOwnFd(efd);
    g_writer.store(new ResyncWriter);
  }
  new (&g_writer_fds_mu) std::mutex();
  new (&g_linger_mu) std::mutex();
  for (int fd : g_writer_fds) CloseOwnFd(fd);
  g_writer_fds.clear();
}

void Enqueue(const std::shared_ptr<Conn>& c) {
  ResyncWriter& w = Writer();
  std::lock_guard<std::mutex> lock(w.mu);
  w.incoming.push_back(c);
  if (!w.started) {
    w.started = true;
    w.wake_fd.store(OwnFd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)));
    std::thread(WriterLoop).detach();
  }
  w.cv.notify_one();
  WakeWriter();
}

void WakeWriter() {
  ResyncWriter* w = g_writer.load(std::memory_order_acquire);
  int efd = w != nullptr ? w->wake_fd.load(std::memory_order_relaxed) : -1;
  if (efd < 0) return;
  uint64_t one = 1;
  (void)!Libc().write(efd, &one, sizeof(one));
}

namespace {

enum class LingerState { kWaiting, kOver, kResync };

// Reads and drops what arrived on a closed connection's dup (nobody will
// read it); true once the peer's FIN came (or the connection failed).
// Before a lingering connection's dup is closed: bytes the peer sent after
// our close() (e.g. its RESYNC header) would turn our FIN into an RST,
// which may cost it data it has not read yet. The kernel would have reset
// on them too; the FIN matters more. A closed connection waiting for its
// peer's FIN (AwaitPeerFin) is done when this says so.
bool DropKernelInput(int fd) {
  char sink[4096];
  for (int i = 0; i < 256; ++i) {
    ssize_t r = Libc().recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (r == 0) return true;
    if (r < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  }
  return false;
}

// One look at a lingering connection (see Linger()), its session drained
// just before. kResync: the link was lost, resync_fd now holds the dup and
// the resend path takes over.
LingerState StepLinger(Conn& c, int lfd) {
  Session* s = c.session;
  // Ending a linger takes linger_fd (compare-exchange): the writer, or a
  // registration short of rings (ReclaimLingering), whichever comes first.
  auto take = [&] {
    int expected = lfd;
    return c.linger_fd.compare_exchange_strong(expected, -1);
  };
  if (c.state.resynced()) {
    if (!take()) return LingerState::kOver;
    c.resync_start_ns = MonotonicNs();
    int expected = -1;
    if (!c.resync_fd.compare_exchange_strong(expected, lfd)) CloseWriterFd(lfd);
    return LingerState::kResync;
  }
  if (c.rx_tail.load() != c.rx_head.load()) {
    // The peer sent more after our close(), which nobody will read: as the
    // kernel answers data for a closed socket, reset (else the peer, its
    // sends blocked on our full ring, might never consume ours).
    if (!take()) return LingerState::kOver;
    Aborted(c);
    linger lg{1, 0};
    (void)setsockopt(lfd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    CloseWriterFd(lfd);  // RST
    return LingerState::kOver;
  }
  // (A direct peer that mapped the pair reads our bytes where they are.)
  bool consumed = c.credit.load(std::memory_order_acquire) >= c.tx_tail.load(std::memory_order_relaxed) ||
                  (c.direct && c.direct->PeerAttached());
  if (!consumed && s != nullptr && s->alive() && !c.state.reset() && !c.peer_gone.load() &&
      MonotonicNs() - c.linger_start_ns < kResendLimitNs)
    return LingerState::kWaiting;
  if (!take()) return LingerState::kOver;
  (void)DropKernelInput(lfd);
  Unregistered(c);
  CloseWriterFd(lfd);  // the FIN
  return LingerState::kOver;
}

void WriterLoop() {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);  // the application's signals go to its own threads
  ResyncWriter& w = Writer();
  std::vector<std::shared_ptr<Conn>> mine;
  // The dups of closed connections waiting for their peer's FIN that the
  // last poll found quiet: not read again until it says otherwise (one
  // recv per connection and pass would cost more than the connections).
  std::unordered_set<int> quiet;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(w.mu);
      w.idle = mine.empty();
      if (mine.empty()) w.cv.wait(lock, [&] { return !w.incoming.empty(); });
      w.idle = false;
      for (auto& c : w.incoming) mine.push_back(std::move(c));
      w.incoming.clear();
    }
    std::vector<pollfd> pfds;
    if (int efd = w.wake_fd.load(); efd >= 0) {
      uint64_t n;
      (void)!Libc().read(efd, &n, sizeof(n));  // (before the pass: a wake-up during it ends the poll)
      pfds.push_back({efd, POLLIN, 0});
    }
    bool busy = false, lingering = false;
    size_t owed = 0;  // what an exit must wait for (FinishLingersAtExit)
    Session* drained = nullptr;  // once per pass: lingering connections share their process's session
    for (size_t i = 0; i < mine.size();) {
      Conn& c = *mine[i];
      if (int afd = c.await_fin_fd.load(); afd >= 0) {
        bool expired = MonotonicNs() - c.await_fin_start_ns >= kAwaitFinNs;
        if (!expired && (quiet.count(afd) != 0 || !DropKernelInput(afd))) {
          pfds.push_back({afd, POLLIN | POLLRDHUP, 0});
          ++i;
          continue;
        }
        c.await_fin_fd.store(-1);
        CloseWriterFd(afd);  // our FIN after the peer's: TIME_WAIT stays with it
        mine[i] = std::move(mine.back());
        mine.pop_back();
        continue;
      }
      int lfd = c.linger_fd.load();
      if (lfd >= 0) {
        std::lock_guard<std::mutex> steps(g_linger_mu);
        // The application may no longer call us: its events are ours to take.
        // CheckBackend: a backend that went away turns the linger into a
        // resend (StepLinger), never into a FIN with bytes in flight.
        if (Session* s = c.session; s != nullptr && s != drained && s->CheckBackend()) {
          s->TryDrain();
          drained = s;
        }
        LingerState st = StepLinger(c, lfd);
        if (st == LingerState::kWaiting) {
          lingering = true;
          // A direct pair the peer has not mapped: our bytes may yet be
          // owed to its kernel socket (decision 135). (Through vsocketd,
          // alive at this pass, they are vsocketd's to deliver.)
          if (c.direct && !c.direct->PeerAttached()) ++owed;
          ++i;
          continue;
        }
        if (st == LingerState::kOver) {
          mine[i] = std::move(mine.back());
          mine.pop_back();
          continue;
        }
      }
      int fd = c.resync_fd.load();
      bool done = fd < 0;
      if (!done) {
        if (!c.tx_mu.try_lock()) {  // the application is sending: it flushes too
          busy = true;
          ++i;
          continue;
        }
        MutexLock tx(c.tx_mu, kAdoptLock);
        if (c.state.draining() && !c.state.resynced()) {
          // A drain: our TX leaves the ring once the peer consumed it. The
          // application may not call us meanwhile: its events are ours to
          // take.
          if (Session* s = c.session; s != nullptr && s != drained && s->CheckBackend()) {
            s->TryDrain();
            drained = s;
          }
          if (!DrainTxLocked(c) && !c.state.resynced()) {
            if (c.state.phase() == Phase::kUpgraded && !c.shut_wr.load()) {
              // Looked at again soon for a second, then now and then (its
              // CREDIT wakes us either way).
              if (MonotonicNs() - c.resync_start_ns < 1'000'000'000) lingering = true;
              ++i;
              continue;
            }
            // Closing or shut down: it ends on the rings, as it would have.
            int owned = fd;
            if (c.resync_fd.compare_exchange_strong(owned, -1)) CloseWriterFd(fd);
            mine[i] = std::move(mine.back());
            mine.pop_back();
            continue;
          }
        }
        Status st = FlushResendLocked(c, fd);
        if (st.ok() || st.sys_errno() != EAGAIN) {
          done = true;
        } else if (MonotonicNs() - c.resync_start_ns > kResendLimitNs) {
          VS_LOG(kWarn, "conn %lu: the peer took no resent bytes for 60 s: connection reset",
                 static_cast<unsigned long>(c.id));
          ResetKernel(fd, c);
          done = true;
        } else {
          pfds.push_back({fd, POLLOUT, 0});
          ++owed;
        }
        if (done) {
          // Ours to close unless StartResync took it back meanwhile.
          int owned = fd;
          if (c.resync_fd.compare_exchange_strong(owned, -1)) {
            // A lingering connection's close ends here: resent, FIN sent.
            if (c.state.lingered()) (void)DropKernelInput(fd);
            CloseWriterFd(fd);
          }
          if (c.state.lingered()) Unregistered(c);
        }
      }
      if (done) {
        mine[i] = std::move(mine.back());
        mine.pop_back();
      } else {
        ++i;
      }
    }
    w.exit_owed.store(owed + (busy ? 1 : 0), std::memory_order_relaxed);
    w.passes.fetch_add(1, std::memory_order_release);
    if (!mine.empty()) (void)Libc().poll(pfds.data(), pfds.size(), busy ? 10 : lingering ? 20 : 200);
    quiet.clear();
    for (const pollfd& p : pfds)
      if (p.revents == 0 && (p.events & POLLRDHUP)) quiet.insert(p.fd);
  }
}

}  // namespace

// Gives the background writer its own dup of fd (which names c's socket).
void HandToWriter(const std::shared_ptr<Conn>& c, int fd) {
  if (c->resync_fd.load() >= 0) return;
  int mine = DupForWriter(fd);
  if (mine < 0) return;
  int expected = -1;
  if (!c->resync_fd.compare_exchange_strong(expected, mine)) {
    CloseWriterFd(mine);
    return;
  }
  Enqueue(c);
}

size_t ReclaimLingering(Session* s, size_t* still) {
  std::lock_guard<std::mutex> steps(g_linger_mu);
  size_t ended = 0, waiting = 0;
  // The writer's own step, a little early: it drops what this ends (its
  // linger_fd is gone), and takes over a resend this starts.
  for (const std::shared_ptr<Conn>& c : s->Tracked()) {
    int lfd = c->linger_fd.load();
    if (lfd < 0) continue;
    if (StepLinger(*c, lfd) == LingerState::kOver)
      ++ended;
    else
      ++waiting;
  }
  if (still != nullptr) *still = waiting;
  return ended;
}

void FinishLingersAtExit() {
  ResyncWriter* w = g_writer.load(std::memory_order_acquire);
  if (w == nullptr) return;
  auto nothing_held = [&] {
    std::lock_guard<std::mutex> lock(w->mu);
    return !w->started || (w->idle && w->incoming.empty());
  };
  if (nothing_held()) return;
  // A pass that began after this call (it looked at every backend again,
  // so a lost one turned its lingering connections into resends) and found
  // nothing owed; at most kExitWaitNs, as the kernel's own linger would not
  // hold an exit either.
  uint64_t from = w->passes.load(std::memory_order_acquire);
  int64_t deadline = MonotonicNs() + kExitWaitNs;
  do {
    WakeWriter();
    usleep(2000);
    if (nothing_held()) return;
    if (w->passes.load(std::memory_order_acquire) >= from + 2 && w->exit_owed.load(std::memory_order_relaxed) == 0)
      return;
  } while (MonotonicNs() < deadline);
  VS_LOG(kWarn, "exit: %zu connection(s) still owed bytes on their kernel socket after %d ms: they go with the process",
         w->exit_owed.load(), static_cast<int>(kExitWaitNs / 1'000'000));
}

void BeforeFork() { g_writer_fds_mu.lock(); }
void AfterForkInParent() { g_writer_fds_mu.unlock(); }

}  // namespace vsocket::guest
