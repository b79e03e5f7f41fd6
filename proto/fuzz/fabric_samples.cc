#include "proto/fuzz/fabric_samples.h"

#include <cstdio>
#include <cstring>

namespace vsocket::proto {
namespace {

constexpr uint32_t kTenant = 7;

SampleFrame Frame(FrameType t, uint64_t handle, uint64_t value, uint32_t aux, std::vector<uint8_t> payload = {}) {
  SampleFrame f;
  f.header.type = t;
  f.header.tenant = kTenant;
  f.header.handle = handle;
  f.header.value = value;
  f.header.aux = aux;
  f.header.len = static_cast<uint32_t>(payload.size());
  f.payload = std::move(payload);
  return f;
}

std::vector<uint8_t> Pair(Family family, Role role) {
  PairInfo p;
  p.local.family = p.peer.family = family;
  if (family == Family::kIpv4) {
    p.local.addr = {192, 0, 2, 1};
    p.peer.addr = {198, 51, 100, 2};
  } else {
    p.local.addr = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    p.peer.addr = p.local.addr;
    p.peer.addr[15] = 2;
  }
  p.local.port = 40000;
  p.peer.port = 6379;
  p.role = role;
  p.rx_addr = 0x7f0000001000;
  p.rx_rkey = 0x1234;
  std::vector<uint8_t> b(kPairInfoSize);
  EncodePairInfo(p, b.data());
  return b;
}

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(seed + i * 7);
  return b;
}

}  // namespace

const std::vector<SampleFrame>& SampleFrames() {
  static const std::vector<SampleFrame> kSamples = [] {
    std::vector<SampleFrame> s = {
        Frame(FrameType::kLinkHello, 0, 0, 0, Bytes(32, 1)),
        Frame(FrameType::kLinkClose, 0, 0, 0),
        Frame(FrameType::kKeepalive, 0, 0, 0),
        Frame(FrameType::kLinkReady, 0, 0, 0),
        Frame(FrameType::kRdmaSetup, 0, 0, 0, std::vector<uint8_t>(kRdmaSetupSize)),
        Frame(FrameType::kPairRequest, 0, 11, 65536, Pair(Family::kIpv4, Role::kClient)),
        Frame(FrameType::kPairRequest, 0, 12, 4096, Pair(Family::kIpv6, Role::kServer)),
        Frame(FrameType::kPairAccept, 11, 21, 65536, Pair(Family::kIpv4, Role::kServer)),
        Frame(FrameType::kPairReject, 11, 0, static_cast<uint32_t>(Reason::kCrossTenant)),
        Frame(FrameType::kPairCancel, 0, 11, 0),
        Frame(FrameType::kPairDecline, 0, 0, static_cast<uint32_t>(Reason::kKernelFaster),
              Pair(Family::kIpv4, Role::kClient)),
        Frame(FrameType::kData, 21, 0, 0, Bytes(100, 3)),
        Frame(FrameType::kData, 21, 100, 0, Bytes(5000, 5)),  // more than a 4 KiB read
        Frame(FrameType::kCredit, 21, 4096, 0),
        Frame(FrameType::kFence, 21, 0, 0),
        Frame(FrameType::kShutWr, 21, 65636, 0),
        Frame(FrameType::kGone, 21, 0, 0),
        Frame(FrameType::kAbort, 21, 0, 0),
        Frame(FrameType::kRelease, 21, 0, 0),
        Frame(FrameType::kDowngrade, 21, 0, static_cast<uint32_t>(Reason::kFabricDown)),
        Frame(FrameType::kPairConfirm, 21, 0, 0),
        Frame(FrameType::kFenceAck, 21, 0, 0),
        Frame(FrameType::kPlacement, 21, 0x7f0000002000, 0x99),
        Frame(FrameType::kPlacementAck, 21, 1, 0),
    };
    return s;
  }();
  return kSamples;
}

std::vector<uint8_t> EncodeFrame(const SampleFrame& f) {
  std::vector<uint8_t> b(kFrameHeaderSize + f.payload.size());
  EncodeFrameHeader(f.header, b.data());
  if (!f.payload.empty()) std::memcpy(b.data() + kFrameHeaderSize, f.payload.data(), f.payload.size());
  return b;
}

bool WriteSeed(const std::string& dir, const std::string& name, std::span<const uint8_t> bytes) {
  std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  return std::fclose(f) == 0 && ok;
}

}  // namespace vsocket::proto
