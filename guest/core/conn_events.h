// The backend's events for one connection (UPGRADE, FENCE, RX_TAIL, CREDIT,
// SHUTDOWN, DOWNGRADE, ERROR, ...), each handled by one entry of a table
// (conn_events.cc), as vsocketd's requests are (host-backend/conn/requests.cc).
#pragma once

#include <memory>

#include "guest/core/conn.h"
#include "guest/core/loss.h"
#include "proto/control.h"

namespace vsocket::guest {

// Under the session lock. `on_resync`: the socket layer's handler for a
// connection that must leave the rings (a loss, or a drain). Bumps c's
// generation (epoll edge-triggered waits see something happened).
void DispatchConnEvent(const std::shared_ptr<Conn>& c, const proto::Message& m, LinkLostHandler on_resync);

// The connection a per-connection event names (0: none).
uint64_t EventConnId(const proto::Message& m);

}  // namespace vsocket::guest
