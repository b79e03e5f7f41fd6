// The background writer thread: finishes owed resends and lingering
// closes for applications that do not call us again.
#pragma once

#include <memory>

#include "guest/core/conn.h"

namespace vsocket::guest {

class Session;

// A dup of fd for the writer, numbered high and recorded at once.
int DupForWriter(int fd);
void CloseWriterFd(int fd);
// In a forked child: no writer thread, and the parent's dups are closed.
void ForgetWriterAfterFork();
// Hands c to the writer thread (started on first use).
void Enqueue(const std::shared_ptr<Conn>& c);
// Ends the writer's wait now (e.g. a lingering connection's peer consumed
// everything: its rings and registration are freed without delay).
void WakeWriter();
// Gives the background writer its own dup of fd (which names c's socket).
void HandToWriter(const std::shared_ptr<Conn>& c, int fd);
// Ends now the lingers of s whose peers consumed everything (normally the
// writer's, soon): a registration short of rings takes theirs back.
// Returns how many ended; *still: how many go on lingering.
size_t ReclaimLingering(Session* s, size_t* still = nullptr);
// pthread_atfork prepare/parent: the background writer's fd list is
// consistent in the child (AfterForkInChild closes those fds there).
// At the process's exit (atexit): waits, at most kExitWaitNs, until the
// writer's lingering and resyncing connections owe nothing that only this
// process could still put on their kernel sockets: a resend after vsocketd
// died (the writer looks at every lingering connection's backend again
// first), a direct pair's bytes its peer has not mapped (decision 135).
// Without it such bytes went with the process (the exit closed the
// writer's dups: a FIN after a short stream).
inline constexpr int64_t kExitWaitNs = 2'000'000'000;
void FinishLingersAtExit();
void BeforeFork();
void AfterForkInParent();

}  // namespace vsocket::guest
