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
void BeforeFork();
void AfterForkInParent();

}  // namespace vsocket::guest
