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
