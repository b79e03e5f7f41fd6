// The per-connection report (VSOCKET_REPORT): one JSON line per event.
#pragma once

#include "guest/core/conn.h"

namespace vsocket::guest {

// Writes the report line for c, or for every open connection (once each,
// however many fds name it).
void Report(const Conn& c, const char* event);
void ReportAll(const char* event);
// The line for c as it passes to `program` across exec (event "exec",
// reason "inherited", the program named), whatever its phase.
void ReportExec(const Conn& c, const char* program);

}  // namespace vsocket::guest
