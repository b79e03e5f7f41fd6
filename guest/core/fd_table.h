// The fd table: which fds name a TCP connection this library follows.
#pragma once

#include <functional>
#include <memory>

#include "guest/core/conn.h"

namespace vsocket::guest {

// The fd numbers the library's tables hold (this table, the epoll sets):
// 0 .. kTableFds - 1. A connection numbered above is not followed.
inline constexpr int kTableFds = 1 << 16;

// The connection an fd names, or null if the fd is not a TCP socket this
// library follows.
std::shared_ptr<Conn> Lookup(int fd);

// The connection a wrapper's call works on, for the length of that call
// (LookupForCall). Borrowed from the calling thread's one-entry cache, or
// holding its own reference where the cache is taken. Stays on its thread.
class ConnRef {
 public:
  ConnRef() = default;
  explicit ConnRef(std::shared_ptr<Conn> owned) : p_(owned.get()), owned_(std::move(owned)) {}
  static ConnRef Borrowed(Conn* p);
  ConnRef(ConnRef&& o) noexcept : p_(o.p_), borrowed_(o.borrowed_), owned_(std::move(o.owned_)) {
    o.p_ = nullptr;
    o.borrowed_ = false;
  }
  ConnRef& operator=(ConnRef&&) = delete;
  ConnRef(const ConnRef&) = delete;
  ConnRef& operator=(const ConnRef&) = delete;
  ~ConnRef();
  Conn* get() const { return p_; }
  Conn* operator->() const { return p_; }
  Conn& operator*() const { return *p_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  Conn* p_ = nullptr;
  bool borrowed_ = false;
  std::shared_ptr<Conn> owned_;
};

// Lookup for a wrapper's call (preload::Ours), without an atomic
// read-modify-write when the calling thread looked the same fd up last and
// the fd still names the same connection: each thread keeps a reference to
// the connection it looked up last, checked against the slot's version (a
// plain load). A locked instruction there cost a 16-byte send to a polling
// direct peer most of its time: it waited for the ring stores before it to
// reach the peer's CPU (decision 131). The cached reference keeps the
// connection's memory (not its registration: Forget ends that) until the
// thread looks another fd up or exits.
ConnRef LookupForCall(int fd);
// A new AF_INET/AF_INET6 stream socket created in this process
// (socket(), accept()); `nonblocking` is its O_NONBLOCK state, `accepted`
// whether it came from accept() (the server side of the pair).
void Adopt(int fd, bool nonblocking, bool accepted = false);
// fd2 now names what fd1 names (dup family).
void Duplicate(int fd1, int fd2);
// Forget fd; if it was the last fd of its connection, unregister it.
// still_open: fd still names the socket (close(), before the real one);
// false after dup2/dup3 put another file there (nothing may use fd then).
void Forget(int fd, bool still_open = true);
// In the child after fork(): connections registered by the parent stay the
// parent's; the child uses them on kernel TCP only if they were never
// upgraded (see docs/socket-compatibility.md).
void AfterForkInChild();
// Calls fn for the connection of every fd in the table (once per fd).
// Connections whose fds were closed (or reused for another file) without
// the library seeing it — a raw system call, or a close it cannot wrap —
// are torn down and their rings given back: every registered connection's
// fds are checked against the socket they registered with. Called when the
// shared region is full (the rings of such connections would otherwise
// never come back). Returns how many were reclaimed.
size_t ReclaimStale();
// Connections reclaimed so, since the process started (by ReclaimStale, or
// found when a new socket took the number of one).
uint64_t StaleReclaimed();

void ForEachConn(const std::function<void(int fd, Conn& c)>& fn);

}  // namespace vsocket::guest
