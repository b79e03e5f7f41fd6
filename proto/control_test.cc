#include "proto/control.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "proto/control_samples.h"

namespace vsocket::proto {
namespace {

std::vector<uint8_t> MustEncode(const Message& m) {
  std::vector<uint8_t> buf(kMaxMessageSize);
  auto n = Encode(m, buf);
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  buf.resize(n.ok() ? *n : 0);
  return buf;
}

TEST(ControlTest, EverySampleRoundTripsByteExact) {
  for (const Message& m : SampleMessages()) {
    std::vector<uint8_t> bytes = MustEncode(m);
    size_t consumed = 0;
    auto d = Decode(bytes, &consumed);
    ASSERT_TRUE(d.ok()) << ToString(m.type) << ": " << d.status().ToString();
    EXPECT_EQ(consumed, bytes.size());
    EXPECT_EQ(*d, m) << ToString(m.type);
  }
}

TEST(ControlTest, HeaderIsLittleEndianWithFixedLayout) {
  Message m{MsgType::kTxTail, 0x1122334455667788ull, ConnCounter{7, 0x0102}};
  std::vector<uint8_t> b = MustEncode(m);
  ASSERT_EQ(b.size(), 32u);
  EXPECT_EQ(b[0], 0x56);  // "VS"
  EXPECT_EQ(b[1], 0x53);
  EXPECT_EQ(b[2], kControlVersion);
  EXPECT_EQ(b[3], static_cast<uint8_t>(MsgType::kTxTail));
  EXPECT_EQ(b[4], 16);    // body length
  EXPECT_EQ(b[8], 0x88);  // request id, LE
  EXPECT_EQ(b[15], 0x11);
  EXPECT_EQ(b[16], 7);     // conn id
  EXPECT_EQ(b[24], 0x02);  // bytes
  EXPECT_EQ(b[25], 0x01);
}

TEST(ControlTest, TrailingBytesAreIgnoredButReported) {
  std::vector<uint8_t> b = MustEncode({MsgType::kUnregister, 1, Unregister{9}});
  size_t size = b.size();
  b.resize(size + 100, 0xee);
  size_t consumed = 0;
  ASSERT_TRUE(Decode(b, &consumed).ok());
  EXPECT_EQ(consumed, size);
}

TEST(ControlTest, EveryTruncationIsRejected) {
  for (const Message& m : SampleMessages()) {
    std::vector<uint8_t> bytes = MustEncode(m);
    for (size_t len = 0; len < bytes.size(); ++len) {
      auto d = Decode(std::span<const uint8_t>(bytes.data(), len));
      EXPECT_FALSE(d.ok()) << ToString(m.type) << " truncated to " << len;
    }
  }
}

struct Corruption {
  const char* name;
  size_t offset;
  uint8_t value;
  const char* reason_fragment;
};

TEST(ControlTest, MalformedHeadersAreRejectedWithReason) {
  std::vector<uint8_t> good = MustEncode({MsgType::kFence, 3, ConnCounter{1, 2}});
  const Corruption kCases[] = {
      {"magic", 0, 0x00, "magic"},           {"version", 2, 9, "version"},
      {"type zero", 3, 0, "unknown type"},   {"type too big", 3, 200, "unknown type"},
      {"body length", 4, 15, "body length"}, {"huge body length", 7, 0x80, "body length"},
  };
  for (const Corruption& c : kCases) {
    std::vector<uint8_t> b = good;
    b[c.offset] = c.value;
    auto d = Decode(b);
    ASSERT_FALSE(d.ok()) << c.name;
    EXPECT_EQ(d.status().code(), Code::kDataLoss) << c.name;
    EXPECT_NE(d.status().message().find(c.reason_fragment), std::string::npos)
        << c.name << ": " << d.status().message();
  }
}

TEST(ControlTest, RegisterConnFieldValidation) {
  RegisterConn good = std::get<RegisterConn>(SampleMessages()[2].body);
  struct Case {
    const char* name;
    void (*mutate)(RegisterConn*);
  };
  const Case kCases[] = {
      {"zero port", [](RegisterConn* r) { r->local.port = 0; }},
      {"family mismatch", [](RegisterConn* r) { r->peer.family = Family::kIpv6; }},
      {"ipv4 padding", [](RegisterConn* r) { r->peer.addr[9] = 1; }},
      {"ring not power of two", [](RegisterConn* r) { r->tx_ring_bytes = 5000; }},
      {"ring too small", [](RegisterConn* r) { r->rx_ring_bytes = 2048; }},
      {"ring too big", [](RegisterConn* r) { r->rx_ring_bytes = 128u << 20; }},
      {"ring misaligned", [](RegisterConn* r) { r->tx_ring_gpa += 8; }},
  };
  for (const Case& c : kCases) {
    RegisterConn r = good;
    c.mutate(&r);
    std::vector<uint8_t> b = MustEncode({MsgType::kRegisterConn, 1, r});
    EXPECT_FALSE(Decode(b).ok()) << c.name;
  }
  // A bad role byte and an unknown flag bit, written directly.
  std::vector<uint8_t> b = MustEncode({MsgType::kRegisterConn, 1, good});
  b[kHeaderSize + 8] = 3;
  EXPECT_FALSE(Decode(b).ok());
  b = MustEncode({MsgType::kRegisterConn, 1, good});
  b[kHeaderSize + 11] = 8;
  EXPECT_FALSE(Decode(b).ok());
  // The bulk flag (kFeatureBulkHint), the tentative flag (kFeatureTentative)
  // and the direct flag (decision 98) are the byte's only known bits.
  for (uint8_t flags : {kRegisterBulk, kRegisterTentative, uint8_t(kRegisterBulk | kRegisterTentative),
                        uint8_t(kRegisterTentative | kRegisterDirect)}) {
    RegisterConn with = good;
    with.flags = flags;
    b = MustEncode({MsgType::kRegisterConn, 1, with});
    EXPECT_EQ(b[kHeaderSize + 11], flags);
    auto m = Decode(b);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(std::get<RegisterConn>(m->body), with);
  }
  b = MustEncode({MsgType::kRegisterConn, 1, good});
  b[kHeaderSize + 11] = 0x80;
  EXPECT_FALSE(Decode(b).ok());
}

TEST(ControlTest, EnumsOutOfRangeAreRejected) {
  std::vector<uint8_t> b = MustEncode({MsgType::kError, 0, Error{1, WireError::kBadRing, {}}});
  b[kHeaderSize + 8] = kMaxWireError + 1;
  EXPECT_FALSE(Decode(b).ok());
  b = MustEncode({MsgType::kDowngrade, 0, Downgrade{1, Reason::kMigration, 5}});
  b[kHeaderSize + 8] = kMaxReason + 1;
  EXPECT_FALSE(Decode(b).ok());
  // The library-only reasons are refused: 18, 19, 21 and 22, below
  // kMaxReason all the same; directory-unavailable, 20, and
  // direct-unavailable, 23, are the wire's (decisions 95 and 135).
  for (Reason r : {Reason::kRequestResponse, Reason::kUrgentData, Reason::kPeerCorruptedRing, Reason::kConnectionOver}) {
    b[kHeaderSize + 8] = static_cast<uint8_t>(r);
    EXPECT_FALSE(Decode(b).ok()) << ToString(r);
  }
  b = MustEncode({MsgType::kDowngrade, 0, Downgrade{1, Reason::kDirectUnavailable, 0, kDowngradeResendFrom}});
  auto direct = Decode(b);
  ASSERT_TRUE(direct.ok()) << direct.status().ToString();
  EXPECT_EQ(std::get<Downgrade>(direct->body).reason, Reason::kDirectUnavailable);
  b = MustEncode({MsgType::kDowngrade, 0, Downgrade{1, Reason::kDirectoryUnavailable, 5}});
  auto dir = Decode(b);
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  EXPECT_EQ(std::get<Downgrade>(dir->body).reason, Reason::kDirectoryUnavailable);
  EXPECT_STREQ(ToString(Reason::kDirectoryUnavailable), "directory-unavailable");
  b = MustEncode({MsgType::kDowngrade, 0, Downgrade{1, Reason::kFabricDown, 5, kDowngradeFenceAcked}});
  ASSERT_TRUE(Decode(b).ok());
  b[kHeaderSize + 10] = kDowngradeDrain;
  ASSERT_TRUE(Decode(b).ok());
  b[kHeaderSize + 10] = kDowngradeResendFrom;
  ASSERT_TRUE(Decode(b).ok());
  b[kHeaderSize + 10] = 8;  // an unknown flag
  EXPECT_FALSE(Decode(b).ok());
  b = MustEncode({MsgType::kShutdown, 0, Shutdown{1, ShutdownHow::kBoth}});
  b[kHeaderSize + 8] = static_cast<uint8_t>(ShutdownHow::kRingEnd);
  ASSERT_TRUE(Decode(b).ok());
  b[kHeaderSize + 8] = 5;
  EXPECT_FALSE(Decode(b).ok());
}

TEST(ControlTest, ResyncHeader) {
  uint8_t b[kResyncHeaderSize];
  EncodeResync(0x0102030405060708ull, b);
  EXPECT_EQ(b[0], 'V');
  EXPECT_EQ(b[3], '1');
  auto from = DecodeResync(std::span<const uint8_t, kResyncHeaderSize>(b, kResyncHeaderSize));
  ASSERT_TRUE(from.ok());
  EXPECT_EQ(*from, 0x0102030405060708ull);
  for (size_t i : {0, 3, 4, 7}) {  // magic and reserved bytes are checked
    uint8_t bad[kResyncHeaderSize];
    std::memcpy(bad, b, sizeof(b));
    bad[i] ^= 0x40;
    EXPECT_FALSE(DecodeResync(std::span<const uint8_t, kResyncHeaderSize>(bad, kResyncHeaderSize)).ok()) << i;
  }
}

TEST(ControlTest, EchoPayloadBounds) {
  std::vector<uint8_t> payload(kMaxEchoPayload + 1, 1);
  Message big{MsgType::kEcho, 1, Echo{0, payload}};
  std::vector<uint8_t> buf(kMaxMessageSize + 64);
  EXPECT_FALSE(Encode(big, buf).ok());
  Message ok{MsgType::kEcho, 1, Echo{0, std::span<const uint8_t>(payload).first(10)}};
  std::vector<uint8_t> b = MustEncode(ok);
  b[kHeaderSize + 4] = 11;  // payload length disagrees with body length
  EXPECT_FALSE(Decode(b).ok());
}

TEST(ControlTest, EncodeRejectsMismatchedBodyAndSmallBuffers) {
  Message wrong{MsgType::kHello, 1, Unregister{1}};
  std::vector<uint8_t> buf(kMaxMessageSize);
  EXPECT_EQ(Encode(wrong, buf).status().code(), Code::kInvalidArgument);
  Message m{MsgType::kHello, 1, Hello{}};
  EXPECT_EQ(Encode(m, std::span<uint8_t>(buf.data(), 20)).status().code(), Code::kOutOfRange);
}

TEST(ControlTest, Crc32cMatchesKnownVector) {
  const char* s = "123456789";
  EXPECT_EQ(Crc32c({reinterpret_cast<const uint8_t*>(s), 9}), 0xE3069283u);
  EXPECT_EQ(Crc32c({}), 0u);
}

TEST(ControlTest, SeedCorpusIsValid) {
  // The fuzz seeds are generated from SampleMessages(); they must all decode.
  std::filesystem::path dir = "proto/fuzz/corpus/control";
  ASSERT_TRUE(std::filesystem::exists(dir)) << "run from the workspace root";
  size_t count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream f(entry.path(), std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), {});
    EXPECT_TRUE(Decode(bytes).ok()) << entry.path();
    ++count;
  }
  EXPECT_GE(count, SampleMessages().size());
}

}  // namespace
}  // namespace vsocket::proto
