// poll/select/epoll for a mix of kernel fds and upgraded connections, whose
// readiness comes from their rings rather than the kernel socket. Return
// values and errno follow the libc calls they stand for.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>

#include <memory>

#include "guest/core/conn.h"

namespace vsocket::guest {

int Poll(pollfd* fds, nfds_t n, int timeout_ms, const sigset_t* sigmask);
int Select(int nfds, fd_set* r, fd_set* w, fd_set* e, int timeout_ms, const sigset_t* sigmask);

int EpollCtl(int epfd, int op, int fd, epoll_event* ev);
int EpollWait(int epfd, epoll_event* events, int max, int timeout_ms, const sigset_t* sigmask);
// epoll_pwait2: the same wait with a timespec (null: no timeout), which the
// kernel's own waits then take as it is (nanoseconds, not milliseconds).
int EpollWait2(int epfd, epoll_event* events, int max, const timespec* ts, const sigset_t* sigmask);
// fd was closed: drop it from every emulated epoll set (and the set itself
// if fd was an epoll fd).
// lingering: the socket outlives fd (a lingering close keeps a dup of it),
// so its kernel epoll registrations are deleted explicitly; otherwise the
// kernel drops them with the socket (and a forked child sharing the epoll
// object must not delete the parent's).
void EpollForget(int fd, bool lingering = false);
// Connection c, held on kernel TCP by the upgrade policy, is about to
// register: wake every epoll wait on a set holding it, which the kernel
// alone answered until now (it must watch the session from here on).
void EpollKick(const Conn& c);
// In a forked child: epoll sets no longer follow the parent's session, and
// no change to a set inherited from the parent is deferred.
void EpollAfterForkInChild();
// Deferred epoll_ctl changes (poll_ops.cc, "Deferred changes"): whether
// any is waiting; applying them all (before fork and exec); those this
// thread made (before any wait of this thread: a wait on a set settles
// that set, and a set another set, poll or select watches defers
// nothing); those of fd (before close and dup2/dup3 onto it).
bool EpollHasDeferred();
void EpollSettleAll();
void EpollSettleMine();
void EpollSettleFd(int fd);
// fd, if an epoll set of ours, is watched by another epoll set, poll or
// select, or waited on by a call we do not emulate: its readiness must be
// the kernel's at every moment, so no change to it is deferred from now on.
void EpollNoteWatched(int fd);

// Waits on fds the kernel alone serves (decision 64): a connection held on
// kernel TCP and not streaming, one on kernel TCP for good, a listener, or
// an fd not ours. Such a wait is the kernel's own call, with each held
// connection kept from registering while we sleep on it (EnterKernelSleep),
// without the general path's look-ups per round and its allocations.
class KernelWait {
 public:
  static constexpr size_t kMaxHeld = 32;
  KernelWait() = default;
  KernelWait(const KernelWait&) = delete;
  KernelWait& operator=(const KernelWait&) = delete;
  ~KernelWait();  // leaves the sleeps entered (errno kept)
  // False if fd needs the general path (registered, registering, not held
  // yet, or too many held ones).
  bool Add(int fd);

 private:
  std::shared_ptr<Conn> held_[kMaxHeld];
  size_t n_ = 0;
};

// poll/ppoll on fds the kernel alone serves: `wait()` (the kernel's call)
// is made and its result put in *out; false, with nothing done but the
// epoll bookkeeping every wait does, if an fd needs Poll.
template <typename Wait>
bool PollKernelAlone(const pollfd* fds, nfds_t n, Wait wait, int* out) {
  if (n > KernelWait::kMaxHeld) return false;
  for (nfds_t i = 0; i < n; ++i) EpollNoteWatched(fds[i].fd);
  EpollSettleMine();
  KernelWait kw;
  for (nfds_t i = 0; i < n; ++i)
    if (fds[i].fd >= 0 && !kw.Add(fds[i].fd)) return false;
  *out = wait();
  return true;
}

// select/pselect likewise (false for an nfds the kernel refuses: Select
// gives its EINVAL).
template <typename Wait>
bool SelectKernelAlone(int nfds, const fd_set* r, const fd_set* w, const fd_set* e, Wait wait, int* out) {
  if (nfds < 0 || nfds > FD_SETSIZE) return false;
  KernelWait kw;
  size_t watched = 0;
  for (int fd = 0; fd < nfds; ++fd) {
    if (!((r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w)) || (e && FD_ISSET(fd, e)))) continue;
    if (++watched > KernelWait::kMaxHeld) return false;
    EpollNoteWatched(fd);
    if (!kw.Add(fd)) return false;
  }
  EpollSettleMine();
  *out = wait();
  return true;
}

}  // namespace vsocket::guest
