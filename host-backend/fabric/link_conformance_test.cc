// One conformance suite for every fabric link: the fake (in-memory pipe,
// with small capacities to force backpressure), tcp (real kernel TCP on
// loopback) and, where an RDMA device exists, rdma (see link_test_env.h).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/unique_fd.h"
#include "gtest/gtest.h"
#include "host-backend/fabric/link.h"
#include "host-backend/fabric/link_test_env.h"
#include "proto/control.h"

namespace vsocket::fabric {
namespace {

using proto::FrameHeader;
using proto::FrameType;

// Collects what arrives; DATA payloads land in per-handle buffers at the
// frame's offset (like a receiver placing bytes in a connection's RX ring,
// here split into two pieces at a chosen wrap point).
struct Collector : FrameSink {
  std::vector<FrameHeader> frames;
  std::map<uint64_t, std::vector<uint8_t>> streams;
  bool discard = false;
  PayloadDest OnHeader(const FrameHeader& h) override {
    PayloadDest d;
    if (discard) return d;
    auto& s = streams[h.handle];
    if (s.size() < h.value + h.len) s.resize(h.value + h.len);
    size_t first = h.len / 3;  // exercise the two-piece destination
    d.iov[0] = {s.data() + h.value, first};
    d.iov[1] = {s.data() + h.value + first, h.len - first};
    d.n = first == 0 ? 1 : 2;
    if (d.n == 1) d.iov[0] = {s.data() + h.value, h.len};
    return d;
  }
  PayloadDest OnResume(const FrameHeader& h, uint32_t landed) override {
    PayloadDest d;
    if (discard) return d;
    d.iov[0] = {streams[h.handle].data() + h.value + landed, h.len - landed};
    d.n = 1;
    return d;
  }
  void OnFrame(const FrameHeader& h, std::span<const uint8_t>) override { frames.push_back(h); }
};

class LinkConformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto pair = MakeTestLinkPair(GetParam());
    if (!pair) GTEST_SKIP() << GetParam() << " link not available here";
    a_ = std::move(pair->a);
    b_ = std::move(pair->b);
    inject_ = std::move(pair->inject_into_b);
  }

  // Drives both ends until `done` or 20 s pass. Returns done().
  bool Pump(const std::function<bool()>& done, Collector& at_b, Collector* at_a = nullptr) {
    Collector ignore;
    int64_t deadline = MonotonicMs() + 20000;
    while (!done()) {
      if (MonotonicMs() > deadline) return false;
      EXPECT_TRUE(a_->Flush().ok());
      EXPECT_TRUE(b_->Flush().ok());
      Status sb = b_->Poll(at_b, 64);
      Status sa = a_->Poll(at_a ? *at_a : ignore, 64);
      if (!sb.ok() || !sa.ok()) {
        last_error_ = !sb.ok() ? sb : sa;
        return done();
      }
      pollfd p[2] = {{a_->wake_fd(), POLLIN, 0}, {b_->wake_fd(), POLLIN, 0}};
      poll(p, 2, 1);
    }
    return true;
  }

  std::unique_ptr<Link> a_, b_;
  std::function<void(const void*, size_t)> inject_;
  Status last_error_;
};

FrameHeader Ctl(FrameType t, uint64_t handle, uint64_t value) {
  FrameHeader h;
  h.type = t;
  h.tenant = 7;
  h.handle = handle;
  h.value = value;
  return h;
}

TEST_P(LinkConformance, ControlFramesArriveInOrder) {
  Collector got;
  const int kN = 2000;
  int sent = 0;
  ASSERT_TRUE(Pump(
      [&] {
        while (sent < kN && a_->Writable()) {
          if (!a_->Send(Ctl(FrameType::kCredit, 1 + sent % 5, sent), {})) break;
          ++sent;
        }
        return got.frames.size() == kN;
      },
      got))
      << last_error_.ToString();
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(got.frames[i].type, FrameType::kCredit);
    EXPECT_EQ(got.frames[i].value, static_cast<uint64_t>(i));
    EXPECT_EQ(got.frames[i].handle, 1u + i % 5);
    EXPECT_EQ(got.frames[i].tenant, 7u);
  }
}

// Many connections' byte streams interleaved on one link, every size from
// 1 byte to a full frame, payloads gathered from two source pieces (a
// wrapping TX ring); the source is overwritten right after each flush, so
// the link must never read it later.
TEST_P(LinkConformance, InterleavedDataStreamsAreExact) {
  constexpr int kConns = 64;
  constexpr size_t kPerConn = 256 * 1024;
  std::mt19937 rng(42);
  std::vector<std::vector<uint8_t>> want(kConns);
  for (auto& w : want) {
    w.resize(kPerConn);
    for (auto& x : w) x = static_cast<uint8_t>(rng());
  }
  std::vector<size_t> off(kConns, 0);
  Collector got;
  std::vector<uint8_t> src(proto::kMaxDataFrame * 2);
  size_t frames_total = 0;
  auto all_sent = [&] {
    for (size_t o : off)
      if (o < kPerConn) return false;
    return true;
  };
  auto delivered = [&] {
    size_t n = 0;
    for (auto& f : got.frames) n += f.len;
    return n;
  };
  ASSERT_TRUE(Pump(
      [&] {
        std::vector<uint8_t> staged;
        size_t src_used = 0;
        for (int c = 0; c < kConns && a_->Writable(); ++c) {
          if (off[c] >= kPerConn) continue;
          size_t len = std::min<size_t>({kPerConn - off[c], 1 + rng() % proto::kMaxDataFrame});
          if (src_used + len > src.size()) break;
          std::memcpy(src.data() + src_used, want[c].data() + off[c], len);
          size_t cut = len / 2;
          iovec v[2] = {{src.data() + src_used, cut}, {src.data() + src_used + cut, len - cut}};
          FrameHeader h = Ctl(FrameType::kData, 100 + c, off[c]);
          h.len = static_cast<uint32_t>(len);
          if (!a_->Send(h, v)) break;
          src_used += len;
          off[c] += len;
          ++frames_total;
        }
        EXPECT_TRUE(a_->Flush().ok());
        std::fill(src.begin(), src.end(), 0xEE);  // the link copied what it still needs
        return all_sent() && delivered() == kConns * kPerConn;
      },
      got))
      << last_error_.ToString();
  for (int c = 0; c < kConns; ++c) {
    ASSERT_EQ(got.streams[100 + c].size(), kPerConn);
    EXPECT_EQ(proto::Crc32c(got.streams[100 + c]), proto::Crc32c(want[c])) << "conn " << c;
  }
  EXPECT_EQ(got.frames.size(), frames_total);
  EXPECT_EQ(a_->stats().data_bytes_out.load(), kConns * kPerConn);
  EXPECT_EQ(b_->stats().data_bytes_in.load(), kConns * kPerConn);
}

// Frames queued while the link is busy go out together: fewer writes than
// frames (adaptive batching); a lone frame on an idle link goes at once.
TEST_P(LinkConformance, BusyLinkCoalescesIdleLinkSendsAtOnce) {
  Collector got;
  ASSERT_TRUE(a_->Send(Ctl(FrameType::kFence, 9, 1), {}));
  uint64_t writes0 = a_->stats().write_calls.load();
  ASSERT_TRUE(Pump([&] { return got.frames.size() == 1; }, got));
  EXPECT_EQ(a_->stats().write_calls.load() - writes0, 1u);
  for (int i = 0; i < 300; ++i) ASSERT_TRUE(a_->Send(Ctl(FrameType::kCredit, 9, i), {}));
  uint64_t writes1 = a_->stats().write_calls.load();
  ASSERT_TRUE(Pump([&] { return got.frames.size() == 301; }, got));
  EXPECT_LT(a_->stats().write_calls.load() - writes1, 30u);
}

// Every frame a link took is numbered in order; once delivered and the
// sender has looked at its completions, every number is released (the
// caller's payload memory is its own again).
TEST_P(LinkConformance, FrameNumbersCountSendsAndAreAllReleased) {
  Collector got;
  uint64_t first = a_->NextFrameNumber();
  std::vector<uint8_t> p(30000, 9);
  int sent = 0;
  for (int i = 0; i < 10; ++i) {
    iovec v{p.data(), p.size()};
    FrameHeader h = Ctl(FrameType::kData, 4, uint64_t(i) * p.size());
    h.len = static_cast<uint32_t>(p.size());
    uint64_t before = a_->NextFrameNumber();
    if (!a_->Send(h, {&v, 1})) {
      EXPECT_EQ(a_->NextFrameNumber(), before) << "a refused frame gets no number";
      break;
    }
    EXPECT_GT(a_->NextFrameNumber(), before);
    ++sent;
  }
  ASSERT_GT(sent, 0);
  EXPECT_LE(a_->ReleasedThrough(), a_->NextFrameNumber());
  ASSERT_TRUE(Pump(
      [&] { return got.frames.size() == static_cast<size_t>(sent) && a_->ReleasedThrough() == a_->NextFrameNumber(); },
      got))
      << last_error_.ToString();
  EXPECT_GE(a_->NextFrameNumber() - first, static_cast<uint64_t>(sent));
}

TEST_P(LinkConformance, DiscardedPayloadKeepsTheStreamInSync) {
  Collector got;
  got.discard = true;
  std::vector<uint8_t> p(50000, 1);
  iovec v{p.data(), p.size()};
  FrameHeader h = Ctl(FrameType::kData, 3, 0);
  h.len = static_cast<uint32_t>(p.size());
  ASSERT_TRUE(a_->Send(h, {&v, 1}));
  ASSERT_TRUE(a_->Send(Ctl(FrameType::kShutWr, 3, 50000), {}));
  ASSERT_TRUE(Pump([&] { return got.frames.size() == 2; }, got)) << last_error_.ToString();
  EXPECT_EQ(got.frames[1].type, FrameType::kShutWr);
  EXPECT_EQ(got.frames[1].value, 50000u);
}

// The receiver's memory may move (or go) between two Poll() calls, e.g. a
// guest device paused and resumed, or a guest that exited: a payload that
// spans calls must continue wherever the sink says now, never in memory
// the sink gave up (here filled with 0xEE and kept to be checked).
struct MovingSink : FrameSink {
  explicit MovingSink(size_t bytes) : cur(std::make_unique<std::vector<uint8_t>>(bytes)) {}
  std::unique_ptr<std::vector<uint8_t>> cur;
  std::vector<std::unique_ptr<std::vector<uint8_t>>> graveyard;
  std::vector<FrameHeader> frames;
  int resumes = 0;
  // What a device pause/resume does to a connection's RX ring.
  void Move() {
    auto fresh = std::make_unique<std::vector<uint8_t>>(*cur);
    std::fill(cur->begin(), cur->end(), 0xEE);
    graveyard.push_back(std::move(cur));
    cur = std::move(fresh);
  }
  PayloadDest At(uint64_t pos, size_t len) {
    PayloadDest d;
    d.iov[0] = {cur->data() + pos, len};
    d.n = 1;
    return d;
  }
  PayloadDest OnHeader(const FrameHeader& h) override { return At(h.value, h.len); }
  PayloadDest OnResume(const FrameHeader& h, uint32_t landed) override {
    ++resumes;
    return At(h.value + landed, h.len - landed);
  }
  void OnFrame(const FrameHeader& h, std::span<const uint8_t>) override { frames.push_back(h); }
};

TEST_P(LinkConformance, PartialPayloadFollowsTheSinkBetweenPolls) {
  if (GetParam() == "rdma") GTEST_SKIP() << "an rdma DATA frame arrives whole";
  const size_t kFrames = 64, kBytes = kFrames * proto::kMaxDataFrame;
  std::vector<uint8_t> p(kBytes);
  std::mt19937 rng(5);
  for (auto& b : p) b = static_cast<uint8_t>(rng());
  MovingSink got(kBytes);
  size_t sent = 0;
  Collector ignore;
  int64_t deadline = MonotonicMs() + 20000;
  int polls = 0;
  while (got.frames.size() < kFrames && MonotonicMs() < deadline) {
    while (sent < kFrames && a_->Writable()) {
      FrameHeader h = Ctl(FrameType::kData, 9, sent * proto::kMaxDataFrame);
      h.len = proto::kMaxDataFrame;
      iovec v{p.data() + h.value, h.len};
      ASSERT_TRUE(a_->Send(h, {&v, 1}));
      ++sent;
    }
    ASSERT_TRUE(a_->Flush().ok());
    ASSERT_TRUE(b_->Poll(got, 64).ok());
    ASSERT_TRUE(a_->Poll(ignore, 64).ok());
    ++polls;
    got.Move();  // between two polls, as the worker's device events come
    pollfd pf[2] = {{a_->wake_fd(), POLLIN, 0}, {b_->wake_fd(), POLLIN, 0}};
    poll(pf, 2, 1);
  }
  ASSERT_EQ(got.frames.size(), kFrames);
  // The small pipe always splits payloads; other links may or may not.
  if (GetParam() == "fake_small")
    EXPECT_GT(got.resumes, 0) << "no payload spanned two polls in " << polls << ": nothing was tested";
  EXPECT_TRUE(*got.cur == p) << "the payload is exact where the sink has it now";
  size_t written = 0;
  for (const auto& g : got.graveyard)
    for (uint8_t b : *g) written += b != 0xEE;
  EXPECT_EQ(written, 0u) << "bytes landed in memory the sink had given up";
}

TEST_P(LinkConformance, MaxFramesPerPollIsRespected) {
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(a_->Send(Ctl(FrameType::kCredit, 1, i), {}));
  ASSERT_TRUE(a_->Flush().ok());
  Collector got;
  int64_t deadline = MonotonicMs() + 5000;
  while (got.frames.size() < 10 && MonotonicMs() < deadline) {
    size_t before = got.frames.size();
    ASSERT_TRUE(b_->Poll(got, 3).ok());
    EXPECT_LE(got.frames.size() - before, 3u);
    pollfd p{b_->wake_fd(), POLLIN, 0};
    poll(&p, 1, 1);
  }
  EXPECT_EQ(got.frames.size(), 10u);
}

TEST_P(LinkConformance, GarbageKillsTheLinkWithAClearError) {
  if (!inject_) GTEST_SKIP() << "no raw transport access for this link";
  const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n....";
  inject_(junk, 32);
  Collector got;
  Pump([&] { return false; }, got);
  EXPECT_EQ(last_error_.code(), Code::kDataLoss);
  EXPECT_NE(last_error_.message().find("bad magic"), std::string::npos) << last_error_.ToString();
  // Dead stays dead.
  EXPECT_FALSE(b_->Poll(got, 1).ok());
}

TEST_P(LinkConformance, PeerCloseIsReportedAfterEveryFrameArrived) {
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(a_->Send(Ctl(FrameType::kCredit, 1, i), {}));
  ASSERT_TRUE(a_->Flush().ok());
  a_.reset();
  Collector got;
  int64_t deadline = MonotonicMs() + 5000;
  Status st;
  while (st.ok() && MonotonicMs() < deadline) {
    st = b_->Poll(got, 64);
    pollfd p{b_->wake_fd(), POLLIN, 0};
    poll(&p, 1, 1);
  }
  EXPECT_EQ(got.frames.size(), 5u);
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
}

INSTANTIATE_TEST_SUITE_P(Links, LinkConformance, ::testing::ValuesIn(TestLinkKinds()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace vsocket::fabric
