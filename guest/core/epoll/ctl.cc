// epoll_ctl on an application's set: the kernel's registration where the
// kernel answers for the connection, the entry's where the library does,
// and a change kept for later where it may wait (deferred.h).
#include <errno.h>

#include "guest/core/epoll/deferred.h"
#include "guest/core/epoll/emulated.h"
#include "guest/core/epoll/set.h"
#include "guest/core/poll_ops.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {

using namespace epoll;

int EpollCtl(int epfd, int op, int fd, epoll_event* ev) {
  auto conn = Lookup(fd);
  if (!conn) {
    if (op == EPOLL_CTL_ADD) {
      // Maybe an epoll set nested in another, now or once it is ours.
      NoteNested(fd);
      EpollNoteWatched(fd);
    }
    return Libc().epoll_ctl(epfd, op, fd, ev);
  }
  EpSet* set = FindSet(epfd, true);
  if (set == nullptr) return Libc().epoll_ctl(epfd, op, fd, ev);
  MutexLock lock(set->mu);
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

}  // namespace vsocket::guest
