// Writes one seed file per sample control message into the directory given.
//   bazel run //proto/fuzz:make_seeds -- "$PWD/proto/fuzz/corpus/control"
#include <cstdio>
#include <string>
#include <vector>

#include "proto/control.h"
#include "proto/control_samples.h"

int main(int argc, char** argv) {
  using namespace vsocket::proto;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  int i = 0;
  for (const Message& m : SampleMessages()) {
    std::vector<uint8_t> buf(kMaxMessageSize);
    auto n = Encode(m, buf);
    if (!n.ok()) return 1;
    std::string path = std::string(argv[1]) + "/seed-" + std::to_string(i++) + "-" + ToString(m.type);
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(buf.data(), 1, *n, f) != *n) return 1;
    std::fclose(f);
  }
  return 0;
}
