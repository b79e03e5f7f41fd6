// libFuzzer target for the fabric frame decoders a peer host's bytes reach
// first: proto::DecodeFrameHeader (every frame on a data link and every
// control-channel message) and proto::DecodePairInfo (the body of
// PAIR_REQUEST and PAIR_ACCEPT). Input: a 32-byte header, then a body.
// Properties: never crashes; whatever decodes re-encodes to exactly the
// bytes it came from (reserved fields zero, no second spelling of a value),
// and a header that decodes allows exactly the payload length it names.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "proto/fabric.h"

namespace {

using namespace vsocket::proto;

void CheckHeader(const uint8_t* data) {
  auto h = DecodeFrameHeader(std::span<const uint8_t, kFrameHeaderSize>(data, kFrameHeaderSize));
  if (!h.ok()) return;
  uint8_t out[kFrameHeaderSize];
  EncodeFrameHeader(*h, out);
  if (std::memcmp(out, data, kFrameHeaderSize) != 0) std::abort();
  // Frames that carry a payload never claim more than a DATA frame may.
  if (h->len > kMaxDataFrame) std::abort();
  if (h->type != FrameType::kData && h->len > kMaxControlPayload) std::abort();
}

void CheckPairInfo(std::span<const uint8_t> body) {
  auto p = DecodePairInfo(body);
  if (!p.ok()) return;
  if (body.size() != kPairInfoSize) std::abort();
  uint8_t out[kPairInfoSize];
  EncodePairInfo(*p, out);
  if (std::memcmp(out, body.data(), kPairInfoSize) != 0) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kFrameHeaderSize) {
    CheckPairInfo({data, size});
    return 0;
  }
  CheckHeader(data);
  CheckPairInfo({data + kFrameHeaderSize, size - kFrameHeaderSize});
  return 0;
}
