// The held connection's own path (decision 64): a connection the upgrade
// policy holds on kernel TCP (decision 51) and that does not stream yet
// needs, per call, only the kernel's call, the byte count a later upgrade
// fences on, and a note to the stream detector. The wrappers take this
// path before Send/Recv, whose general machinery (re-registration, the
// resync and drain checks, the iovec slicing, a call chain per step) made
// a held connection's loopback round trip 11-13% slower than kernel TCP's
// on these machines; 3-6% with this path, 1-3% for the bare interposition.
//
// A connection on kernel TCP for good (refused, kept there as kernel-faster,
// not eligible) takes it too, without the stream note: it never registers.
//
// Exactness is the general path's: a byte count changes under its side's
// mutex, and a call that may sleep in the kernel holds the registration
// off (Conn::EnterKernelSleep). Anything else (not held, streaming, a
// registration under way, a report still wanting the addresses, a
// connection back on kernel TCP after a resync, a withdrawn registration
// still to end) answers "not here" and the caller takes Send/Recv.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <mutex>

#include "guest/core/config.h"
#include "guest/core/conn.h"
#include "guest/core/registration.h"

namespace vsocket::guest {

// Whether c takes the held path now.
inline bool OnHeldPath(const Conn& c) {
  return c.HeldQuiet() && (c.addressed.load(std::memory_order_acquire) || Config().report_path.empty());
}

// Whether c is on kernel TCP for good with nothing left to do but its
// kernel I/O (no resend after a resync, no registration to end).
inline bool KernelForGood(const Conn& c) {
  return c.state.phase() == Phase::kKernel && !c.state.resynced();
}

// A receive on c: `io()` is the kernel's call (recv, read, recvmsg, ...),
// `flags` its MSG_ flags. True with *out set (errno set by the kernel) if
// it ran here; false if c needs Recv.
template <typename Io>
inline bool HeldRecv(Conn& c, int flags, Io io, ssize_t* out) {
  bool held = OnHeldPath(c);
  if (!held && !KernelForGood(c)) return false;
  bool sleeper = false;
  if (held && !(flags & MSG_DONTWAIT) && !c.nonblocking.load(std::memory_order_relaxed)) {
    if (!c.EnterKernelSleep()) return false;  // registering: Recv waits for it
    sleeper = true;
  }
  ssize_t n;
  {
    MutexLock lock(c.rx_mu);
    if (held && !sleeper && !c.HeldQuiet()) return false;  // registered meanwhile
    n = io();
    if (n > 0 && !(flags & MSG_PEEK)) c.kernel_received.fetch_add(static_cast<uint64_t>(n));
  }
  if (sleeper) c.LeaveKernelSleep();
  if (held && n > 0 && !(flags & MSG_PEEK)) NoteKernelIo(c, StreamDetector::Dir::kIn, static_cast<size_t>(n));
  *out = n;
  return true;
}

// A send on c: as HeldRecv (a send that blocks for buffer space does not
// hold the registration off: the general path's send does not either, and
// a registration's FENCE is posted under tx_mu, after every byte counted
// here).
template <typename Io>
inline bool HeldSend(Conn& c, Io io, ssize_t* out) {
  bool held = OnHeldPath(c);
  if (!held && !KernelForGood(c)) return false;
  ssize_t n;
  {
    MutexLock lock(c.tx_mu);
    if (held && !c.HeldQuiet()) return false;  // registered meanwhile
    n = io();
    if (n > 0) c.kernel_sent.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
  }
  if (held && n > 0) NoteKernelIo(c, StreamDetector::Dir::kOut, static_cast<size_t>(n));
  *out = n;
  return true;
}

}  // namespace vsocket::guest
