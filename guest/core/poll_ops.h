// poll/select/epoll for a mix of kernel fds and upgraded connections, whose
// readiness comes from their rings rather than the kernel socket. Return
// values and errno follow the libc calls they stand for.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>

#include "guest/core/conn.h"

namespace vsocket::guest {

int Poll(pollfd* fds, nfds_t n, int timeout_ms, const sigset_t* sigmask);
int Select(int nfds, fd_set* r, fd_set* w, fd_set* e, int timeout_ms, const sigset_t* sigmask);

int EpollCtl(int epfd, int op, int fd, epoll_event* ev);
int EpollWait(int epfd, epoll_event* events, int max, int timeout_ms, const sigset_t* sigmask);
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
// any is waiting, and applying them all; before fork, exec, close and
// dup2/dup3, and before any wait of this process.
bool EpollHasDeferred();
void EpollSettleAll();
// fd, if an epoll set of ours, is watched by another epoll set, poll or
// select, or waited on by a call we do not emulate: its readiness must be
// the kernel's at every moment, so no change to it is deferred from now on.
void EpollNoteWatched(int fd);

}  // namespace vsocket::guest
