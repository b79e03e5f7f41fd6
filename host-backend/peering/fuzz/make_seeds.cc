// Writes the seed corpus of tls_channel_fuzz into the directory given: the
// control messages peers exchange (a fabric frame each, length-prefixed as
// TlsChannel::Send frames them), whole and cut into awkward records.
//   bazel run //host-backend/peering/fuzz:make_seeds -- "$PWD/host-backend/peering/fuzz/corpus/tls_channel"
#include <cstdio>
#include <string>
#include <vector>

#include "proto/fuzz/fabric_samples.h"

namespace {

using namespace vsocket::proto;

void AppendMessage(std::vector<uint8_t>* plain, const std::vector<uint8_t>& msg) {
  for (int i = 0; i < 4; ++i) plain->push_back(static_cast<uint8_t>(msg.size() >> (8 * i)));
  plain->insert(plain->end(), msg.begin(), msg.end());
}

// tls_channel_fuzz's input: schedule length, plaintext, schedule.
std::vector<uint8_t> Input(const std::vector<uint8_t>& plain, const std::vector<uint8_t>& schedule) {
  std::vector<uint8_t> in = {static_cast<uint8_t>(schedule.size())};
  in.insert(in.end(), plain.begin(), plain.end());
  in.insert(in.end(), schedule.begin(), schedule.end());
  return in;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  std::string dir = argv[1];
  // Records of 1, 3, 35 and 130 bytes, with a Receive() of its own between some.
  const std::vector<uint8_t> kRecords = {1, 3, 0, 35, 0, 130, 2, 0, 1, 1, 1, 1, 60, 0};
  std::vector<uint8_t> control;  // every frame that travels on the TLS channel
  for (const SampleFrame& f : SampleFrames()) {
    uint8_t t = static_cast<uint8_t>(f.header.type);
    if (t >= static_cast<uint8_t>(FrameType::kData)) continue;  // data-link frames
    std::vector<uint8_t> one;
    AppendMessage(&one, EncodeFrame(f));
    AppendMessage(&control, EncodeFrame(f));
    std::string name = std::string("seed-") + ToString(f.header.type) + "-" + std::to_string(control.size());
    if (!WriteSeed(dir, name, Input(one, {})) || !WriteSeed(dir, name + "-split", Input(one, kRecords))) return 1;
  }
  std::vector<uint8_t> schedule;
  for (int r = 0; r < 6; ++r) schedule.insert(schedule.end(), kRecords.begin(), kRecords.end());
  std::vector<uint8_t> empty_and_big;  // an empty message, then a longer one
  AppendMessage(&empty_and_big, {});
  AppendMessage(&empty_and_big, std::vector<uint8_t>(1000, 0x5a));
  if (!WriteSeed(dir, "control", Input(control, {})) || !WriteSeed(dir, "control-split", Input(control, schedule)) ||
      !WriteSeed(dir, "empty-and-longer", Input(empty_and_big, {130, 0, 1, 0})))
    return 1;
  return 0;
}
