// Against a socket_peer running elsewhere (another network namespace or
// host): VSOCKET_TEST_PEER_ADDR / VSOCKET_TEST_PEER_PORT. Skipped when unset.
// Protocol in socket_peer.cc.
#include <fcntl.h>

#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "proto/control.h"
#include "tests/socket/test_util.h"

namespace vsocket::socktest {
namespace {

#define VS_REQUIRE_PEER(addr)                                                        \
  const std::optional<sockaddr_in> addr##_opt = PeerServerAddr();                    \
  if (!addr##_opt) GTEST_SKIP() << "VSOCKET_TEST_PEER_ADDR not set: no remote peer"; \
  const sockaddr_in addr = *addr##_opt

uint8_t PeerPatternByte(uint64_t i) { return static_cast<uint8_t>((i * 131 + 7) & 0xff); }

std::string Le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// Sends `total` bytes of stream `seed` in random-sized writes.
void SendStream(int fd, uint64_t seed, size_t total, uint64_t rng_seed) {
  std::mt19937_64 rng(rng_seed);
  std::string buf(256 * 1024, '\0');
  for (size_t off = 0; off < total;) {
    size_t n = std::min<size_t>(1 + rng() % buf.size(), total - off);
    FillStream(seed, off, reinterpret_cast<uint8_t*>(buf.data()), n);
    if (!SendAll(fd, buf.data(), n)) return;
    off += n;
  }
}

// Receives `total` bytes and checks them against stream `seed`; returns the
// offset of the first wrong byte, or `total` if all were right.
size_t RecvAndCheckStream(int fd, uint64_t seed, size_t total) {
  std::string got(64 * 1024, '\0'), want(got.size(), '\0');
  for (size_t off = 0; off < total;) {
    size_t n = std::min(got.size(), total - off);
    if (!RecvExactly(fd, got.data(), n)) return off;
    FillStream(seed, off, reinterpret_cast<uint8_t*>(want.data()), n);
    for (size_t i = 0; i < n; ++i)
      if (got[i] != want[i]) return off + i;
    off += n;
  }
  return total;
}

TEST(Peer, NonblockingConnectCompletesWithSoErrorZero) {
  VS_REQUIRE_PEER(peer);
  Fd s = TcpSocket(SOCK_NONBLOCK);
  int r = connect(s.get(), AsSockaddr(&peer), sizeof peer);
  if (r != 0) {
    ASSERT_EQ(errno, EINPROGRESS) << ErrnoName(errno);
    short ev = WaitFor(s.get(), POLLOUT);
    EXPECT_TRUE(ev & POLLOUT) << "revents " << ev;
  }
  EXPECT_EQ(GetIntOpt(s.get(), SOL_SOCKET, SO_ERROR), 0);
  EXPECT_TRUE(SameEndpoint(PeerName(s.get()), peer));
}

TEST(Peer, EchoReturnsEveryByteOfRandomSizedWritesThenEofAfterShutWr) {
  VS_REQUIRE_PEER(peer);
  Fd s = ConnectTo(peer);
  ASSERT_TRUE(s.valid());
  ASSERT_TRUE(SendAll(s.get(), "E"));
  constexpr size_t kTotal = 8 << 20;
  const uint64_t seed = TestSeed();
  std::thread writer([&] {
    SendStream(s.get(), seed, kTotal, seed + 1);
    EXPECT_EQ(shutdown(s.get(), SHUT_WR), 0) << ErrnoName(errno);
  });
  size_t good = RecvAndCheckStream(s.get(), seed, kTotal);
  writer.join();
  EXPECT_EQ(good, kTotal) << "first wrong or missing byte";
  bool eof = false;
  EXPECT_EQ(RecvUntilEof(s.get(), 1, &eof), "");
  EXPECT_TRUE(eof);
}

TEST(Peer, SendCommandDeliversExactCountOfPatternThenEof) {
  VS_REQUIRE_PEER(peer);
  Fd s = ConnectTo(peer);
  ASSERT_TRUE(s.valid());
  constexpr uint64_t kCount = (3 << 20) + 17;
  ASSERT_TRUE(SendAll(s.get(), "S" + Le64(kCount)));
  bool eof = false;
  std::string got = RecvUntilEof(s.get(), kCount + 1, &eof);
  EXPECT_TRUE(eof);
  ASSERT_EQ(got.size(), kCount);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(static_cast<uint8_t>(got[i]), PeerPatternByte(i)) << "at byte " << i;
}

TEST(Peer, ReceiveCommandReportsCountAndCrc32cOfEverythingSent) {
  VS_REQUIRE_PEER(peer);
  Fd s = ConnectTo(peer);
  ASSERT_TRUE(s.valid());
  ASSERT_TRUE(SendAll(s.get(), "R"));
  constexpr size_t kTotal = (5 << 20) + 3;
  const uint64_t seed = TestSeed();
  const std::string data = StreamBytes(seed, kTotal);
  std::mt19937_64 rng(seed);
  for (size_t off = 0; off < data.size();) {
    size_t n = std::min<size_t>(1 + rng() % (256 * 1024), data.size() - off);
    ASSERT_TRUE(SendAll(s.get(), data.data() + off, n));
    off += n;
  }
  VS_ASSERT_OK(shutdown(s.get(), SHUT_WR));
  std::string reply = RecvExactly(s.get(), 12);
  ASSERT_EQ(reply.size(), 12u);
  uint64_t count = 0;
  uint32_t crc = 0;
  for (int i = 7; i >= 0; --i) count = (count << 8) | static_cast<uint8_t>(reply[i]);
  for (int i = 11; i >= 8; --i) crc = (crc << 8) | static_cast<uint8_t>(reply[i]);
  EXPECT_EQ(count, kTotal);
  EXPECT_EQ(crc, proto::Crc32c(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()), data.size())));
  bool eof = false;
  EXPECT_EQ(RecvUntilEof(s.get(), 1, &eof), "");
  EXPECT_TRUE(eof);
}

TEST(Peer, ResetCommandMakesReadFailEconnreset) {
  VS_REQUIRE_PEER(peer);
  Fd s = ConnectTo(peer);
  ASSERT_TRUE(s.valid());
  ASSERT_TRUE(SendAll(s.get(), "Xx"));
  short ev = WaitFor(s.get(), POLLIN);
  EXPECT_TRUE(ev & (POLLERR | POLLHUP)) << "revents " << ev;
  char b;
  VS_EXPECT_ERRNO(recv(s.get(), &b, 1, 0), ECONNRESET);
}

TEST(Peer, ConcurrentEchoConnectionsStayIndependent) {
  VS_REQUIRE_PEER(peer);
  constexpr int kConns = 16;
  constexpr size_t kBytes = 512 * 1024;
  const uint64_t seed = TestSeed();
  std::vector<std::thread> threads;
  std::vector<size_t> good(kConns, 0);
  for (int i = 0; i < kConns; ++i) {
    threads.emplace_back([&, i] {
      Fd s = ConnectTo(peer);
      if (!s.valid() || !SendAll(s.get(), "E")) return;
      // Lock-step chunks well below the socket buffers: no deadlock without
      // a separate reader thread.
      std::mt19937_64 rng(seed + i);
      std::string buf(32 * 1024, '\0');
      const uint64_t stream = seed ^ (0x1000u + i);
      size_t off = 0;
      while (off < kBytes) {
        size_t n = std::min<size_t>(1 + rng() % buf.size(), kBytes - off);
        FillStream(stream, off, reinterpret_cast<uint8_t*>(buf.data()), n);
        if (!SendAll(s.get(), buf.data(), n)) break;
        std::string back(n, '\0');
        if (!RecvExactly(s.get(), back.data(), n) || back != buf.substr(0, n)) break;
        off += n;
      }
      good[i] = off;
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kConns; ++i) EXPECT_EQ(good[i], kBytes) << "connection " << i;
}

}  // namespace
}  // namespace vsocket::socktest
