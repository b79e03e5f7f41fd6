#include "proto/fabric.h"

#include <array>
#include <random>

#include "gtest/gtest.h"

namespace vsocket::proto {
namespace {

std::array<uint8_t, kFrameHeaderSize> Encoded(const FrameHeader& h) {
  std::array<uint8_t, kFrameHeaderSize> b;
  EncodeFrameHeader(h, b.data());
  return b;
}

TEST(FabricFrame, RoundTrip) {
  FrameHeader h{FrameType::kData, 7, 0x1122334455667788ull, 0x99, 4096, 0};
  auto b = Encoded(h);
  auto d = DecodeFrameHeader(b);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->type, FrameType::kData);
  EXPECT_EQ(d->tenant, 7u);
  EXPECT_EQ(d->handle, 0x1122334455667788ull);
  EXPECT_EQ(d->value, 0x99u);
  EXPECT_EQ(d->len, 4096u);
}

TEST(FabricFrame, RejectsWhatTheTypeDoesNotAllow) {
  auto bad = [](FrameHeader h) {
    auto b = Encoded(h);
    return !DecodeFrameHeader(b).ok();
  };
  EXPECT_TRUE(bad({FrameType::kData, 7, 1, 0, 0, 0}));                  // empty DATA
  EXPECT_TRUE(bad({FrameType::kData, 7, 1, 0, kMaxDataFrame + 1, 0}));  // oversize
  EXPECT_TRUE(bad({FrameType::kCredit, 7, 1, 0, 8, 0}));                // credit with payload
  EXPECT_TRUE(bad({FrameType::kCredit, 0, 1, 0, 0, 0}));                // no tenant
  EXPECT_TRUE(bad({FrameType::kCredit, 7, 0, 0, 0, 0}));                // no handle
  EXPECT_TRUE(bad({FrameType::kDowngrade, 7, 1, 0, 0, kMaxReason + 1}));
  EXPECT_TRUE(bad({FrameType::kPairRequest, 7, 0, 5, 3, 0}));
  // PAIR_DECLINE: a PairInfo, a tenant, a known reason, no handle.
  const uint32_t faster = static_cast<uint32_t>(Reason::kKernelFaster);
  EXPECT_FALSE(bad({FrameType::kPairDecline, 7, 0, 0, kPairInfoSize, faster}));
  EXPECT_TRUE(bad({FrameType::kPairDecline, 0, 0, 0, kPairInfoSize, faster}));      // no tenant
  EXPECT_TRUE(bad({FrameType::kPairDecline, 7, 3, 0, kPairInfoSize, faster}));      // a handle
  EXPECT_TRUE(bad({FrameType::kPairDecline, 7, 0, 0, 0, faster}));                  // no PairInfo
  EXPECT_TRUE(bad({FrameType::kPairDecline, 7, 0, 0, kPairInfoSize, kMaxReason + 1}));
  // Library-only reasons never cross; directory-unavailable does (decision 95).
  for (Reason r : {Reason::kRequestResponse, Reason::kUrgentData, Reason::kPeerCorruptedRing, Reason::kConnectionOver}) {
    EXPECT_TRUE(bad({FrameType::kPairDecline, 7, 0, 0, kPairInfoSize, static_cast<uint32_t>(r)})) << ToString(r);
    EXPECT_TRUE(bad({FrameType::kDowngrade, 7, 1, 0, 0, static_cast<uint32_t>(r)})) << ToString(r);
    EXPECT_TRUE(bad({FrameType::kShutWr, 7, 1, 0, 0, ShutRingEndAux(r)})) << ToString(r);
  }
  const uint32_t dir = static_cast<uint32_t>(Reason::kDirectoryUnavailable);
  EXPECT_FALSE(bad({FrameType::kPairDecline, 7, 0, 0, kPairInfoSize, dir}));
  EXPECT_FALSE(bad({FrameType::kPairReject, 7, 1, 0, 0, dir}));
  auto b = Encoded({FrameType::kCredit, 7, 1, 0, 0, 0});
  b[0] ^= 1;
  EXPECT_NE(DecodeFrameHeader(b).status().message().find("bad magic"), std::string::npos);
  b = Encoded({FrameType::kCredit, 7, 1, 0, 0, 0});
  b[3] = 99;
  EXPECT_FALSE(DecodeFrameHeader(b).ok());
  b[3] = static_cast<uint8_t>(FrameType::kCredit);
  b[2] = 2;
  EXPECT_FALSE(DecodeFrameHeader(b).ok());
}

TEST(FabricFrame, RandomBytesNeverCrashAndRarelyPass) {
  std::mt19937 rng(1);
  int passed = 0;
  for (int i = 0; i < 100000; ++i) {
    std::array<uint8_t, kFrameHeaderSize> b;
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    passed += DecodeFrameHeader(b).ok();
  }
  EXPECT_EQ(passed, 0);  // magic + version alone make a random pass ~1 in 16M
}

TEST(PairInfo, RoundTripAndStrictness) {
  PairInfo p;
  p.local.addr = {198, 51, 100, 11};
  p.local.port = 5000;
  p.peer.addr = {198, 51, 100, 21};
  p.peer.port = 6000;
  p.role = Role::kServer;
  p.rx_addr = 0xabc;
  p.rx_rkey = 77;
  std::array<uint8_t, kPairInfoSize> b;
  EncodePairInfo(p, b.data());
  auto d = DecodePairInfo(b);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->local, p.local);
  EXPECT_EQ(d->peer, p.peer);
  EXPECT_EQ(d->role, Role::kServer);
  EXPECT_EQ(d->rx_addr, 0xabcu);
  EXPECT_EQ(d->rx_rkey, 77u);
  auto c = b;
  c[0] = 5;  // family
  EXPECT_FALSE(DecodePairInfo(c).ok());
  c = b;
  c[2] = c[3] = 0;  // port 0
  EXPECT_FALSE(DecodePairInfo(c).ok());
  c = b;
  c[10] = 1;  // IPv4 padding
  EXPECT_FALSE(DecodePairInfo(c).ok());
  EXPECT_FALSE(DecodePairInfo(std::span<const uint8_t>(b.data(), b.size() - 1)).ok());
}

}  // namespace
}  // namespace vsocket::proto
