// Command-line channel client: HELLO, then N echo round trips with random
// payloads, each checksummed end to end. Used by the demo.
//   echo_client SOCKET [N] [poll|event|adaptive]
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/integration/control_channel.h"

using namespace vsocket;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SOCKET [N] [poll|event|adaptive]\n", argv[0]);
    return 2;
  }
  int n = argc > 2 ? std::atoi(argv[2]) : 1000;
  std::string mode = argc > 3 ? argv[3] : "adaptive";
  guest::ChannelOptions o;
  o.frontend.socket_path = argv[1];
  o.wait = mode == "poll"    ? guest::WaitMode::kPoll
           : mode == "event" ? guest::WaitMode::kEvent
                             : guest::WaitMode::kAdaptive;
  auto ch = guest::ControlChannel::Open(o);
  if (!ch.ok()) {
    std::fprintf(stderr, "open: %s\n", ch.status().ToString().c_str());
    return 1;
  }
  std::vector<uint8_t> scratch(proto::kMaxMessageSize);
  proto::Message resp;
  Status st =
      (*ch)->Call({proto::MsgType::kHello, 1, proto::Hello{1, 0, static_cast<uint32_t>(getpid()), 0}}, &resp, scratch);
  if (!st.ok() || resp.type != proto::MsgType::kHelloAck) {
    std::fprintf(stderr, "hello: %s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("connected: device %u\n", std::get<proto::HelloAck>(resp.body).device_id);
  std::mt19937 rng(42);
  std::vector<uint8_t> payload(proto::kMaxEchoPayload);
  uint64_t bytes = 0;
  for (int i = 0; i < n; ++i) {
    size_t len = rng() % payload.size();
    for (size_t k = 0; k < len; ++k) payload[k] = static_cast<uint8_t>(rng());
    std::span<const uint8_t> p(payload.data(), len);
    uint32_t crc = proto::Crc32c(p);
    st = (*ch)->Call({proto::MsgType::kEcho, static_cast<uint64_t>(i + 2), proto::Echo{crc, p}}, &resp, scratch);
    if (!st.ok()) {
      std::fprintf(stderr, "echo %d: %s\n", i, st.ToString().c_str());
      return 1;
    }
    const auto* e = std::get_if<proto::Echo>(&resp.body);
    if (resp.type != proto::MsgType::kEcho || !e || e->checksum != crc || e->payload.size() != len ||
        proto::Crc32c(e->payload) != crc || resp.request_id != static_cast<uint64_t>(i + 2)) {
      std::fprintf(stderr, "echo %d: checksum mismatch\n", i);
      return 1;
    }
    bytes += len;
  }
  std::printf("%d echoes, %llu payload bytes, all checksums match\n", n, static_cast<unsigned long long>(bytes));
  return 0;
}
