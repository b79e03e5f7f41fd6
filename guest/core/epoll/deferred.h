// Deferred epoll changes (decision 61). Event loops such as redis's (ae)
// and hiredis clients delete and add a socket's registration around every
// request (MOD, DEL, ADD for a write, DEL, ADD for the reply): five
// epoll_ctl system calls per request, each 1-3 us in a VM. For a
// connection on kernel TCP (held by the policy), a DEL and an ADD or MOD of
// a level-triggered registration are kept in its entry and applied, as one
// MOD or DEL or nothing, before the next wait of this process on any fd
// set; an ADD that is not the undoing of a deferred DEL always reaches the
// kernel at once (it is the only change that can fail for want of
// resources). No change is deferred while another thread waits on the set,
// for an edge-triggered, one-shot or exclusive registration, nor on a set
// another epoll set, poll or select watches or that a fork shared;
// everything deferred is applied before fork, exec, close and dup2/dup3.
#pragma once

#include "guest/core/epoll/set.h"

namespace vsocket::guest::epoll {

// Requires set.mu. Whether a change of entry e, of connection c (held on
// kernel TCP), to `events` may wait.
bool CanDefer(const EpSet& set, const EpEntry& e, const Conn& c, uint32_t events) REQUIRES(set.mu);
// Requires set.mu. e now holds a change the kernel has not seen.
void MarkDirty(EpSet& set, int fd, EpEntry& e) REQUIRES(set.mu);
// Requires set.mu. Applies e's deferred change, if any.
void Settle(EpSet& set, int fd, EpEntry& e) REQUIRES(set.mu);
// Requires set.mu. Settles every deferred change of the set but those in
// keep (fds, sorted).
void SettleSet(EpSet& set, const int* keep = nullptr, int n_keep = 0) REQUIRES(set.mu);
// This thread's next wait need not settle `set` (it just did) / must (it
// left changes there).
void ForgetDirtiedByThisThread(EpSet* set);
void NoteDirtiedByThisThread(EpSet* set);

}  // namespace vsocket::guest::epoll
