// One valid fabric frame of every type (header and payload), for the seed
// corpora of the fuzz targets that read peer hosts' bytes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "proto/fabric.h"

namespace vsocket::proto {

struct SampleFrame {
  FrameHeader header;
  std::vector<uint8_t> payload;  // header.len bytes
};

// Every frame type once; PAIR_REQUEST and PAIR_ACCEPT with IPv4 and IPv6
// bodies, DATA small and longer than one
// 4 KiB read. RDMA_SETUP's payload is zeros
// (its encoding lives in host-backend/fabric/rdma_link.h).
const std::vector<SampleFrame>& SampleFrames();
// Header and payload as they travel on a link.
std::vector<uint8_t> EncodeFrame(const SampleFrame& f);
// Writes one seed file DIR/NAME.
bool WriteSeed(const std::string& dir, const std::string& name, std::span<const uint8_t> bytes);

}  // namespace vsocket::proto
