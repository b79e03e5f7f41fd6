// The per-connection report (VSOCKET_REPORT): one JSON line per event.
#pragma once

#include "guest/core/conn.h"

namespace vsocket::guest {

// Writes the report line for c, or for every open connection (once each,
// however many fds name it).
void Report(const Conn& c, const char* event);
void ReportAll(const char* event);
// With reports on: a process ended by SIGTERM or SIGHUP (a supervisor's
// stop, a closed terminal) writes its open connections' lines first (event
// "signal"), then dies of the signal as it would have. Only where the
// signal's action is the default one at start-up; not SIGINT, whose
// default action programs test (CPython installs KeyboardInterrupt only
// then). Bounded: should the interrupted code hold a lock the report
// needs, SIGALRM's default action ends the process 2 s later.
void ReportOnTerminatingSignals();
// The line for c as it passes to `program` across exec (event "exec",
// reason "inherited", the program named), whatever its phase.
void ReportExec(const Conn& c, const char* program);

}  // namespace vsocket::guest
