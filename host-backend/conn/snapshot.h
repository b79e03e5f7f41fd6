// What reporting sees of a connection.
#pragma once

#include <cstdint>
#include <string>

#include "host-backend/conn/conn.h"
#include "proto/control.h"

namespace vsocket::backend {

// A read-only snapshot of one connection, for reporting.
struct ConnSnapshot {
  uint64_t handle;
  uint64_t device_id;
  std::string vm;
  uint32_t tenant;
  proto::Endpoint local, peer;
  ConnState state;
  proto::Reason reason;
  uint64_t accel_out, accel_in, kernel_out;
  uint64_t rx_queued;    // bytes landed in its RX ring, not yet consumed
  uint64_t tx_unacked;   // bytes it produced that its peer has not consumed (credit in use)
  uint32_t window;       // its TX credit window (peer's RX ring, bytes)
  uint32_t remote_host;  // peer host id when the peer is on another host, else 0
  bool moved;            // upgraded, and both directions have left the rings (a drain)
  bool leaving;          // asked to drain, not yet moved (nor closed or reset)
};

}  // namespace vsocket::backend
