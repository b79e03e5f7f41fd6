// Registration with vsocketd: REGISTER_CONN at a connection's first I/O,
// UNREGISTER at its end.
#pragma once

#include "guest/core/busy_loop.h"
#include "guest/core/config.h"
#include "guest/core/conn.h"
#include "guest/core/session.h"

namespace vsocket::guest {

// fd's local and peer addresses, read from the kernel into c.local and
// c.peer (kOtherFamily: not AF_INET/AF_INET6). Under c.setup_mu: one
// thread at a time writes them (readers wait for `addressed`).
enum class Addresses { kRead, kNotConnected, kOtherFamily };
Addresses ReadAddresses(int fd, Conn& c) REQUIRES(c.setup_mu);

// Registers an established connection with the backend, once, at its first
// I/O (or, held by the upgrade policy, once it streams: decision 51). Data
// keeps flowing on kernel TCP meanwhile.
void EnsureRegistered(int fd, Conn& c) EXCLUDES(c.setup_mu);
// Whether held connection c writes in large writes (kRegisterBulk): on
// average at least proto::kBulkWriteBytes per call, and more bytes out
// than in.
bool BulkWriter(const Conn& c);
// n bytes moved on c's kernel path in direction d: noted while the policy
// holds c (a relaxed load otherwise).
inline void NoteKernelIo(Conn& c, StreamDetector::Dir d, size_t n) {
  if (c.held.load(std::memory_order_relaxed))
    c.stream.Note(d, n, Config().stream_window, ActiveBusyLoop(), Session::DirectPeerRule());
}
// Urgent data (MSG_OOB) about to be sent on c: true if it may go (the
// kernel's, on a connection that never registered: it never will now),
// false once c registered (the ring has no urgent mark; EOPNOTSUPP).
// Decision 79.
bool NoteUrgent(Conn& c) EXCLUDES(c.setup_mu);
// SHUTDOWN (write) of registered connection c to the backend, once:
// shutdown(SHUT_WR) posts it, and so does a registration that finds the
// connection already shut down for writing. Under c.setup_mu, so that it
// never overtakes a REGISTER_CONN another thread has under way.
void PostShutWr(Conn& c) REQUIRES(c.setup_mu);
// Under c.tx_mu, before an upgraded connection's stream ends (shutdown for
// writing, close): if its TX never switched to the ring (nothing written
// since the upgrade), its FENCE goes first, so the peer knows its whole
// stream was on the kernel socket and where it ends. Without it the peer,
// told of the end on the rings, waited for our kernel FIN — which our
// close may hold back until the peer's own FIN (AwaitPeerFin) — and a
// lingering close there spun (Apache prefork: poll readable, read EAGAIN).
void FenceBeforeEndLocked(Conn& c) REQUIRES(c.tx_mu);
// Under c.tx_mu, for an upgraded connection: posts its FENCE at the bytes
// it sent on the kernel socket and switches its TX to the ring (the peer
// reads exactly that many kernel bytes first). Not switched if the post
// failed.
Status SwitchTxLocked(Conn& c) REQUIRES(c.tx_mu);
// A connection its busy event loop registered (decision 83), on the rings,
// whose loop has not been busy for kMoveBackAfterNs and which has turned
// kMoveBackTurns times since it first saw the loop quiet: asks vsocketd, once,
// to drain it back to kernel TCP at both ends (DOWNGRADE drain, reason
// kernel-faster); its library then holds it again (MaybeReregister), and it
// may qualify again once its loop is busy after a pause that doubles with
// each move (decision 92). Cheap when it does not apply: a relaxed load.
inline constexpr int64_t kMoveBackAfterNs = 250'000'000;
inline constexpr uint64_t kMoveBackTurns = 256;  // (several of the busy signal's windows: kBusyWindowWaits)
void MaybeMoveBack(Conn& c) EXCLUDES(c.setup_mu, c.tx_mu, c.rx_mu);
// The end of a closed connection's registration: UNREGISTER.
void Unregistered(Conn& c);
// Under c.setup_mu: UNREGISTER of a registration the backend withdrew
// before any upgrade (phase withdrawn), once; at the next socket call
// (MaybeReregister) or at close, whichever comes first. Then kernel TCP for
// good, or, for a busy loop's tentative registration, held again.
void EndWithdrawnLocked(Conn& c) REQUIRES(c.setup_mu);
// The end of a closed connection that resets its peer: SHUTDOWN both ways,
// then UNREGISTER.
void Aborted(Conn& c);
// Whether the backend has c paired, or accepted a pairing whose peer may
// already have switched (asked on kernel EOF before our UPGRADE).
bool PairingInFlight(Conn& c);

}  // namespace vsocket::guest
