// Link loss: back to kernel TCP without losing a byte (RESYNC, see
// docs/fabric-design.md "Link loss and RESYNC"), then registering again.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>

#include "base/status.h"
#include "guest/core/conn.h"

namespace vsocket::guest {

inline constexpr int64_t kResendLimitNs = 60'000'000'000;  // then the peer is presumed dead

// Ends the kernel connection with an RST but keeps the fd.
void ResetKernel(int fd, Conn& c);
// Under tx_mu: decides, once, what this side owes the peer on the kernel
// socket. False if the connection had to be reset.
bool PrepareResendLocked(Conn& c, int fd) REQUIRES(c.tx_mu);
// Under tx_mu: writes what is owed without blocking. Ok once it is all in
// the kernel, EAGAIN while the socket is full.
Status FlushResendLocked(Conn& c, int fd) REQUIRES(c.tx_mu);
// Under tx_mu: send() once the link is gone: the owed resend first, then
// plain kernel TCP.
Result<size_t> SendResynced(int fd, Conn& c, const iovec* iov, int iovcnt, int flags) REQUIRES(c.tx_mu);
// Under rx_mu: consumes the peer's RESYNC header and the bytes it resends
// that already landed in our ring.
Status ConsumeResyncLocked(int fd, Conn& c) REQUIRES(c.rx_mu);
// Under tx_mu, during a drain: ends our ring stream, and moves TX to kernel
// TCP once the peer consumed it. True once it is there (resynced()).
bool DrainTxLocked(Conn& c) REQUIRES(c.tx_mu);
// A connection that finished its RESYNC both ways registers again.
void MaybeReregister(int fd, Conn& c) EXCLUDES(c.setup_mu, c.tx_mu, c.rx_mu);
// RX is done with the old registration (on kernel TCP, or the peer left the
// rings without writing into them): what MaybeReregister waits for.
bool RxDone(const Conn& c);
// The backend downgraded upgraded connection c because the fabric link was
// lost (c.resync is set), or asked it to drain: hand its resend (or its
// drain) to the background writer, so the bytes reach the peer even if the
// application never writes again.
// Called by event dispatch (under the session lock).
void StartResync(const std::shared_ptr<Conn>& c);

}  // namespace vsocket::guest
