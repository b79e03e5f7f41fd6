// fork(): a connection the parent has on the rings goes back to kernel TCP
// before the child exists (decision 85), so both processes may read and
// write it as kernel TCP allows — rsync's forked receiver reads what the
// daemon sends to the connection its parent opened and used.
#pragma once

namespace vsocket::guest {

// pthread_atfork's prepare handler (the forking thread, before fork):
// every connection of this process that is upgraded, waiting to pair, or
// resyncing is taken to kernel TCP for good (reason forked), each exact:
//   - upgraded: DOWNGRADE(forked, kDowngradeResendFrom, what the
//     application consumed of the RX ring): vsocketd stops moving its
//     bytes, and the peer's library resends its ring stream from there on
//     the kernel socket with no header; the rest of our RX ring is dropped,
//     and our own ring stream not yet consumed goes on the kernel socket
//     after a RESYNC header, as after a link loss — all of it written here,
//     before the child exists;
//   - waiting to pair: withdrawn (its stream is all on the kernel socket);
//   - resyncing (its peer forked first, or the link was lost): finished
//     here when what it needs is at hand (its resend written, the peer's
//     header read; what the application has not read of its RX ring is
//     dropped, since the peer resends from its credit anyway).
// A connection the program marked close-on-exec (FD_CLOEXEC on its only
// fd: one it does not mean to hand on, the fork-and-exec case: a
// subprocess, redis's BGSAVE child), another thread is using right now, one
// vsocketd refuses
// (a peer on another host, a shutdown or drain under way), or one that
// cannot finish within the budget (~2 s in all) stays as it was: the
// parent keeps it accelerated and the child is told ECONNRESET when it
// uses it (fd_table.cc AfterForkInChild).
void LeaveRingsBeforeFork();

}  // namespace vsocket::guest
