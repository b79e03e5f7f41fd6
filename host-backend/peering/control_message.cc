// Framing of the messages on the TLS control channel between vsocketds.
#include "host-backend/peering/control_message.h"

#include <cstring>

namespace vsocket::backend {

using proto::FrameHeader;

std::vector<uint8_t> Message(const FrameHeader& h, std::span<const uint8_t> payload) {
  std::vector<uint8_t> m(proto::kFrameHeaderSize + payload.size());
  proto::EncodeFrameHeader(h, m.data());
  if (!payload.empty()) std::memcpy(m.data() + proto::kFrameHeaderSize, payload.data(), payload.size());
  return m;
}

}  // namespace vsocket::backend
