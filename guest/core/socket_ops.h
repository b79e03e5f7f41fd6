// The socket operations behind the libc wrappers, on typed values. They
// return a Result/Status; guest/preload/interpose.cc turns errors into
// errno at the boundary.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <memory>

#include "base/adaptive_poll.h"
#include "base/status.h"
#include "guest/core/conn.h"

namespace vsocket::guest {

// ---- the fd table --------------------------------------------------------

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
// pthread_atfork prepare/parent: the background writer's fd list is
// consistent in the child (AfterForkInChild closes those fds there).
void BeforeFork();
void AfterForkInParent();

// ---- data path ------------------------------------------------------------

// flags: MSG_* as passed by the application.
Result<size_t> Send(int fd, Conn& c, const iovec* iov, int iovcnt, int flags);
Result<size_t> Recv(int fd, Conn& c, const iovec* iov, int iovcnt, int flags);
Status Shutdown(int fd, Conn& c, int how);
// Bytes readable now (FIONREAD).
Result<int> Readable(int fd, Conn& c);

// Readiness of an upgraded connection as poll bits, or -1 when the kernel
// socket still decides (not upgraded).
int Readiness(int fd, Conn& c);
// True while an upgraded connection still reads the kernel stream up to the
// peer's fence: sleepers must keep the kernel socket in their wait set.
bool KernelFeedsReads(const Conn& c);

// The backend downgraded upgraded connection c because the fabric link was
// lost (c.resync is set): hand its resend to the background writer, so the
// bytes reach the peer even if the application never writes again.
// Called by event dispatch (under the session lock).
void StartResync(const std::shared_ptr<Conn>& c);

// Writes the per-connection report line (VSOCKET_REPORT) for c, or for
// every open connection.
void Report(const Conn& c, const char* event);
void ReportAll(const char* event);

// This thread's wake-up eventfd (written whenever the session dispatched
// events), for poll/epoll emulation.
int ThreadWaiterFd();

// This thread's poll budget (VSOCKET_POLL_US .. VSOCKET_POLL_MAX_US, learned
// from its waits: base/adaptive_poll.h).
AdaptivePoll& ThreadPoll();
// How long this thread polls before sleeping now: ThreadPoll()'s budget, or
// 0 where the backend shares this process's few CPUs (cpu_share.h).
int64_t PollBudgetNs();
// Times one wait for ThreadPoll(): from Waiting() (nothing was ready) to
// the end of the scope.
class WaitRecorder {
 public:
  WaitRecorder() = default;
  WaitRecorder(const WaitRecorder&) = delete;
  WaitRecorder& operator=(const WaitRecorder&) = delete;
  ~WaitRecorder();
  // Starts the clock (once) and returns the time to poll until.
  int64_t Waiting();

 private:
  int64_t start_ = 0;
};

}  // namespace vsocket::guest
