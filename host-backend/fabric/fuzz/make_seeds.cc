// Writes the seed corpus of stream_link_fuzz into the directory given:
// streams of valid frames, whole and cut into reads at awkward places.
//   bazel run //host-backend/fabric/fuzz:make_seeds -- "$PWD/host-backend/fabric/fuzz/corpus/stream_link"
#include <cstdio>
#include <string>
#include <vector>

#include "proto/fuzz/fabric_samples.h"

namespace {

using namespace vsocket::proto;

// stream_link_fuzz's input: schedule length, frames per Poll(), the stream,
// the schedule.
std::vector<uint8_t> Input(const std::vector<uint8_t>& stream, const std::vector<uint8_t>& schedule) {
  std::vector<uint8_t> in = {static_cast<uint8_t>(schedule.size()), 63};
  in.insert(in.end(), stream.begin(), stream.end());
  in.insert(in.end(), schedule.begin(), schedule.end());
  return in;
}

void Append(std::vector<uint8_t>* stream, const SampleFrame& f) {
  std::vector<uint8_t> b = EncodeFrame(f);
  stream->insert(stream->end(), b.begin(), b.end());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  std::string dir = argv[1];
  // Reads of 1, 31, 33 and 129 bytes with EAGAIN (a Poll() boundary) between.
  const std::vector<uint8_t> kChunks = {1, 0, 31, 0, 33, 5, 0, 129, 0, 7, 200, 0, 64, 0, 130, 0};
  std::vector<uint8_t> all;
  int i = 0;
  for (const SampleFrame& f : SampleFrames()) {
    std::vector<uint8_t> one;
    Append(&one, f);
    Append(&all, f);
    std::string name = "seed-" + std::to_string(i++) + "-" + ToString(f.header.type);
    if (!WriteSeed(dir, name, Input(one, {})) || !WriteSeed(dir, name + "-split", Input(one, kChunks))) return 1;
  }
  // DATA placed every way the fuzz sink knows (handle % 4: discard, one
  // piece, two pieces, a destination of the wrong size).
  SampleFrame long_data;
  for (const SampleFrame& f : SampleFrames())
    if (f.header.type == FrameType::kData && f.payload.size() > 4096) long_data = f;
  std::vector<uint8_t> data;
  for (uint64_t handle = 20; handle < 24; ++handle) {
    SampleFrame f = long_data;
    f.header.handle = handle;
    f.header.value = 1000 + handle;
    Append(&data, f);
  }
  std::vector<uint8_t> schedule;
  for (int r = 0; r < 8; ++r) schedule.insert(schedule.end(), kChunks.begin(), kChunks.end());
  if (!WriteSeed(dir, "data-placements", Input(data, schedule)) || !WriteSeed(dir, "all", Input(all, {})) ||
      !WriteSeed(dir, "all-split", Input(all, schedule)))
    return 1;
  return 0;
}
