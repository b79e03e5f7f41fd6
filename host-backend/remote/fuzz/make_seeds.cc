// Writes the seed corpus of peer_frames_fuzz into the directory given: each
// sample frame on the control channel and on a data link, a pairing request
// followed by its cancel, a valid RDMA_SETUP, and all of them in one input.
//   bazel run //host-backend/remote/fuzz:make_seeds -- "$PWD/host-backend/remote/fuzz/corpus/peer_frames"
#include <cstdio>
#include <string>
#include <vector>

#include "host-backend/fabric/rdma_link.h"
#include "proto/fuzz/fabric_samples.h"

namespace {

using namespace vsocket::proto;

constexpr uint8_t kControl = 0, kLink = 1, kHostDown = 0xff;

// One record of peer_frames_fuzz's input.
void Record(std::vector<uint8_t>* in, uint8_t how, const std::vector<uint8_t>& bytes) {
  in->push_back(how);
  in->push_back(static_cast<uint8_t>(bytes.size()));
  in->push_back(static_cast<uint8_t>(bytes.size() >> 8));
  in->insert(in->end(), bytes.begin(), bytes.end());
}

SampleFrame RdmaSetup() {
  vsocket::fabric::RdmaEndpointInfo e;
  e.qpn = 0x123;
  e.psn = 0x456;
  e.gid[10] = e.gid[11] = 0xff;
  e.gid[12] = 192;
  e.gid[15] = 1;
  e.recv_depth = 256;
  e.staging_addr = 0x7f0000100000;
  e.staging_rkey = 0x77;
  e.staging_size = vsocket::fabric::rdma_internal::kMinStaging;
  SampleFrame f;
  f.header.type = FrameType::kRdmaSetup;
  auto b = e.Encode();
  f.payload.assign(b.begin(), b.end());
  f.header.len = static_cast<uint32_t>(f.payload.size());
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  std::string dir = argv[1];
  std::vector<uint8_t> all;
  int i = 0;
  for (SampleFrame f : SampleFrames()) {
    if (f.header.type == FrameType::kRdmaSetup) f = RdmaSetup();
    bool link_frame = static_cast<uint8_t>(f.header.type) >= static_cast<uint8_t>(FrameType::kData);
    std::vector<uint8_t> one;
    Record(&one, link_frame ? kLink : kControl, EncodeFrame(f));
    Record(&all, link_frame ? kLink : kControl, EncodeFrame(f));
    std::string name = "seed-" + std::to_string(i++) + "-" + ToString(f.header.type);
    if (!WriteSeed(dir, name, one)) return 1;
  }
  Record(&all, kHostDown, {});
  // A request kept for a guest that has not registered, then withdrawn.
  std::vector<uint8_t> cancel;
  for (const SampleFrame& f : SampleFrames())
    if (f.header.type == FrameType::kPairRequest || f.header.type == FrameType::kPairCancel)
      Record(&cancel, kControl, EncodeFrame(f));
  if (!WriteSeed(dir, "request-then-cancel", cancel) || !WriteSeed(dir, "all", all)) return 1;
  return 0;
}
