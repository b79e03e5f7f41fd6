// Framing of the messages on the TLS control channel between vsocketds.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "proto/fabric.h"

namespace vsocket::backend {

// A frame header and its payload, as one control-channel message.
std::vector<uint8_t> Message(const proto::FrameHeader& h, std::span<const uint8_t> payload);

}  // namespace vsocket::backend
