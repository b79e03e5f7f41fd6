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

// What FENCE, RX_TAIL, CREDIT and SHUTDOWN(write) do to c, also for a
// direct pair's counts taken from its memory (direct.h) by any thread:
// counts never go back; true if it grew.
void TakePeerFence(Conn& c, uint64_t fence);
bool TakeRxTail(Conn& c, uint64_t v);
bool TakeCredit(Conn& c, uint64_t v);
void TakePeerShutWr(Conn& c);

// The connection a per-connection event names (0: none).
uint64_t EventConnId(const proto::Message& m);

}  // namespace vsocket::guest
