// The per-connection report (VSOCKET_REPORT): one JSON line per event.
#pragma once

#include "guest/core/conn.h"

namespace vsocket::guest {

// Writes the report line for c, or for every open connection.
void Report(const Conn& c, const char* event);
void ReportAll(const char* event);

}  // namespace vsocket::guest
