// The mode of a connection and the changes of it shared by the socket
// layer and event dispatch.
#pragma once

#include "guest/core/conn.h"

namespace vsocket::guest {

// Kernel TCP for good, for reason r.
void SetKernelForGood(Conn& c, proto::Reason r);
// The accelerated path failed: the application sees ECONNRESET.
void Reset(Conn& c, proto::Reason r);
// Registered with the backend (pending or upgraded).
bool IsRegistered(const Conn& c);

}  // namespace vsocket::guest
