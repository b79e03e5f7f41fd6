// Writes the seed corpus of fabric_fuzz: one file per sample frame (header
// and payload) into the directory given.
//   bazel run //proto/fuzz:make_fabric_seeds -- "$PWD/proto/fuzz/corpus/fabric"
#include <cstdio>
#include <string>

#include "proto/fuzz/fabric_samples.h"

int main(int argc, char** argv) {
  using namespace vsocket::proto;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  int i = 0;
  for (const SampleFrame& f : SampleFrames()) {
    if (f.payload.size() > kMaxControlPayload) continue;  // the long DATA adds nothing here
    std::string name = "seed-" + std::to_string(i++) + "-" + ToString(f.header.type);
    if (!WriteSeed(argv[1], name, EncodeFrame(f))) return 1;
  }
  return 0;
}
