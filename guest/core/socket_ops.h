// The socket operations behind the libc wrappers, on typed values. They
// return a Result/Status; guest/preload/ (wrap.h, a file per call family) turns errors into
// errno at the boundary.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include "base/status.h"
#include "guest/core/conn.h"

namespace vsocket::guest {

// flags: MSG_* as passed by the application.
Result<size_t> Send(int fd, Conn& c, const iovec* iov, int iovcnt, int flags) EXCLUDES(c.tx_mu);
Result<size_t> Recv(int fd, Conn& c, const iovec* iov, int iovcnt, int flags) EXCLUDES(c.rx_mu);
// sendfile(2) on c: the kernel's own while c is not registered (nothing to
// fence: kernel_sent counts it), else false and the caller copies the file
// through Send.
bool KernelSendFile(int fd, Conn& c, int in, off_t* offset, size_t count, Result<size_t>* out) EXCLUDES(c.tx_mu);
// shutdown(2). The SHUTDOWN to the backend waits (c.setup_mu) for a
// registration another thread has under way.
Status Shutdown(int fd, Conn& c, int how) EXCLUDES(c.setup_mu);
// The same, for a caller that holds c.setup_mu already (close()'s linger).
Status ShutdownSetupHeld(int fd, Conn& c, int how) REQUIRES(c.setup_mu);
// Bytes readable now (FIONREAD).
Result<int> Readable(int fd, Conn& c);

// Readiness of an upgraded connection as poll bits, or -1 when the kernel
// socket still decides (not upgraded). Readable means bytes of the
// application's stream (or its EOF), as the kernel's own socket means it:
// protocol bytes ahead of them on the kernel socket (the peer's RESYNC
// header after a loss or a drain, bytes our ring gave already) are consumed
// here when no reader is inside, and never make it readable. A readable
// socket whose read says EAGAIN is what the kernel never does, and what
// wrk counts as a read error (the drain of one side, 2026-11-29).
int Readiness(int fd, Conn& c) EXCLUDES(c.rx_mu);
// The same, for a receiver that holds c.rx_mu.
int ReadinessRxHeld(int fd, Conn& c) REQUIRES(c.rx_mu);
// Whether the kernel socket's next bytes are the protocol's, not the
// application's (above).
bool ProtocolAhead(const Conn& c);
// With RX at RxResync::kRing (the callers check): every byte of the peer's ring
// stream read (after a loss, or up to the peer's end of it in a drain): its
// RESYNC header is the kernel socket's next bytes. (Not after the peer's EOF
// on the ring, nor if it never switched to the ring: then no header comes.)
// Recv and Readiness both go on to the header on this.
bool RingStreamRead(const Conn& c);
// True while an upgraded connection still reads the kernel stream up to the
// peer's fence, or protocol bytes are still to come there: sleepers must
// keep the kernel socket in their wait set.
bool KernelFeedsReads(const Conn& c);

}  // namespace vsocket::guest
