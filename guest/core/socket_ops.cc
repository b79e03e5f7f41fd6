#include "guest/core/socket_ops.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/log.h"
#include "guest/core/config.h"
#include "guest/core/poll_ops.h"
#include "guest/core/session.h"
#include "guest/preload/libc.h"

namespace vsocket::guest {

using proto::Message;
using proto::MsgType;
using proto::Reason;

const char* ToString(Mode m) {
  switch (m) {
    case Mode::kUnprobed: return "unprobed";
    case Mode::kKernel: return "kernel";
    case Mode::kPending: return "kernel-pending";
    case Mode::kAccel: return "accelerated";
  }
  return "?";
}

namespace {

constexpr int kMaxFds = 1 << 16;

std::mutex g_fd_mu;
std::shared_ptr<Conn> g_fds[kMaxFds];
std::atomic<bool> g_has[kMaxFds];
std::atomic<uint64_t> g_next_conn_id{1};

Status Errno(int e, const char* what) { return Status(Code::kInternal, what, e); }

// ---- registration ---------------------------------------------------------

bool ToEndpoint(const sockaddr_storage& ss, proto::Endpoint* e) {
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    e->family = proto::Family::kIpv4;
    e->addr = {};
    std::memcpy(e->addr.data(), &a->sin_addr, 4);
    e->port = ntohs(a->sin_port);
    return true;
  }
  if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    e->family = proto::Family::kIpv6;
    std::memcpy(e->addr.data(), &a->sin6_addr, 16);
    e->port = ntohs(a->sin6_port);
    return true;
  }
  return false;
}

void SetKernelForGood(Conn& c, Reason r) {
  c.reason.store(r);
  c.mode.store(Mode::kKernel, std::memory_order_release);
}

// Registers an established connection with the backend, once, at its first
// I/O (so a connection accepted by a parent and used by a forked child is
// registered by the child). Data keeps flowing on kernel TCP meanwhile.
void EnsureRegistered(int fd, Conn& c) {
  if (c.mode.load(std::memory_order_acquire) != Mode::kUnprobed) return;
  std::lock_guard<std::mutex> lock(c.setup_mu);
  if (c.mode.load() != Mode::kUnprobed) return;
  if (!c.eligible) return SetKernelForGood(c, Reason::kInherited);
  sockaddr_storage local{}, peer{};
  socklen_t ll = sizeof(local), pl = sizeof(peer);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) return;  // not connected yet
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||
      !ToEndpoint(local, &c.local) || !ToEndpoint(peer, &c.peer))
    return SetKernelForGood(c, Reason::kUnsupportedFamily);
  if (!AccelerationAllowed(Config(), c.peer)) return SetKernelForGood(c, Reason::kDisabledByRule);
  Reason why = Reason::kBackendUnavailable;
  Session* s = Session::Get(&why);
  if (s == nullptr) return SetKernelForGood(c, why);
  if (!s->AllocRings(c, Config().ring_bytes).ok()) return SetKernelForGood(c, Reason::kResourceLimit);
  c.id = g_next_conn_id.fetch_add(1);
  c.session = s;
  c.fd_hint = fd;
  c.registered_ns = MonotonicNs();
  std::shared_ptr<Conn> self = Lookup(fd);
  // Tracked and pending before the request: the UPGRADE can race the ack.
  s->Track(self);
  c.mode.store(Mode::kPending, std::memory_order_release);
  proto::RegisterConn r{c.id, c.role, c.local, c.peer, s->Gpa(c.tx), s->Gpa(c.rx), c.ring_size, c.ring_size};
  Message resp;
  Status st = s->Call({MsgType::kRegisterConn, 0, r}, &resp);
  const auto* ack = std::get_if<proto::RegisterAck>(&resp.body);
  if (!st.ok() || ack == nullptr || ack->status != proto::WireError::kOk) {
    Reason reason = !st.ok() || ack == nullptr ? Reason::kBackendUnavailable : ack->reason;
    VS_LOG(kInfo, "registration refused (%s): stays on kernel TCP",
           st.ok() ? proto::ToString(reason) : st.ToString().c_str());
    SetKernelForGood(c, reason);
    s->Untrack(c.id);
    if (st.ok() && ack != nullptr) {
      // Refused: the backend never used the rings.
      s->FreeRings(c);
    } else {
      // No answer: the request may still be processed. Withdraw it and
      // never reuse the rings (a small leak, only when the backend hangs).
      (void)s->Post({MsgType::kUnregister, 0, proto::Unregister{c.id}});
    }
  }
}

// ---- waiting ----------------------------------------------------------------

struct ThreadWaiter {
  int efd = -1;
  ThreadWaiter() { efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }
  ~ThreadWaiter() {
    if (efd >= 0) Libc().close(efd);
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

int64_t PollBudgetNs() { return Session::SleepAtOnce() ? 0 : ThreadPoll().budget_ns(); }

WaitRecorder::~WaitRecorder() {
  if (start_ != 0) ThreadPoll().Record(MonotonicNs() - start_);
}

int64_t WaitRecorder::Waiting() {
  if (start_ == 0) start_ = MonotonicNs();
  return start_ + PollBudgetNs();
}

namespace {

// Tells the backend a new count (TX tail or RX consumed). Without the
// doorbell: one message per count. With it: the count goes to the block,
// and a message only if the backend asked for one (it stopped polling the
// block). The fence orders our store before our look at the flag, as the
// backend's orders its flag store before its look at the count: one of
// the two always sees the other's (proto/control.h).
Status Announce(Conn& c, uint64_t proto::DoorbellBlock::*count, uint32_t proto::DoorbellBlock::*want, MsgType type,
                uint64_t value) {
  if (c.db == nullptr) return c.session->Post({type, 0, proto::ConnCounter{c.id, value}});
  std::atomic_ref<uint64_t>(c.db->*count).store(value, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::atomic_ref<uint32_t> flag(c.db->*want);
  if (flag.load(std::memory_order_relaxed) == 0 || flag.exchange(0, std::memory_order_acq_rel) == 0)
    return Status::Ok();
  return c.session->Post({type, 0, proto::ConnCounter{c.id, value}});
}

// Blocks until ready() (checked after every change), polling briefly first.
// kernel_fd/kernel_events: also wake when the kernel socket is ready.
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

// Blocks until ready() (checked after every change), polling briefly first.
// kernel_fd/kernel_events: also wake when the kernel socket is ready.
// deadline_ns (-1: none) gives EAGAIN, as an expired SO_*TIMEO does.
template <typename Ready>
Status WaitUntil(Conn& c, Ready ready, int kernel_fd = -1, short kernel_events = 0,
                 int64_t deadline_ns = -1) {
  Session* s = c.session;
  if (s == nullptr) return Status(Code::kUnavailable, "no backend session", ECONNRESET);
  if (ready()) return Status::Ok();
  WaitRecorder wait;
  int64_t spin_until = wait.Waiting();
  for (uint32_t i = 0; MonotonicNs() < spin_until; ++i) {
    if (ready()) return Status::Ok();
    s->TryDrain();
    SpinStep(i);
  }
  int efd = ThreadWaiterFd();
  s->AddWaiter(efd);
  Status result;
  for (;;) {
    if (ready()) break;
    if (!s->alive()) {
      result = Status(Code::kUnavailable, "backend session lost", ECONNRESET);
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
    if (!s->PrepareSleep()) continue;  // work arrived: re-check
    pollfd p[4] = {{efd, POLLIN, 0}, {s->event_fd(), POLLIN, 0}, {s->request_fd(), POLLIN, 0},
                   {kernel_fd, kernel_events, 0}};
    int r = Libc().poll(p, kernel_fd >= 0 ? 4 : 3, timeout_ms);
    int poll_errno = errno;
    s->DoneSleeping();
    if (r < 0 && poll_errno == EINTR && AnyHandlerWithoutRestart()) {
      result = Status(Code::kUnavailable, "interrupted", EINTR);
      break;
    }
    uint64_t v;
    (void)!Libc().read(efd, &v, sizeof(v));
    if (r > 0 && (p[1].revents || p[2].revents)) s->Drain();
  }
  s->RemoveWaiter(efd);
  return result;
}

// ---- ring copies ------------------------------------------------------------

// Copies n bytes between iov (starting `skip` bytes in) and the ring at
// pos, in the direction ToRing says.
template <bool ToRing>
void CopyIovRing(uint8_t* ring, uint32_t size, uint64_t pos, const iovec* iov, int iovcnt,
                 size_t skip, size_t n) {
  for (int i = 0; i < iovcnt && n > 0; ++i) {
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    uint8_t* buf = static_cast<uint8_t*>(iov[i].iov_base) + skip;
    size_t len = std::min(iov[i].iov_len - skip, n);
    skip = 0;
    while (len > 0) {
      uint32_t off = static_cast<uint32_t>(pos & (size - 1));
      size_t chunk = std::min<size_t>(len, size - off);
      if (ToRing) {
        std::memcpy(ring + off, buf, chunk);
      } else {
        std::memcpy(buf, ring + off, chunk);
      }
      pos += chunk;
      buf += chunk;
      len -= chunk;
      n -= chunk;
    }
  }
}

size_t IovLen(const iovec* iov, int iovcnt) {
  size_t n = 0;
  for (int i = 0; i < iovcnt; ++i) n += iov[i].iov_len;
  return n;
}

// At most `limit` bytes of iov starting `skip` bytes in, as up to 64 parts.
int SliceIov(const iovec* iov, int iovcnt, size_t skip, size_t limit, iovec (&part)[64]) {
  int np = 0;
  for (int i = 0; i < iovcnt && limit > 0 && np < 64; ++i) {
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    size_t len = std::min(iov[i].iov_len - skip, limit);
    part[np++] = {static_cast<uint8_t*>(iov[i].iov_base) + skip, len};
    limit -= len;
    skip = 0;
  }
  return np;
}

void Reset(Conn& c, Reason r) {
  c.reason.store(r);
  c.reset.store(true, std::memory_order_release);
}

// EPIPE, with SIGPIPE unless MSG_NOSIGNAL, as the kernel's send does.
Status BrokenPipe(int flags, const char* why) {
  if (!(flags & MSG_NOSIGNAL)) raise(SIGPIPE);
  return Errno(EPIPE, why);
}

bool IsRegistered(const Conn& c) {
  Mode m = c.mode.load(std::memory_order_acquire);
  return m == Mode::kPending || m == Mode::kAccel;
}

bool PrepareResendLocked(Conn& c, int fd);
void HandToWriter(const std::shared_ptr<Conn>& c, int fd);
bool Linger(int fd, Conn& c);
void Enqueue(const std::shared_ptr<Conn>& c);

// The end of a closed connection's registration (at close(), or when its
// linger ends): UNREGISTER.
void Unregistered(Conn& c) {
  Session* s = c.session;
  if (s != nullptr && s->alive() && IsRegistered(c)) {
    // The backend keeps any bytes not yet delivered; the rings are reused
    // once it no longer reads or lets peers write them.
    Status st = s->Unregister(c);
    if (!st.ok()) VS_LOG(kWarn, "unregister: %s", st.ToString().c_str());
  }
  c.session = nullptr;
  c.mode.store(Mode::kKernel);
}

// The end of a closed connection that resets its peer, as the kernel's RST
// after close() does (unread data, SO_LINGER {on, 0}, data arriving after
// close): SHUTDOWN both ways on the accelerated path, then UNREGISTER.
void Aborted(Conn& c) {
  Session* s = c.session;
  if (s != nullptr && s->alive())
    (void)s->Post({MsgType::kShutdown, 0, proto::Shutdown{c.id, proto::ShutdownHow::kBoth}});
  Unregistered(c);
}

void Teardown(int fd, const std::shared_ptr<Conn>& self, bool still_open) {
  Conn& c = *self;
  std::lock_guard<std::mutex> lock(c.setup_mu);
  Session* s = c.session;
  bool registered = IsRegistered(c) && s != nullptr;
  bool abortive = false, lingering = false;
  if (registered && s->alive() && c.upgraded.load()) {
    // The kernel answers close() with RST when unread data is discarded or
    // SO_LINGER is {on, 0}: the peer then sees ECONNRESET, not EOF.
    linger lg{};
    socklen_t len = sizeof(lg);
    abortive = (still_open && getsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, &len) == 0 && lg.l_onoff &&
                lg.l_linger == 0) ||
               c.rx_tail.load() != c.rx_head.load();
    // (After dup2/dup3 onto it the socket is gone already: no linger.)
    if (!abortive && still_open) lingering = Linger(fd, c);
  }
  // Now, even for a connection that lingers (the process may exit first),
  // and before its linger starts: the writer changes what it reports.
  Report(c, "close");
  if (lingering) Enqueue(self);
  if (still_open && !lingering && c.resync.load(std::memory_order_acquire)) {
    // Back on kernel TCP after a link loss: the bytes still owed to the
    // peer leave the TX ring before it is freed, and the writer finishes
    // sending them after this close (as the kernel does with its buffer).
    std::lock_guard<std::mutex> tx(c.tx_mu);
    if (PrepareResendLocked(c, fd) && c.resend_off < c.resend.size()) HandToWriter(self, fd);
  }
  if (!registered || lingering) return;  // (a linger unregisters when it ends)
  if (abortive)
    Aborted(c);
  else
    Unregistered(c);
}

}  // namespace

// ---- fd table ---------------------------------------------------------------

std::shared_ptr<Conn> Lookup(int fd) {
  if (fd < 0 || fd >= kMaxFds || !g_has[fd].load(std::memory_order_acquire)) return nullptr;
  std::lock_guard<std::mutex> lock(g_fd_mu);
  return g_fds[fd];
}

void Adopt(int fd, bool nonblocking, bool accepted) {
  if (fd < 0 || fd >= kMaxFds) return;
  auto c = std::make_shared<Conn>();
  c->role = accepted ? proto::Role::kServer : proto::Role::kClient;
  c->eligible = true;
  c->nonblocking.store(nonblocking);
  c->fd_refs.store(1);
  std::lock_guard<std::mutex> lock(g_fd_mu);
  g_fds[fd] = std::move(c);
  g_has[fd].store(true, std::memory_order_release);
}

void Duplicate(int fd1, int fd2) {
  if (fd2 < 0 || fd2 >= kMaxFds) return;
  std::shared_ptr<Conn> c = Lookup(fd1);
  Forget(fd2, false);  // dup2 onto an open fd closes it first
  if (!c) return;
  c->fd_refs.fetch_add(1);
  std::lock_guard<std::mutex> lock(g_fd_mu);
  g_fds[fd2] = std::move(c);
  g_has[fd2].store(true, std::memory_order_release);
}

void Forget(int fd, bool still_open) {
  if (fd < 0 || fd >= kMaxFds || !g_has[fd].load()) return;
  std::shared_ptr<Conn> c;
  {
    std::lock_guard<std::mutex> lock(g_fd_mu);
    c = std::move(g_fds[fd]);
    g_has[fd].store(false, std::memory_order_release);
  }
  // Runs before the real close(): fd still names the socket here.
  if (c && c->fd_refs.fetch_sub(1) == 1) Teardown(fd, c, still_open);
}

namespace {
void ForgetWriterAfterFork();
}  // namespace

void AfterForkInChild() {
  ForgetWriterAfterFork();
  Session::ForgetAfterFork();
  EpollAfterForkInChild();
  new (&g_fd_mu) std::mutex();
  for (int fd = 0; fd < kMaxFds; ++fd) {
    if (!g_has[fd].load()) continue;
    Conn& c = *g_fds[fd];
    // Only this thread exists in the child: locks another thread held at
    // fork time would never be released.
    new (&c.tx_mu) std::mutex();
    new (&c.rx_mu) std::mutex();
    new (&c.setup_mu) std::mutex();
    if (!IsRegistered(c)) continue;
    // The parent's session owns this registration. A connection that never
    // upgraded is still exact on kernel TCP; an upgraded one is not.
    c.session = nullptr;
    if (c.upgraded.load()) {
      Reset(c, Reason::kForked);
    } else {
      SetKernelForGood(c, Reason::kForked);
    }
  }
}

// ---- data path --------------------------------------------------------------

// Whether the backend has c paired, or accepted a pairing whose peer may
// already have switched (asked on kernel EOF before our UPGRADE).
bool PairingInFlight(Conn& c) {
  proto::Message resp;
  if (!c.session->Call({MsgType::kPairingQuery, 0, proto::ConnCounter{c.id, 0}}, &resp).ok()) return false;
  auto* ack = std::get_if<proto::RegisterAck>(&resp.body);
  return ack != nullptr && ack->status == proto::WireError::kOk && ack->reason == Reason::kNone;
}

// ---- link loss: RESYNC (docs/fabric-design.md "Link loss and RESYNC") -------

namespace {

constexpr int64_t kResendLimitNs = 60'000'000'000;  // then the peer is presumed dead

// Ends the kernel connection with an RST but keeps the fd (connect with
// AF_UNSPEC disconnects): the peer's next call fails with ECONNRESET, so it
// never reads anything ambiguous as data.
void ResetKernel(int fd, Conn& c) {
  sockaddr sa{};
  sa.sa_family = AF_UNSPEC;
  (void)Libc().connect(fd, &sa, sizeof(sa));
  Reset(c, Reason::kFabricDown);
}

// Under tx_mu: decides, once, what this side owes the peer on the kernel
// socket. False if the connection had to be reset.
bool PrepareResendLocked(Conn& c, int fd) {
  if (c.tx_resync_started) return !c.reset.load();
  c.tx_resync_started = true;
  // Never switched: the kernel stream simply goes on, and the peer (which
  // never got our FENCE) expects no header.
  if (!c.tx_switched.load()) return true;
  if (!c.resync_fence_acked.load()) {
    // The peer may not know where our kernel bytes end, so it could not
    // tell our header from data: reset rather than guess.
    VS_LOG(kWarn, "conn %lu: fabric link lost before the peer confirmed our fence: connection reset",
           static_cast<unsigned long>(c.id));
    ResetKernel(fd, c);
    return false;
  }
  // After our FIN nothing more can follow; a peer that misses bytes sees
  // ECONNRESET (it waits for a header that never comes).
  if (c.shut_wr.load() && !c.shut_after_resend) return true;
  // Every byte the peer has not consumed is still in our TX ring (credits
  // are consumption-based); it skips what already landed in its RX ring.
  uint64_t from = c.credit.load(std::memory_order_acquire);
  uint64_t tail = c.tx_tail.load(std::memory_order_relaxed);
  if (from > tail || tail - from > c.ring_size || c.tx == nullptr) {
    ResetKernel(fd, c);
    return false;
  }
  c.resend.resize(proto::kResyncHeaderSize + (tail - from));
  proto::EncodeResync(from, c.resend.data());
  iovec v{c.resend.data() + proto::kResyncHeaderSize, static_cast<size_t>(tail - from)};
  CopyIovRing<false>(c.tx, c.ring_size, from, &v, 1, 0, tail - from);
  c.resend_off = 0;
  VS_LOG(kInfo, "conn %lu: fabric link lost: back on kernel TCP, resending %lu bytes from %lu",
         static_cast<unsigned long>(c.id), static_cast<unsigned long>(tail - from), static_cast<unsigned long>(from));
  return true;
}

// Under tx_mu: writes what is owed without blocking. Ok once it is all in
// the kernel, EAGAIN while the socket is full.
Status FlushResendLocked(Conn& c, int fd) {
  if (!PrepareResendLocked(c, fd)) return Errno(ECONNRESET, "connection reset (fabric link lost)");
  while (c.resend_off < c.resend.size()) {
    ssize_t w = Libc().send(fd, c.resend.data() + c.resend_off, c.resend.size() - c.resend_off,
                            MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w > 0) {
      c.resend_off += static_cast<size_t>(w);
      // Every byte on the kernel stream counts: a later FENCE (after a
      // re-upgrade) is a position in that stream.
      c.kernel_sent.fetch_add(static_cast<uint64_t>(w), std::memory_order_relaxed);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Errno(EAGAIN, "resend pending");
    int e = w < 0 ? errno : EPIPE;
    Reset(c, Reason::kFabricDown);
    return Errno(e, "resend");
  }
  if (!c.resend.empty()) {
    std::vector<uint8_t>().swap(c.resend);
    c.resend_off = 0;
  }
  if (c.shut_after_resend) {
    c.shut_after_resend = false;
    (void)Libc().shutdown(fd, SHUT_WR);
  }
  return Status::Ok();
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

// Under tx_mu: send() once the link is gone: the owed resend first, then
// plain kernel TCP.
Result<size_t> SendResynced(int fd, Conn& c, const iovec* iov, int iovcnt, int flags) {
  bool nonblock = c.nonblocking.load() || (flags & MSG_DONTWAIT);
  int64_t deadline = -2;
  for (;;) {
    Status st = FlushResendLocked(c, fd);
    if (st.ok()) break;
    if (st.sys_errno() != EAGAIN || nonblock) return st;
    Status w = WaitKernel(fd, POLLOUT, SO_SNDTIMEO, &deadline);
    if (!w.ok()) return w;
  }
  if (c.shut_wr.load()) return BrokenPipe(flags, "shut down for writing");
  msghdr mh{};
  mh.msg_iov = const_cast<iovec*>(iov);
  mh.msg_iovlen = static_cast<size_t>(iovcnt);
  ssize_t n = Libc().sendmsg(fd, &mh, flags);
  if (n < 0) return Errno(errno, "sendmsg");
  c.kernel_sent.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
  return static_cast<size_t>(n);
}

// Under rx_mu: consumes the peer's RESYNC header and the bytes it resends
// that already landed in our ring. Ok when done; EAGAIN when the kernel has
// nothing more yet.
Status ConsumeResyncLocked(int fd, Conn& c) {
  using RxResync = Conn::RxResync;
  for (;;) {
    RxResync ph = c.rx_resync.load(std::memory_order_relaxed);
    if (ph == RxResync::kKernel) return Status::Ok();
    uint8_t scratch[4096];
    uint8_t* dst = ph == RxResync::kHeader ? c.rx_hdr + c.rx_hdr_got : scratch;
    size_t want = ph == RxResync::kHeader ? proto::kResyncHeaderSize - c.rx_hdr_got
                                           : std::min<uint64_t>(sizeof(scratch), c.rx_skip);
    ssize_t n = Libc().recv(fd, dst, want, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Errno(EAGAIN, "resync pending");
    if (n <= 0) {
      // The peer could not resend (it had shut down, or reset): bytes are
      // missing, so this is an error, never a short stream.
      Reset(c, Reason::kFabricDown);
      return Errno(n == 0 ? ECONNRESET : errno, "fabric link lost and the peer could not resend");
    }
    c.kernel_received.fetch_add(static_cast<uint64_t>(n));  // stream position, as the peer counts it
    if (ph == RxResync::kHeader) {
      c.rx_hdr_got += static_cast<uint32_t>(n);
      if (c.rx_hdr_got < proto::kResyncHeaderSize) continue;
      auto from = proto::DecodeResync(std::span<const uint8_t, proto::kResyncHeaderSize>(c.rx_hdr, proto::kResyncHeaderSize));
      uint64_t landed = c.resync_landed.load();
      if (!from.ok() || *from > landed || landed - *from > c.ring_size) {
        ResetKernel(fd, c);
        return Errno(EPROTO, "bad RESYNC header from the peer");
      }
      c.rx_skip = landed - *from;
      c.rx_resync.store(c.rx_skip ? RxResync::kSkip : RxResync::kKernel, std::memory_order_release);
    } else {
      c.rx_skip -= static_cast<uint64_t>(n);
      if (c.rx_skip == 0) c.rx_resync.store(RxResync::kKernel, std::memory_order_release);
    }
  }
}

// The background writer: finishes owed resends for applications that do
// not write again (a reader waiting for a reply to bytes we must resend).
// It works on its own dup of the socket, so it also finishes after the
// application closed its fd, and gives up (RST) after kResendLimitNs.
struct ResyncWriter {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::shared_ptr<Conn>> incoming;
  bool started = false;
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

int DupHigh(int fd);

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
  Libc().close(fd);
}

void ForgetWriterAfterFork() {
  if (g_writer.load() != nullptr) g_writer.store(new ResyncWriter);
  new (&g_writer_fds_mu) std::mutex();
  for (int fd : g_writer_fds) Libc().close(fd);
  g_writer_fds.clear();
}

void WriterLoop();

// Our own dup of an application's socket, numbered high: out of the way of
// the application's low fd numbers (select()'s FD_SETSIZE, close-all loops
// that start low).
int DupHigh(int fd) {
  rlimit rl{};
  int lo = 3;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur > 64)
    lo = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > 2048 ? 1024 : static_cast<int>(rl.rlim_cur / 2);
  int d = Libc().fcntl(fd, F_DUPFD_CLOEXEC, lo);
  return d >= 0 ? d : Libc().fcntl(fd, F_DUPFD_CLOEXEC, 3);
}

void Enqueue(const std::shared_ptr<Conn>& c) {
  ResyncWriter& w = Writer();
  std::lock_guard<std::mutex> lock(w.mu);
  w.incoming.push_back(c);
  if (!w.started) {
    w.started = true;
    std::thread(WriterLoop).detach();
  }
  w.cv.notify_one();
}

enum class LingerState { kWaiting, kOver, kResync };

// Before a lingering connection's dup is closed: bytes the peer sent after
// our close() (e.g. its RESYNC header) would turn our FIN into an RST,
// which may cost it data it has not read yet. The kernel would have reset
// on them too; the FIN matters more.
void DropKernelInput(int fd) {
  char sink[4096];
  for (int i = 0; i < 256 && Libc().recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
  }
}

// One look at a lingering connection (see Linger()), its session drained
// just before. kResync: the link was lost, resync_fd now holds the dup and
// the resend path takes over.
LingerState StepLinger(Conn& c, int lfd) {
  Session* s = c.session;
  if (c.resync.load(std::memory_order_acquire)) {
    c.linger_fd.store(-1);
    c.resync_start_ns = MonotonicNs();
    int expected = -1;
    if (!c.resync_fd.compare_exchange_strong(expected, lfd)) CloseWriterFd(lfd);
    return LingerState::kResync;
  }
  if (c.rx_tail.load() != c.rx_head.load()) {
    // The peer sent more after our close(), which nobody will read: as the
    // kernel answers data for a closed socket, reset (else the peer, its
    // sends blocked on our full ring, might never consume ours).
    c.linger_fd.store(-1);
    Aborted(c);
    linger lg{1, 0};
    (void)setsockopt(lfd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    CloseWriterFd(lfd);  // RST
    return LingerState::kOver;
  }
  bool consumed = c.credit.load(std::memory_order_acquire) >= c.tx_tail.load(std::memory_order_relaxed);
  if (!consumed && s != nullptr && s->alive() && !c.reset.load() && !c.peer_gone.load() &&
      MonotonicNs() - c.linger_start_ns < kResendLimitNs)
    return LingerState::kWaiting;
  c.linger_fd.store(-1);
  DropKernelInput(lfd);
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
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(w.mu);
      if (mine.empty()) w.cv.wait(lock, [&] { return !w.incoming.empty(); });
      for (auto& c : w.incoming) mine.push_back(std::move(c));
      w.incoming.clear();
    }
    std::vector<pollfd> pfds;
    bool busy = false, lingering = false;
    Session* drained = nullptr;  // once per pass: lingering connections share their process's session
    for (size_t i = 0; i < mine.size();) {
      Conn& c = *mine[i];
      int lfd = c.linger_fd.load();
      if (lfd >= 0) {
        // The application may no longer call us: its events are ours to take.
        if (Session* s = c.session; s != nullptr && s != drained && s->alive()) {
          s->TryDrain();
          drained = s;
        }
        LingerState st = StepLinger(c, lfd);
        if (st == LingerState::kWaiting) {
          lingering = true;
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
        std::unique_lock<std::mutex> tx(c.tx_mu, std::try_to_lock);
        if (!tx.owns_lock()) {  // the application is sending: it flushes too
          busy = true;
          ++i;
          continue;
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
        }
        if (done) {
          // Ours to close unless StartResync took it back meanwhile.
          int owned = fd;
          if (c.resync_fd.compare_exchange_strong(owned, -1)) {
            // A lingering connection's close ends here: resent, FIN sent.
            if (c.lingered.load()) DropKernelInput(fd);
            CloseWriterFd(fd);
          }
          if (c.lingered.load()) Unregistered(c);
        }
      }
      if (done) {
        mine[i] = std::move(mine.back());
        mine.pop_back();
      } else {
        ++i;
      }
    }
    if (!mine.empty()) (void)Libc().poll(pfds.data(), pfds.size(), busy ? 10 : lingering ? 20 : 200);
  }
}

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

// close() of a connection whose peer has not consumed all we wrote
// accelerated. The kernel goes on sending its buffer after close(); here
// the backend delivers those bytes, and a link loss before they are
// consumed needs a resend on the kernel socket (RESYNC), which the FIN of
// a plain close() would forbid. So the connection lingers: the EOF goes
// the accelerated way (SHUTDOWN), the registration stays, and the
// background writer keeps a dup of the socket (no FIN yet) until the peer
// consumed everything; then UNREGISTER and the FIN. If the link dies
// first, the writer resends through the dup, FIN after it. Bounded by
// kResendLimitNs; ends at once if the peer is gone or the session lost.
// A process that exits meanwhile closes the dup (as before: the backend
// still delivers over a live link).
bool Linger(int fd, Conn& c) {
  if (c.reset.load() || c.resync.load() || c.peer_gone.load() || c.mode.load() != Mode::kAccel ||
      !c.tx_switched.load())
    return false;
  if (c.credit.load(std::memory_order_acquire) >= c.tx_tail.load(std::memory_order_relaxed)) return false;
  if (!c.shut_wr.load() && !Shutdown(fd, c, SHUT_WR).ok()) return false;
  {
    std::lock_guard<std::mutex> tx(c.tx_mu);
    // The FIN went out already (everything consumed meanwhile), or follows
    // a resend already under way: nothing to wait for.
    if (!c.shut_after_resend || c.tx_resync_started) return false;
  }
  int mine = DupForWriter(fd);
  if (mine < 0) return false;
  c.linger_start_ns = MonotonicNs();
  c.lingered.store(true);
  c.linger_fd.store(mine);
  return true;  // the caller hands it to the writer
}

// A connection that finished its RESYNC both ways (our resend is in the
// kernel, the peer's header is read) leaves its old registration and
// registers again, so it re-upgrades once the link is back (the backend
// pairs it when the peer registers again too; until then it is an ordinary
// pending connection on kernel TCP). Never blocks: if another thread is
// inside a send or receive, a later call does it.
void MaybeReregister(int fd, Conn& c) {
  if (!c.resync.load(std::memory_order_acquire) || c.reset.load() ||
      c.rx_resync.load(std::memory_order_acquire) != Conn::RxResync::kKernel || c.resync_fd.load() >= 0 ||
      c.shut_wr.load() || c.shut_rd.load() || c.peer_shut_wr.load() || c.peer_gone.load())
    return;
  std::unique_lock<std::mutex> setup(c.setup_mu, std::try_to_lock);
  if (!setup.owns_lock()) return;
  std::unique_lock<std::mutex> tx(c.tx_mu, std::try_to_lock);
  if (!tx.owns_lock()) return;
  std::unique_lock<std::mutex> rx(c.rx_mu, std::try_to_lock);
  if (!rx.owns_lock() || !c.resync.load() || !c.tx_resync_started || !c.resend.empty() || c.session == nullptr)
    return;
  Session* s = c.session;
  if (!s->Unregister(c).ok()) {
    SetKernelForGood(c, Reason::kBackendUnavailable);
    return;
  }
  c.session = nullptr;
  // A fresh accelerated state; the kernel byte counts go on (fences are
  // positions in the kernel stream).
  c.tx_switched.store(false);
  c.rx_switched.store(false);
  c.tx_tail.store(0);
  c.rx_head.store(0);
  c.consumed_reported = 0;
  c.wrote_after_peer_gone = false;
  c.upgraded.store(false);
  c.peer_fence_known.store(false);
  c.peer_fence.store(0);
  c.rx_tail.store(0);
  c.credit.store(0);
  c.resync_fence_acked.store(false);
  c.resync_landed.store(0);
  c.tx_resync_started = false;
  c.shut_after_resend = false;
  c.rx_resync.store(Conn::RxResync::kRing);
  c.rx_hdr_got = 0;
  c.rx_skip = 0;
  c.reason.store(Reason::kPending);
  c.resync.store(false, std::memory_order_release);
  c.mode.store(Mode::kUnprobed, std::memory_order_release);
  c.reupgrades.fetch_add(1, std::memory_order_relaxed);
  VS_LOG(kInfo, "conn %lu: resynced on kernel TCP; registering again to re-upgrade", static_cast<unsigned long>(c.id));
}

}  // namespace

void StartResync(const std::shared_ptr<Conn>& c) {
  c->resync_start_ns = MonotonicNs();
  // The application may close and reuse fd numbers: the fd must name c on
  // both sides of the dup.
  int fd = c->fd_hint;
  if (fd < 0 || Lookup(fd).get() != c.get()) return;  // its sends (or its close) flush it
  HandToWriter(c, fd);
  if (Lookup(fd).get() != c.get()) {
    int mine = c->resync_fd.exchange(-1);
    if (mine >= 0) CloseWriterFd(mine);  // the writer drops a conn without fd
  }
}

Result<size_t> Send(int fd, Conn& c, const iovec* iov, int iovcnt, int flags) {
  MaybeReregister(fd, c);
  EnsureRegistered(fd, c);
  std::unique_lock<std::mutex> lock(c.tx_mu);
  if (c.reset.load()) return Errno(ECONNRESET, "connection reset");
  if (c.resync.load(std::memory_order_acquire)) return SendResynced(fd, c, iov, iovcnt, flags);
  // A sender that never reads must still hear its UPGRADE.
  if (c.mode.load(std::memory_order_acquire) == Mode::kPending && c.session) c.session->TryDrain();
  if (c.mode.load(std::memory_order_acquire) == Mode::kAccel && !c.tx_switched.load()) {
    // Switch-over: from here on this direction uses the ring; the peer reads
    // exactly kernel_sent bytes from its kernel socket first.
    Status st = c.session->Post({MsgType::kFence, 0, proto::ConnCounter{c.id, c.kernel_sent.load()}});
    if (!st.ok()) {
      Reset(c, Reason::kBackendUnavailable);
      return Errno(ECONNRESET, "connection reset");
    }
    c.fence_sent.store(c.kernel_sent.load());
    c.tx_switched.store(true, std::memory_order_release);
  }
  if (!c.tx_switched.load()) {
    msghdr mh{};
    mh.msg_iov = const_cast<iovec*>(iov);
    mh.msg_iovlen = static_cast<size_t>(iovcnt);
    ssize_t n = Libc().sendmsg(fd, &mh, flags);
    if (n < 0) {
      VS_LOG(kDebug, "fd %d conn %lu (%s): kernel send: %m", fd, static_cast<unsigned long>(c.id),
             ToString(c.mode.load()));
      return Errno(errno, "sendmsg");
    }
    c.kernel_sent.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    return static_cast<size_t>(n);
  }
  size_t total = IovLen(iov, iovcnt);
  if (c.shut_wr.load()) return BrokenPipe(flags, "shut down for writing");  // even for 0 bytes
  bool nonblock = c.nonblocking.load() || (flags & MSG_DONTWAIT);
  size_t sent = 0;
  const uint32_t size = c.ring_size;
  int64_t deadline = -2;  // looked up when we first have to block
  while (sent < total) {
    if (c.reset.load()) return sent ? Result<size_t>(sent) : Errno(ECONNRESET, "connection reset");
    if (c.resync.load(std::memory_order_acquire))
      return sent ? Result<size_t>(sent) : SendResynced(fd, c, iov, iovcnt, flags);
    if (c.shut_wr.load()) return sent ? Result<size_t>(sent) : BrokenPipe(flags, "shut down for writing");
    if (c.peer_gone.load(std::memory_order_acquire)) {
      if (sent) return sent;
      // As over TCP: the first write after the peer closed still "succeeds"
      // (the kernel would send it and get an RST back); later ones fail.
      if (!c.wrote_after_peer_gone) {
        c.wrote_after_peer_gone = true;
        return total;
      }
      return BrokenPipe(flags, "peer closed");
    }
    uint64_t tail = c.tx_tail.load(std::memory_order_relaxed);
    uint64_t credit = c.credit.load(std::memory_order_acquire);
    if (credit > tail) {
      Reset(c, Reason::kProtocolError);
      return Errno(EPROTO, "credit beyond what was sent");
    }
    uint64_t space = size - (tail - credit);
    if (space == 0) {
      if (c.session->TryDrain()) continue;  // a credit may be waiting
      if (nonblock) return sent ? Result<size_t>(sent) : Errno(EAGAIN, "ring full");
      if (deadline == -2) deadline = SocketDeadline(fd, SO_SNDTIMEO);
      Status st = WaitUntil(c, [&] {
        return c.credit.load(std::memory_order_acquire) != credit || c.reset.load() || c.peer_gone.load() ||
               c.shut_wr.load() || c.resync.load();
      }, -1, 0, deadline);
      if (!st.ok() && sent > 0) return sent;
      if (!st.ok()) return st;
      continue;
    }
    size_t n = std::min<uint64_t>(space, total - sent);
    CopyIovRing<true>(c.tx, size, tail, iov, iovcnt, sent, n);
    // Release: the ring bytes are written before the tail is published.
    c.tx_tail.store(tail + n, std::memory_order_release);
    Status st = Announce(c, &proto::DoorbellBlock::tx_tail, &proto::DoorbellBlock::want_tx, MsgType::kTxTail, tail + n);
    if (!st.ok()) {
      Reset(c, Reason::kBackendUnavailable);
      return sent ? Result<size_t>(sent) : Errno(ECONNRESET, "connection reset");
    }
    c.accel_tx.fetch_add(n, std::memory_order_relaxed);
    sent += n;
  }
  return sent;
}

Result<size_t> Recv(int fd, Conn& c, const iovec* iov, int iovcnt, int flags) {
  MaybeReregister(fd, c);
  EnsureRegistered(fd, c);
  Mode mode = c.mode.load(std::memory_order_acquire);
  if (mode == Mode::kKernel || mode == Mode::kUnprobed) {
    // Not registered: the kernel socket alone, exactly as without us.
    msghdr mh{};
    mh.msg_iov = const_cast<iovec*>(iov);
    mh.msg_iovlen = static_cast<size_t>(iovcnt);
    std::lock_guard<std::mutex> lock(c.rx_mu);
    ssize_t n = Libc().recvmsg(fd, &mh, flags);
    if (n < 0) return Errno(errno, "recvmsg");
    if (!(flags & MSG_PEEK)) c.kernel_received.fetch_add(static_cast<uint64_t>(n));
    return static_cast<size_t>(n);
  }
  std::unique_lock<std::mutex> lock(c.rx_mu);
  size_t want = IovLen(iov, iovcnt);
  if (want == 0) {
    // As the kernel: a zero-length recv() still waits until the socket is
    // readable (read() of 0 bytes returns at once; the wrapper handles it).
    if (Readiness(fd, c) < 0) {
      ssize_t n = Libc().recv(fd, nullptr, 0, flags);
      return n < 0 ? Result<size_t>(Errno(errno, "recv")) : Result<size_t>(size_t{0});
    }
    if (c.nonblocking.load() || (flags & MSG_DONTWAIT)) {
      if (Readiness(fd, c) & POLLIN) return size_t{0};
      if (c.session->TryDrain() && (Readiness(fd, c) & POLLIN)) return size_t{0};
      return Errno(EAGAIN, "no data");
    }
    Status st = WaitUntil(c, [&] { int r = Readiness(fd, c); return r < 0 || (r & POLLIN); });
    if (!st.ok()) return st;
    return size_t{0};
  }
  bool nonblock = c.nonblocking.load() || (flags & MSG_DONTWAIT);
  bool peek = flags & MSG_PEEK;
  bool waitall = (flags & MSG_WAITALL) && !peek && !nonblock;
  size_t got = 0;
  int64_t deadline = -2;  // SO_RCVTIMEO, looked up when we first have to block
  for (;;) {
    if (c.reset.load()) return got ? Result<size_t>(got) : Errno(ECONNRESET, "connection reset");
    if (c.resync.load(std::memory_order_acquire)) {
      // The link is gone: the fenced kernel bytes and the ring come first
      // (kRing, below), then the peer's RESYNC header, then kernel TCP.
      using RxResync = Conn::RxResync;
      RxResync ph = c.rx_resync.load(std::memory_order_relaxed);
      if (ph == RxResync::kRing && !c.peer_fence_known.load(std::memory_order_acquire)) {
        // The peer never switched (or will reset): all its bytes are on the
        // kernel stream, no header comes.
        c.rx_resync.store(RxResync::kKernel, std::memory_order_release);
        continue;
      }
      if (ph == RxResync::kHeader || ph == RxResync::kSkip) {
        Status st = ConsumeResyncLocked(fd, c);
        if (st.ok()) continue;
        if (st.sys_errno() != EAGAIN || got || nonblock) return got ? Result<size_t>(got) : Result<size_t>(st);
        Status w = WaitKernel(fd, POLLIN, SO_RCVTIMEO, &deadline);
        if (!w.ok()) return w;
        continue;
      }
      if (ph == RxResync::kKernel) {
        if (got && !waitall) return got;
        iovec part[64];
        int np = SliceIov(iov, iovcnt, got, want - got, part);
        msghdr mh{};
        mh.msg_iov = part;
        mh.msg_iovlen = static_cast<size_t>(np);
        ssize_t n = Libc().recvmsg(fd, &mh, flags);
        if (n < 0) return got ? Result<size_t>(got) : Errno(errno, "recvmsg");
        if (!peek) c.kernel_received.fetch_add(static_cast<uint64_t>(n));
        return got + static_cast<size_t>(n);
      }
    }
    if (!c.rx_switched.load()) {
      // Snapshot before looking at anything: an event dispatched by another
      // thread after this point changes gen and ends the wait below.
      uint32_t gen = c.gen.load(std::memory_order_acquire);
      bool upgraded = c.mode.load(std::memory_order_acquire) == Mode::kAccel;
      bool fence_known = c.peer_fence_known.load(std::memory_order_acquire);
      // Pending, or upgraded with the fence not known: the UPGRADE, FENCE
      // or DOWNGRADE event may be waiting in the event queue, and past the
      // peer's fence the kernel stream can hold a RESYNC header, never data.
      // Look before reading the kernel.
      if (!fence_known && IsRegistered(c) && c.session != nullptr) {
        Mode before = c.mode.load(std::memory_order_acquire);
        c.session->Drain();  // waits for a drain another thread is doing, too
        if (c.mode.load(std::memory_order_acquire) != before || c.peer_fence_known.load(std::memory_order_acquire) ||
            c.resync.load(std::memory_order_acquire) || c.reset.load())
          continue;
      }
      uint64_t limit = want - got;
      if (upgraded && fence_known) {
        uint64_t fence = c.peer_fence.load(std::memory_order_relaxed);
        uint64_t rcvd = c.kernel_received.load();
        if (rcvd > fence) {
          Reset(c, Reason::kProtocolError);
          return Errno(EPROTO, "peer fence behind bytes received");
        }
        if (rcvd == fence) {
          c.rx_switched.store(true, std::memory_order_release);
          continue;
        }
        limit = std::min<uint64_t>(limit, fence - rcvd);
      }
      // Never block inside the kernel here: the peer may switch to the ring
      // at any moment, and only our own wait sees both.
      iovec part[64];
      int np = SliceIov(iov, iovcnt, got, limit, part);
      msghdr mh{};
      mh.msg_iov = part;
      mh.msg_iovlen = static_cast<size_t>(np);
      ssize_t n = Libc().recvmsg(fd, &mh, (flags & MSG_PEEK) | MSG_DONTWAIT);
      if (n > 0) {
        if (!peek) c.kernel_received.fetch_add(static_cast<uint64_t>(n));
        got += static_cast<size_t>(n);
        if (!waitall || got == want) return got;
        continue;
      }
      bool kernel_eof = false;
      if (n == 0) {
        if (!upgraded) {
          // Registered, not upgraded: the peer may have switched to the ring
          // and shut down its kernel side before our UPGRADE arrived (across
          // hosts it learns of the pairing first). The backend knows.
          if (!IsRegistered(c) || c.session == nullptr) return got;
          if (c.session->TryDrain()) continue;
          if (!PairingInFlight(c)) return got;  // plain kernel EOF
          kernel_eof = true;  // wait for the UPGRADE (or DOWNGRADE) event
        } else {
          // Another thread may have dispatched the FENCE meanwhile: read the
          // flags again, shutdown first (the backend sends FENCE before it,
          // and the dispatcher's release orders them).
          bool shut = c.peer_shut_wr.load(std::memory_order_acquire);
          if (c.peer_fence_known.load(std::memory_order_acquire)) {
            if (c.kernel_received.load() < c.peer_fence.load()) {
              Reset(c, Reason::kProtocolError);
              return got ? Result<size_t>(got) : Errno(EPROTO, "kernel stream ended before the fence");
            }
            continue;  // exactly at the fence: the ring follows
          }
          if (shut) return got;  // peer closed without switching: final
          // The peer upgraded: its FENCE or its orderly shutdown is on the way.
          kernel_eof = true;
        }
      } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        if (got) return got;
        return Errno(errno, "recvmsg");
      }
      if (got && !waitall) return got;
      // Events not yet dispatched may already have the fence or shutdown.
      if (c.session->TryDrain()) continue;
      if (c.shut_rd.load()) return got;  // queued data first, then EOF, never block
      if (nonblock) return got ? Result<size_t>(got) : Errno(EAGAIN, "no data");
      if (deadline == -2) deadline = SocketDeadline(fd, SO_RCVTIMEO);
      Status st = WaitUntil(c, [&] {
        if (c.gen.load(std::memory_order_acquire) != gen || c.reset.load()) return true;
        if (kernel_eof) return false;
        pollfd p{fd, POLLIN, 0};
        return Libc().poll(&p, 1, 0) > 0;
      }, kernel_eof ? -1 : fd, POLLIN, deadline);
      if (!st.ok() && !c.upgraded.load() && !c.session->alive()) {
        // The backend went away before the upgrade: plain kernel TCP from
        // here on, exactly as if we had never registered.
        lock.unlock();
        msghdr mh{};
        mh.msg_iov = const_cast<iovec*>(iov);
        mh.msg_iovlen = static_cast<size_t>(iovcnt);
        if (got) return got;
        ssize_t n = Libc().recvmsg(fd, &mh, flags);
        if (n < 0) return Errno(errno, "recvmsg");
        if (!peek) c.kernel_received.fetch_add(static_cast<uint64_t>(n));
        return static_cast<size_t>(n);
      }
      if (!st.ok()) return got ? Result<size_t>(got) : Result<size_t>(st);
      continue;
    }
    // Accelerated receive.
    const uint32_t size = c.ring_size;
    uint64_t head = c.rx_head.load(std::memory_order_relaxed);
    bool shut = c.peer_shut_wr.load(std::memory_order_acquire);
    // Acquire pairs with the dispatcher's release of rx_tail, which follows
    // the backend's copy into the ring (ordered by the event queue).
    uint64_t tail = c.rx_tail.load(std::memory_order_acquire);
    if (tail - head > size) {
      Reset(c, Reason::kProtocolError);
      return Errno(EPROTO, "peer claims more bytes than the ring holds");
    }
    if (tail > head) {
      size_t n = std::min<uint64_t>(tail - head, want - got);
      CopyIovRing<false>(c.rx, size, head, iov, iovcnt, got, n);
      if (peek) return got + n;
      head += n;
      c.rx_head.store(head, std::memory_order_release);
      c.accel_rx.fetch_add(n, std::memory_order_relaxed);
      got += n;
      // Return credit in quarters of the ring, and whenever we caught up, so
      // a sender waiting for space always hears of it. With the doorbell,
      // every count goes to the block (free while the backend polls).
      if (c.db != nullptr) {
        (void)Announce(c, &proto::DoorbellBlock::consumed, &proto::DoorbellBlock::want_consumed, MsgType::kConsumed,
                       head);
      } else if (head - c.consumed_reported >= size / 4 || head == tail) {
        c.consumed_reported = head;
        (void)c.session->Post({MsgType::kConsumed, 0, proto::ConnCounter{c.id, head}});
      }
      if (!waitall || got == want) return got;
      continue;
    }
    if (shut) return got;  // EOF: every byte before it was delivered
    if (c.resync.load(std::memory_order_acquire)) {
      // Every byte that landed before the link loss is delivered: the rest
      // follows the peer's RESYNC header on the kernel stream.
      c.rx_resync.store(Conn::RxResync::kHeader, std::memory_order_release);
      continue;
    }
    if (got && !waitall) return got;
    if (c.session->TryDrain()) continue;
    if (c.shut_rd.load()) return got;
    if (nonblock) return got ? Result<size_t>(got) : Errno(EAGAIN, "no data");
    if (deadline == -2) deadline = SocketDeadline(fd, SO_RCVTIMEO);
    Status st = WaitUntil(c, [&] {
      return c.rx_tail.load(std::memory_order_acquire) != tail || c.peer_shut_wr.load() ||
             c.reset.load() || c.shut_rd.load() || c.resync.load();
    }, -1, 0, deadline);
    if (!st.ok()) return got ? Result<size_t>(got) : Result<size_t>(st);
  }
}

Status Shutdown(int fd, Conn& c, int how) {
  bool wr = how == SHUT_WR || how == SHUT_RDWR;
  if (wr && c.resync.load(std::memory_order_acquire)) {
    // Bytes still owed to the peer after a link loss go before our FIN.
    std::lock_guard<std::mutex> lock(c.tx_mu);
    if (!c.shut_wr.load() && PrepareResendLocked(c, fd) && c.resend_off < c.resend.size()) {
      c.shut_after_resend = true;
      c.shut_wr.store(true);
      if (how == SHUT_RDWR) {
        c.shut_rd.store(true);
        if (Libc().shutdown(fd, SHUT_RD) != 0) return Errno(errno, "shutdown");
      }
      if (c.session != nullptr) c.session->WakeWaiters();
      return Status::Ok();
    }
  }
  bool first_wr = wr && !c.shut_wr.exchange(true);
  if (how == SHUT_RD || how == SHUT_RDWR) c.shut_rd.store(true);
  // Writing accelerated: the kernel FIN may wait. Until the peer has
  // consumed what we wrote, a link loss makes us resend it on the kernel
  // socket (RESYNC), which a FIN already sent would forbid; the peer
  // learns our EOF on the accelerated path meanwhile.
  bool defer_fin = first_wr && c.tx_switched.load() && c.mode.load() == Mode::kAccel && !c.resync.load();
  int kernel_how = defer_fin ? (how == SHUT_RDWR ? SHUT_RD : -1) : how;
  // The kernel shutdown first: it also ends a sender blocked in the kernel,
  // and the flags end one waiting for ring space, so tx_mu frees up.
  if (kernel_how >= 0 && Libc().shutdown(fd, kernel_how) != 0) return Errno(errno, "shutdown");
  Session* s = c.session;
  if (s != nullptr) s->WakeWaiters();
  if (first_wr && IsRegistered(c) && s != nullptr) {
    // Under tx_mu: after every TX_TAIL a concurrent sender may still post.
    std::lock_guard<std::mutex> lock(c.tx_mu);
    if (defer_fin) {
      if (c.tx_resync_started) {
        // A link loss came first: the FIN follows its resend, if any is owed.
        if (c.resend_off < c.resend.size()) c.shut_after_resend = true;
        else (void)Libc().shutdown(fd, SHUT_WR);
      } else if (c.credit.load(std::memory_order_acquire) >= c.tx_tail.load(std::memory_order_relaxed)) {
        (void)Libc().shutdown(fd, SHUT_WR);  // all consumed: nothing could need a resend
      } else {
        c.shut_after_resend = true;  // FIN after a RESYNC's resend, or at close()
        c.fin_deferred.store(true, std::memory_order_relaxed);
      }
    }
    (void)s->Post({MsgType::kShutdown, 0, proto::Shutdown{c.id, proto::ShutdownHow::kWrite}});
  } else if (defer_fin) {
    (void)Libc().shutdown(fd, SHUT_WR);
  }
  return Status::Ok();
}

Result<int> Readable(int fd, Conn& c) {
  int kernel = 0;
  if (Libc().ioctl(fd, FIONREAD, &kernel) != 0) return Errno(errno, "ioctl FIONREAD");
  if (c.mode.load() != Mode::kAccel) return kernel;
  if (c.resync.load(std::memory_order_acquire) && Readiness(fd, c) < 0) return kernel;
  if (c.session) c.session->TryDrain();
  if (!c.rx_switched.load()) {
    if (c.peer_fence_known.load()) {
      uint64_t left = c.peer_fence.load() - std::min(c.peer_fence.load(), c.kernel_received.load());
      if (left > 0) return static_cast<int>(std::min<uint64_t>(left, kernel));
    } else {
      return kernel;
    }
  }
  return static_cast<int>(c.rx_tail.load() - c.rx_head.load());
}

bool KernelFeedsReads(const Conn& c) {
  if (c.mode.load(std::memory_order_acquire) != Mode::kAccel || c.rx_switched.load()) return false;
  return !(c.peer_fence_known.load() && c.kernel_received.load() == c.peer_fence.load());
}

int Readiness(int fd, Conn& c) {
  if (c.reset.load()) return POLLIN | POLLOUT | POLLERR | POLLHUP;
  if (c.mode.load(std::memory_order_acquire) != Mode::kAccel) return -1;
  if (c.resync.load(std::memory_order_acquire)) {
    // Back on kernel TCP: only bytes still in the ring (or the EOF after
    // them) are ours to report; the kernel socket says the rest.
    bool ring_rx = c.rx_switched.load() ||
                   (c.peer_fence_known.load() && c.kernel_received.load() == c.peer_fence.load());
    if (c.rx_resync.load() == Conn::RxResync::kRing && c.peer_fence_known.load() && ring_rx) {
      bool shut = c.peer_shut_wr.load(std::memory_order_acquire);
      if (shut) return POLLIN | POLLOUT | POLLRDHUP;
      if (c.rx_tail.load(std::memory_order_acquire) != c.rx_head.load()) return POLLIN | POLLOUT;
    }
    return -1;
  }
  int r = 0;
  bool ring_rx = c.rx_switched.load() ||
                 (c.peer_fence_known.load() && c.kernel_received.load() == c.peer_fence.load());
  bool shut = c.peer_shut_wr.load(std::memory_order_acquire);
  if (ring_rx) {
    if (c.rx_tail.load(std::memory_order_acquire) != c.rx_head.load() || shut || c.shut_rd.load())
      r |= POLLIN;
  } else {
    // Still reading the kernel stream up to the fence.
    int queued = 0;
    if ((Libc().ioctl(fd, FIONREAD, &queued) == 0 && queued > 0) || shut) r |= POLLIN;
  }
  if (shut) r |= POLLRDHUP;
  uint64_t used = c.tx_tail.load() - c.credit.load();
  if (!c.tx_switched.load() || used < c.ring_size || c.peer_gone.load()) r |= POLLOUT;
  if (shut && c.shut_wr.load()) r |= POLLHUP;
  return r;
}

void Report(const Conn& c, const char* event) {
  const std::string& path = Config().report_path;
  if (path.empty() || c.mode.load() == Mode::kUnprobed) return;
  char local[INET6_ADDRSTRLEN] = "?", peer[INET6_ADDRSTRLEN] = "?";
  int af = c.local.family == proto::Family::kIpv6 ? AF_INET6 : AF_INET;
  inet_ntop(af, c.local.addr.data(), local, sizeof(local));
  inet_ntop(af, c.peer.addr.data(), peer, sizeof(peer));
  char line[768];
  int n = std::snprintf(
      line, sizeof(line),
      "{\"pid\":%d,\"event\":\"%s\",\"local\":\"%s:%u\",\"peer\":\"%s:%u\",\"mode\":\"%s\","
      "\"reason\":\"%s\",\"upgraded\":%s,\"kernel_tx\":%llu,\"kernel_rx\":%llu,"
      "\"accel_tx\":%llu,\"accel_rx\":%llu,\"kernel_tx_after_upgrade\":%llu,"
      "\"kernel_rx_after_upgrade\":%llu,\"resynced\":%s,\"reupgrades\":%u,\"fin_deferred\":%s,\"lingered\":%s}\n",
      getpid(), event, local, c.local.port, peer, c.peer.port,
      c.resync.load() ? "kernel" : ToString(c.mode.load()),
      // Still pending at the end: the peer never registered (not preloaded,
      // NAT, no backend on its side).
      proto::ToString(c.mode.load() == Mode::kPending ? Reason::kPeerNotAccelerated : c.reason.load()),
      c.upgraded.load() ? "true" : "false",
      static_cast<unsigned long long>(c.kernel_sent.load()),
      static_cast<unsigned long long>(c.kernel_received.load()),
      static_cast<unsigned long long>(c.accel_tx.load()),
      static_cast<unsigned long long>(c.accel_rx.load()),
      // Both are 0 by construction once switched; reported so tests can
      // prove it from counters rather than assume it.
      static_cast<unsigned long long>(c.tx_switched.load() ? c.kernel_sent.load() - c.fence_sent.load() : 0),
      static_cast<unsigned long long>(c.rx_switched.load() ? c.kernel_received.load() - c.peer_fence.load() : 0),
      c.resync.load() || c.reupgrades.load() ? "true" : "false", c.reupgrades.load(),
      c.fin_deferred.load() ? "true" : "false", c.lingered.load() ? "true" : "false");
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  (void)!Libc().write(fd, line, static_cast<size_t>(n));
  Libc().close(fd);
}

void ReportAll(const char* event) {
  for (int fd = 0; fd < kMaxFds; ++fd) {
    if (!g_has[fd].load()) continue;
    std::shared_ptr<Conn> c = Lookup(fd);
    if (c) Report(*c, event);
  }
}

void BeforeFork() { g_writer_fds_mu.lock(); }
void AfterForkInParent() { g_writer_fds_mu.unlock(); }

}  // namespace vsocket::guest
