// libFuzzer target for proto::Decode. Property: anything that decodes
// re-encodes to exactly the bytes it was decoded from (the encoding is
// canonical: reserved fields zero, lengths exact), and never crashes.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "proto/control.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vsocket::proto;
  size_t consumed = 0;
  auto msg = Decode({data, size}, &consumed);
  if (!msg.ok()) return 0;
  std::vector<uint8_t> out(kMaxMessageSize);
  auto n = Encode(*msg, out);
  if (!n.ok() || *n != consumed || std::memcmp(out.data(), data, consumed) != 0) std::abort();
  return 0;
}
