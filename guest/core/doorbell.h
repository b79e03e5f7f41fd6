// Telling the backend a new count (TX tail or RX consumed): a message, or
// the connection's doorbell block (kFeatureDoorbell, proto/control.h).
#pragma once

#include "base/status.h"
#include "guest/core/conn.h"

namespace vsocket::guest {

Status Announce(Conn& c, uint64_t proto::DoorbellBlock::*count, uint32_t proto::DoorbellBlock::*want,
                proto::MsgType type, uint64_t value);

}  // namespace vsocket::guest
