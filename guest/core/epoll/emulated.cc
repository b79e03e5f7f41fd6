#include "guest/core/epoll/emulated.h"

#include "guest/core/epoll/deferred.h"
#include "guest/core/socket_ops.h"
#include "guest/core/wait.h"
#include "guest/sys/libc.h"

namespace vsocket::guest::epoll {

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
  // (The connection's session looked at once: a registration that ends or
  // is refused on another thread clears it.)
  Session* cs = e.conn->session;
  if (set.session != nullptr && !set.session->alive() && cs != nullptr && cs != set.session && cs->alive()) {
    UnhookSession(epfd, set, set.session);
    set.session = nullptr;
  }
  // Pending connections need the session's wake-ups too: their UPGRADE
  // arrives as an event, not on the kernel socket. (Connections not
  // registered yet get them only while a wait sleeps: EpollWait.)
  if (set.session == nullptr && cs != nullptr) {
    set.session = cs;
    HookSession(epfd, set, set.session);
  }
}

void Refresh(int epfd, EpSet& set) {
  for (auto& [fd, e] : set.entries)
    if (e.conn) RefreshEntry(epfd, set, fd, e);
}

int Collect(EpSet& set, epoll_event* out, int max, int64_t slept_from, int64_t slept_until) {
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

bool HasUnprobed(const EpSet& set) {
  for (const auto& [fd, e] : set.entries)
    if (e.conn && e.conn->session == nullptr && e.conn->state.phase() == Phase::kUnprobed && !e.conn->KernelUntilOwnIo())
      return true;
  return false;
}

bool HasDirect(const EpSet& set) {
  for (const auto& [fd, e] : set.entries)
    if (e.conn && !e.in_kernel && e.conn->direct) return true;
  return false;
}

bool KernelAlone(const EpSet& set) {
  if (set.session != nullptr) return false;
  for (const auto& [fd, e] : set.entries)
    if (e.conn && (!e.in_kernel || !e.conn->KernelUntilOwnIo())) return false;
  return true;
}

bool IsMarker(uint64_t data) {
  return data == kBackendMarker || data == kWakeMarker || data == kSessionMarker || (data & kFeedMask) == kFeedMarker;
}

bool HasMarker(const epoll_event* ev, int n) {
  for (int i = 0; i < n; ++i)
    if (IsMarker(ev[i].data.u64)) return true;
  return false;
}

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

}  // namespace vsocket::guest::epoll
