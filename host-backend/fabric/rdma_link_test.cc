// RdmaLink beyond the conformance suite: endpoint info encoding, one-sided
// DATA into registered memory (zero copy and bounced), the caller's wrap
// split, credits with a tiny receive ring and no RNR retry, wakeups, and
// fatal errors. Cases needing a device skip where there is none (run them
// in QEMU with tests/rdma/fabric_in_qemu.sh).
#include "host-backend/fabric/rdma_link.h"

#include <poll.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "gtest/gtest.h"

namespace vsocket::fabric {
namespace {

using proto::FrameHeader;
using proto::FrameType;

TEST(RdmaEndpointInfo, RoundTrips) {
  RdmaEndpointInfo e;
  e.qpn = 0x123456;
  e.psn = 0xabcdef;
  for (int i = 0; i < 16; ++i) e.gid[i] = static_cast<uint8_t>(i * 7);
  e.lid = 9;
  e.gid_index = 1;
  e.port = 1;
  e.mtu = IBV_MTU_4096;
  e.recv_depth = 512;
  e.staging_addr = 0x7f0012345000;
  e.staging_rkey = 0xdeadbeef;
  e.staging_size = 2 << 20;
  auto bytes = e.Encode();
  auto d = RdmaEndpointInfo::Decode(bytes);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->qpn, e.qpn);
  EXPECT_EQ(d->psn, e.psn);
  EXPECT_EQ(d->gid, e.gid);
  EXPECT_EQ(d->lid, e.lid);
  EXPECT_EQ(d->gid_index, e.gid_index);
  EXPECT_EQ(d->mtu, e.mtu);
  EXPECT_EQ(d->recv_depth, e.recv_depth);
  EXPECT_EQ(d->staging_addr, e.staging_addr);
  EXPECT_EQ(d->staging_rkey, e.staging_rkey);
  EXPECT_EQ(d->staging_size, e.staging_size);
}

TEST(RdmaEndpointInfo, DecodeRejectsWhatItCannotTrust) {
  RdmaEndpointInfo e;
  e.qpn = 17;
  e.recv_depth = 64;
  e.staging_size = 1 << 20;
  auto good = e.Encode();
  ASSERT_TRUE(RdmaEndpointInfo::Decode(good).ok());
  EXPECT_FALSE(RdmaEndpointInfo::Decode(std::span(good).first(good.size() - 1)).ok());
  auto mutate = [&](size_t at, uint8_t v) {
    auto b = good;
    b[at] = v;
    return RdmaEndpointInfo::Decode(b);
  };
  EXPECT_NE(mutate(0, 0).status().message().find("bad magic"), std::string::npos);
  EXPECT_FALSE(mutate(2, 9).ok());   // version
  EXPECT_FALSE(mutate(3, 1).ok());   // reserved
  EXPECT_FALSE(mutate(7, 1).ok());   // qpn beyond 24 bits
  EXPECT_FALSE(mutate(32, 0).ok());  // mtu
  EXPECT_FALSE(mutate(32, 6).ok());
  EXPECT_FALSE(mutate(36, 0).ok());  // recv_depth 64 -> 0
  EXPECT_FALSE(mutate(54, 0).ok());  // staging 1 MiB -> 0
}

// Records what arrives; staged DATA lands in `stream` at the frame's value.
struct Sink : FrameSink {
  std::vector<FrameHeader> frames;
  std::vector<uint8_t> stream;
  int headers = 0;
  PayloadDest OnHeader(const FrameHeader& h) override {
    ++headers;
    if (stream.size() < h.value + h.len) stream.resize(h.value + h.len);
    PayloadDest d;
    d.iov[0] = {stream.data() + h.value, h.len};
    d.n = 1;
    return d;
  }
  PayloadDest OnResume(const FrameHeader&, uint32_t) override {
    ADD_FAILURE() << "an rdma DATA frame arrives whole";
    return {};
  }
  void OnFrame(const FrameHeader& h, std::span<const uint8_t>) override { frames.push_back(h); }
};

FrameHeader Frame(FrameType t, uint64_t value, uint32_t len = 0) {
  FrameHeader h;
  h.type = t;
  h.tenant = 3;
  h.handle = 11;
  h.value = value;
  h.len = len;
  return h;
}

std::vector<uint8_t> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& x : v) x = static_cast<uint8_t>(rng());
  return v;
}

class RdmaLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (RdmaDevice::List().empty()) GTEST_SKIP() << "no RDMA device here (see tests/rdma/fabric_in_qemu.sh)";
    RdmaDevice::Options o;
    if (const char* d = getenv("VSOCKET_RDMA_DEV")) o.name = d;
    if (const char* g = getenv("VSOCKET_RDMA_GID_INDEX")) o.gid_index = atoi(g);
    auto dev = RdmaDevice::Open(o);
    ASSERT_TRUE(dev.ok()) << dev.status().ToString();
    dev_ = *dev;
  }

  void Connect(RdmaLinkOptions opt = {}) {
    opt.rnr_retry = 0;  // any receive-buffer overrun would kill the link
    auto a = RdmaLink::Create(dev_, opt);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    auto b = RdmaLink::Create(dev_, opt);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    // The daemon carries these over TLS; here they go through the codec.
    auto ia = RdmaEndpointInfo::Decode((*a)->LocalInfo().Encode());
    auto ib = RdmaEndpointInfo::Decode((*b)->LocalInfo().Encode());
    ASSERT_TRUE(ia.ok() && ib.ok());
    ASSERT_TRUE((*a)->Connect(*ib).ok());
    ASSERT_TRUE((*b)->Connect(*ia).ok());
    a_ = std::move(*a);
    b_ = std::move(*b);
  }

  // Drives both ends until done() or 20 s; sleeps on the wake fds.
  bool Pump(const std::function<bool()>& done, Sink& at_b, Sink* at_a = nullptr, int max_frames = 64) {
    Sink ignore;
    int64_t deadline = MonotonicMs() + 20000;
    while (!done()) {
      if (MonotonicMs() > deadline) return false;
      Status s[4] = {a_->Flush(), b_->Flush(), b_->Poll(at_b, max_frames), a_->Poll(at_a ? *at_a : ignore, max_frames)};
      for (Status& st : s)
        if (!st.ok()) {
          last_error_ = st;
          return done();
        }
      pollfd p[2] = {{a_->wake_fd(), POLLIN, 0}, {b_->wake_fd(), POLLIN, 0}};
      poll(p, 2, 5);
    }
    return true;
  }

  std::shared_ptr<RdmaDevice> dev_;
  std::unique_ptr<RdmaLink> a_, b_;
  Status last_error_;
};

TEST_F(RdmaLinkTest, RegisteredSourceLandsInRegisteredDestinationZeroCopy) {
  Connect();
  std::vector<uint8_t> ring(64 * 1024, 0), src = Random(40000, 1);
  uint32_t ring_lkey, ring_rkey, src_lkey, src_rkey;
  ASSERT_TRUE(
      dev_->RegisterMemory(ring.data(), ring.size(), RdmaDevice::Use::kRemoteWrite, &ring_lkey, &ring_rkey).ok());
  ASSERT_TRUE(dev_->RegisterMemory(src.data(), src.size(), RdmaDevice::Use::kLocalRead, &src_lkey, &src_rkey).ok());
  EXPECT_EQ(dev_->FindLkey(src.data() + 100, 1000), src_lkey);
  EXPECT_FALSE(dev_->FindLkey(src.data() + 100, src.size()).has_value());  // runs past the end
  // A region peers write into is never read for a send.
  EXPECT_FALSE(dev_->FindLkey(ring.data(), 100).has_value());
  EXPECT_EQ(src_rkey, 0u) << "a send-only region has no remote key";

  iovec v[2] = {{src.data(), 15000}, {src.data() + 15000, 25000}};
  RemoteBuffer rb{reinterpret_cast<uintptr_t>(ring.data()) + 1000, ring_rkey};
  uint64_t frame = a_->NextFrameNumber();
  ASSERT_TRUE(a_->Send(Frame(FrameType::kData, 1000, 40000), v, &rb));
  EXPECT_LE(a_->ReleasedThrough(), frame) << "read in place: not released before it completed";
  Sink got;
  ASSERT_TRUE(Pump([&] { return got.frames.size() == 1 && a_->ReleasedThrough() > frame; }, got))
      << last_error_.ToString();
  EXPECT_EQ(got.headers, 0);  // placed one-sided: no OnHeader
  EXPECT_EQ(got.frames[0].len, 40000u);
  EXPECT_EQ(std::memcmp(ring.data() + 1000, src.data(), src.size()), 0);
  EXPECT_EQ(a_->stats().backlog_bytes.load(), 0u);  // nothing bounced
  EXPECT_EQ(a_->stats().inplace_bytes.load(), 40000u);
  EXPECT_EQ(b_->stats().data_bytes_in.load(), 40000u);
  b_.reset();
  a_.reset();
  EXPECT_TRUE(dev_->UnregisterMemory(ring.data()).ok());
  EXPECT_TRUE(dev_->UnregisterMemory(src.data()).ok());
  EXPECT_FALSE(dev_->UnregisterMemory(src.data()).ok());
}

// A withdrawn registration is out of use at once (its address may be
// registered again, e.g. guest memory remapped there) but lives until
// released, for sends posted before.
TEST_F(RdmaLinkTest, WithdrawnRegistrationIsNotFoundButKeptUntilReleased) {
  Connect();
  std::vector<uint8_t> ring(64 * 1024, 0), src = Random(20000, 3);
  uint32_t ring_lkey, ring_rkey, lkey, rkey;
  ASSERT_TRUE(
      dev_->RegisterMemory(ring.data(), ring.size(), RdmaDevice::Use::kRemoteWrite, &ring_lkey, &ring_rkey).ok());
  ASSERT_TRUE(dev_->RegisterMemory(src.data(), src.size(), RdmaDevice::Use::kLocalRead, &lkey, &rkey).ok());
  iovec v{src.data(), src.size()};
  RemoteBuffer rb{reinterpret_cast<uintptr_t>(ring.data()), ring_rkey};
  ASSERT_TRUE(a_->Send(Frame(FrameType::kData, 0, 20000), {&v, 1}, &rb));
  ASSERT_TRUE(a_->Flush().ok());  // posted: reads src in place
  uint64_t token = dev_->WithdrawMemory(src.data());
  ASSERT_NE(token, 0u);
  EXPECT_EQ(dev_->WithdrawMemory(src.data()), 0u);
  EXPECT_FALSE(dev_->FindLkey(src.data(), 100).has_value());
  uint32_t lkey2, rkey2;
  ASSERT_TRUE(dev_->RegisterMemory(src.data(), src.size(), RdmaDevice::Use::kLocalRead, &lkey2, &rkey2).ok());
  Sink got;
  ASSERT_TRUE(Pump([&] { return got.frames.size() == 1 && a_->ReleasedThrough() == a_->NextFrameNumber(); }, got))
      << last_error_.ToString();  // the posted send still had its registration
  EXPECT_EQ(std::memcmp(ring.data(), src.data(), src.size()), 0);
  auto other = dev_->Domain();  // tokens are unique across domains
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_FALSE((*other)->ReleaseWithdrawn(token));
  EXPECT_TRUE(dev_->ReleaseWithdrawn(token));
  EXPECT_FALSE(dev_->ReleaseWithdrawn(token));  // twice is harmless
  EXPECT_EQ(dev_->FindLkey(src.data(), 100), lkey2);
  b_.reset();
  a_.reset();
  EXPECT_TRUE(dev_->UnregisterMemory(src.data()).ok());
  EXPECT_TRUE(dev_->UnregisterMemory(ring.data()).ok());
}

TEST_F(RdmaLinkTest, UnregisteredSourceIsBouncedAndFreeRightAfterSend) {
  Connect();
  std::vector<uint8_t> ring(64 * 1024, 0);
  uint32_t lkey, rkey;
  ASSERT_TRUE(dev_->RegisterMemory(ring.data(), ring.size(), RdmaDevice::Use::kRemoteWrite, &lkey, &rkey).ok());
  std::vector<uint8_t> src = Random(30000, 2), want = src;
  iovec v{src.data(), src.size()};
  RemoteBuffer rb{reinterpret_cast<uintptr_t>(ring.data()), rkey};
  ASSERT_TRUE(a_->Send(Frame(FrameType::kData, 0, 30000), {&v, 1}, &rb));
  std::fill(src.begin(), src.end(), 0xEE);  // before Flush, even
  Sink got;
  ASSERT_TRUE(Pump([&] { return got.frames.size() == 1; }, got)) << last_error_.ToString();
  EXPECT_EQ(std::memcmp(ring.data(), want.data(), want.size()), 0);
  EXPECT_EQ(a_->stats().backlog_bytes.load(), 30000u);
}

// A RemoteBuffer without an address (the peer sent no rkey) means "no
// remote buffer": the payload is staged and placed through OnHeader.
TEST_F(RdmaLinkTest, RemoteBufferWithoutAddressIsStaged) {
  Connect();
  std::vector<uint8_t> src = Random(20000, 5);
  iovec v{src.data(), src.size()};
  RemoteBuffer none{0, 0};
  ASSERT_TRUE(a_->Send(Frame(FrameType::kData, 0, 20000), {&v, 1}, &none));
  Sink got;
  ASSERT_TRUE(Pump([&] { return got.frames.size() == 1; }, got)) << last_error_.ToString();
  EXPECT_EQ(got.headers, 1);
  EXPECT_EQ(got.stream, src);
}

// The receiver's ring wraps: the caller sends the payload as two frames,
// one to the end of the ring and one from its start.
TEST_F(RdmaLinkTest, WrappingPayloadGoesAsTwoSends) {
  Connect();
  constexpr size_t kRing = 64 * 1024, kAt = 60000, kLen = 10000;
  std::vector<uint8_t> ring(kRing, 0);
  uint32_t lkey, rkey;
  ASSERT_TRUE(dev_->RegisterMemory(ring.data(), ring.size(), RdmaDevice::Use::kRemoteWrite, &lkey, &rkey).ok());
  std::vector<uint8_t> src = Random(kLen, 3);
  uint64_t base = reinterpret_cast<uintptr_t>(ring.data());
  size_t first = kRing - kAt;
  iovec v1{src.data(), first}, v2{src.data() + first, kLen - first};
  RemoteBuffer r1{base + kAt, rkey}, r2{base, rkey};
  ASSERT_TRUE(a_->Send(Frame(FrameType::kData, kAt, static_cast<uint32_t>(first)), {&v1, 1}, &r1));
  ASSERT_TRUE(a_->Send(Frame(FrameType::kData, kAt + first, static_cast<uint32_t>(kLen - first)), {&v2, 1}, &r2));
  Sink got;
  ASSERT_TRUE(Pump([&] { return got.frames.size() == 2; }, got)) << last_error_.ToString();
  EXPECT_EQ(got.frames[0].value, kAt);
  EXPECT_EQ(got.frames[1].value, kAt + first);
  EXPECT_EQ(std::memcmp(ring.data() + kAt, src.data(), first), 0);
  EXPECT_EQ(std::memcmp(ring.data(), src.data() + first, kLen - first), 0);
}

// Four receive buffers, a minimal staging ring, no RNR retry, both
// directions at once and one frame per Poll: credits alone keep every SEND
// landing in a posted buffer.
TEST_F(RdmaLinkTest, TinyReceiveRingNeverOverruns) {
  RdmaLinkOptions opt;
  opt.recv_depth = 4;
  opt.staging_bytes = rdma_internal::kMinStaging;
  Connect(opt);
  constexpr int kCtl = 3000, kData = 200;
  constexpr uint32_t kChunk = proto::kMaxDataFrame;
  std::vector<uint8_t> want = Random(size_t{kData} * kChunk, 4);
  Sink at_b, at_a;
  int ctl_ab = 0, ctl_ba = 0, data = 0;
  ASSERT_TRUE(Pump(
      [&] {
        while (ctl_ab < kCtl && a_->Send(Frame(FrameType::kCredit, ctl_ab), {})) ++ctl_ab;
        while (ctl_ba < kCtl && b_->Send(Frame(FrameType::kCredit, ctl_ba), {})) ++ctl_ba;
        while (data < kData) {
          iovec v{want.data() + static_cast<size_t>(data) * kChunk, kChunk};
          if (!a_->Send(Frame(FrameType::kData, static_cast<uint64_t>(data) * kChunk, kChunk), {&v, 1})) break;
          ++data;
        }
        return at_b.frames.size() == kCtl + kData && at_a.frames.size() == kCtl;
      },
      at_b, &at_a, 1))
      << last_error_.ToString() << " b got " << at_b.frames.size() << ", a got " << at_a.frames.size();
  EXPECT_EQ(at_b.stream, want);
  EXPECT_EQ(at_b.headers, kData);
}

TEST_F(RdmaLinkTest, WakeFdSignalsArrivalsAndStaysQuietWhenIdle) {
  Connect();
  Sink got;
  ASSERT_TRUE(b_->Poll(got, 64).ok());
  pollfd p{b_->wake_fd(), POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(a_->Send(Frame(FrameType::kCredit, i), {}));
  ASSERT_TRUE(a_->Flush().ok());
  ASSERT_EQ(poll(&p, 1, 5000), 1);  // woken by the completion channel
  // Leftovers beyond max_frames keep the fd readable.
  int64_t deadline = MonotonicMs() + 5000;
  while (got.frames.empty() && MonotonicMs() < deadline) {
    ASSERT_TRUE(b_->Poll(got, 1).ok());
    poll(&p, 1, 5);
  }
  ASSERT_EQ(got.frames.size(), 1u);
  // The other four may still be in flight; once all arrived and were read,
  // the fd goes quiet.
  while (got.frames.size() < 5 && MonotonicMs() < deadline) {
    EXPECT_EQ(poll(&p, 1, 5000), 1);
    ASSERT_TRUE(b_->Poll(got, 1).ok());
  }
  ASSERT_EQ(got.frames.size(), 5u);
  ASSERT_TRUE(b_->Poll(got, 64).ok());
  EXPECT_EQ(poll(&p, 1, 50), 0);
}

TEST_F(RdmaLinkTest, BadRkeyKillsTheLinkWithAClearError) {
  Connect();
  std::vector<uint8_t> src(4096, 1);
  iovec v{src.data(), src.size()};
  RemoteBuffer bogus{0x1000, 0x12345678};
  ASSERT_TRUE(a_->Send(Frame(FrameType::kData, 0, 4096), {&v, 1}, &bogus));
  Sink got;
  Pump([&] { return false; }, got);
  EXPECT_EQ(last_error_.code(), Code::kUnavailable);
  EXPECT_NE(last_error_.message().find("failed"), std::string::npos) << last_error_.ToString();
  // a is dead for good (b saw the access error too, or will time out).
  Status again = a_->Poll(got, 1);
  if (again.ok()) again = b_->Poll(got, 1);
  EXPECT_FALSE(a_->Send(Frame(FrameType::kCredit, 1), {}));
  EXPECT_FALSE(a_->Flush().ok() && b_->Flush().ok());
  EXPECT_TRUE(got.frames.empty());
}

// vsocketd gives each peer host its own protection domain (issue 17,
// finding 5): a peer that learned or guessed the rkey of a ring registered
// for another host cannot write there; its link dies with the access error.
// The same write to a ring of its own domain lands.
TEST_F(RdmaLinkTest, RingOfAnotherPeersDomainIsOutOfReach) {
  Connect();  // a_ -> b_: the links of one peer host, in dev_'s domain
  auto other = dev_->Domain();
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  std::vector<uint8_t> theirs(64 * 1024, 0), ours(64 * 1024, 0), src = Random(4096, 9);
  uint32_t lkey, their_rkey, our_rkey;
  ASSERT_TRUE(
      (*other)->RegisterMemory(theirs.data(), theirs.size(), RdmaDevice::Use::kRemoteWrite, &lkey, &their_rkey).ok());
  ASSERT_TRUE(dev_->RegisterMemory(ours.data(), ours.size(), RdmaDevice::Use::kRemoteWrite, &lkey, &our_rkey).ok());
  iovec v{src.data(), src.size()};
  RemoteBuffer mine{reinterpret_cast<uintptr_t>(ours.data()), our_rkey};
  ASSERT_TRUE(a_->Send(Frame(FrameType::kData, 0, 4096), {&v, 1}, &mine));
  Sink got;
  ASSERT_TRUE(Pump([&] { return got.frames.size() == 1; }, got)) << last_error_.ToString();
  EXPECT_EQ(std::memcmp(ours.data(), src.data(), src.size()), 0);
  RemoteBuffer stolen{reinterpret_cast<uintptr_t>(theirs.data()), their_rkey};
  ASSERT_TRUE(a_->Send(Frame(FrameType::kData, 4096, 4096), {&v, 1}, &stolen));
  Pump([&] { return false; }, got);
  EXPECT_FALSE(last_error_.ok()) << "the write to another domain's ring completed";
  EXPECT_EQ(got.frames.size(), 1u);
  EXPECT_EQ(static_cast<size_t>(std::count(theirs.begin(), theirs.end(), 0)), theirs.size())
      << "bytes reached a ring registered in another protection domain";
  b_.reset();
  a_.reset();
  EXPECT_TRUE((*other)->UnregisterMemory(theirs.data()).ok());
  EXPECT_TRUE(dev_->UnregisterMemory(ours.data()).ok());
}

// vsocketd registers guest rings on a thread of its own (issue 17, finding
// 6): Prepare pins the memory from any thread without putting it in use
// (FindLkey does not see it), Adopt puts it in use, only in the domain it
// was made in, and Take hands it back alive for that thread to destroy.
// A prepared send source carries a frame once adopted.
TEST_F(RdmaLinkTest, PreparedRegistrationIsInUseOnlyOnceAdopted) {
  Connect();
  std::vector<uint8_t> ring(64 * 1024, 0), src = Random(8192, 4);
  uint32_t ring_lkey, ring_rkey;
  ASSERT_TRUE(
      dev_->RegisterMemory(ring.data(), ring.size(), RdmaDevice::Use::kRemoteWrite, &ring_lkey, &ring_rkey).ok());
  Result<RdmaDevice::Prepared> prepared = Status(Code::kInternal, "not run");
  std::thread([&] { prepared = dev_->Prepare(src.data(), src.size(), RdmaDevice::Use::kLocalRead); }).join();
  ASSERT_TRUE(prepared.ok()) << prepared.status().ToString();
  EXPECT_FALSE(dev_->FindLkey(src.data(), 100).has_value()) << "in use before it was adopted";
  auto other = dev_->Domain();
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  uint32_t lkey = 0, rkey = 0;
  EXPECT_EQ((*other)->Adopt(&prepared.value(), &lkey, &rkey).code(), Code::kInvalidArgument);
  ASSERT_NE(prepared.value().mr, nullptr) << "a refused registration is handed back";
  EXPECT_FALSE((*other)->FindLkey(src.data(), 100).has_value());
  ASSERT_TRUE(dev_->Adopt(&prepared.value(), &lkey, &rkey).ok());
  EXPECT_EQ(rkey, 0u) << "a send source is never writable by peers";
  EXPECT_EQ(dev_->FindLkey(src.data(), 100), lkey);
  iovec v{src.data(), src.size()};
  RemoteBuffer rb{reinterpret_cast<uintptr_t>(ring.data()), ring_rkey};
  ASSERT_TRUE(a_->Send(Frame(FrameType::kData, 0, 8192), {&v, 1}, &rb));
  Sink got;
  ASSERT_TRUE(Pump([&] { return got.frames.size() == 1 && a_->ReleasedThrough() == a_->NextFrameNumber(); }, got))
      << last_error_.ToString();
  EXPECT_EQ(std::memcmp(ring.data(), src.data(), src.size()), 0);
  EXPECT_EQ(a_->stats().inplace_bytes.load(), 8192u) << "the adopted registration was not read in place";
  // Taken back: out of use at once, alive until destroyed (elsewhere).
  RdmaDevice::Prepared taken = dev_->Take(src.data());
  ASSERT_NE(taken.mr, nullptr);
  EXPECT_FALSE(dev_->FindLkey(src.data(), 100).has_value());
  EXPECT_EQ(dev_->Take(src.data()).mr, nullptr);
  std::thread([t = std::move(taken)]() mutable { t.mr.reset(); }).join();
  b_.reset();
  a_.reset();
  EXPECT_TRUE(dev_->UnregisterMemory(ring.data()).ok());
}

TEST_F(RdmaLinkTest, QpInErrorStateKillsTheLink) {
  Connect();
  ASSERT_TRUE(b_->ForceErrorForTest().ok());
  Sink got;
  Status st;
  int64_t deadline = MonotonicMs() + 5000;
  while (st.ok() && MonotonicMs() < deadline) {
    st = b_->Poll(got, 64);
    pollfd p{b_->wake_fd(), POLLIN, 0};
    poll(&p, 1, 5);
  }
  EXPECT_EQ(st.code(), Code::kUnavailable);
  EXPECT_NE(st.message().find("receive failed"), std::string::npos) << st.ToString();
  EXPECT_FALSE(b_->Writable());
  EXPECT_FALSE(b_->Poll(got, 1).ok());
}

TEST_F(RdmaLinkTest, LinkCloseFrameIsDeliveredThenTheLinkIsClosed) {
  Connect();
  ASSERT_TRUE(a_->Send(Frame(FrameType::kCredit, 1), {}));
  FrameHeader close = Frame(FrameType::kLinkClose, 0);
  close.handle = 0;
  ASSERT_TRUE(a_->Send(close, {}));
  Sink got;
  Pump([&] { return false; }, got);
  ASSERT_EQ(got.frames.size(), 2u);
  EXPECT_EQ(got.frames[1].type, FrameType::kLinkClose);
  EXPECT_EQ(last_error_.code(), Code::kUnavailable);
  EXPECT_NE(last_error_.message().find("closed by the peer"), std::string::npos) << last_error_.ToString();
}

// Two QPs per side on one shared completion queue per side (a host pair
// with links_per_peer = 2): each link gets exactly its own frames, in
// order, although one link's Poll() drains the other's completions too;
// a third link does not fit the CQ; a link in error leaves its sibling
// working.
TEST_F(RdmaLinkTest, LinksSharingACompletionQueueEachGetTheirOwnFrames) {
  RdmaLinkOptions opt;
  opt.rnr_retry = 0;
  opt.recv_depth = 16;  // credits run out and come back many times
  auto cqa = RdmaCompletionQueue::Create(dev_, 2, opt);
  auto cqb = RdmaCompletionQueue::Create(dev_, 2, opt);
  ASSERT_TRUE(cqa.ok() && cqb.ok()) << cqa.status().ToString() << cqb.status().ToString();
  std::unique_ptr<RdmaLink> a[2], b[2];
  for (int i = 0; i < 2; ++i) {
    auto x = RdmaLink::Create(dev_, opt, *cqa);
    auto y = RdmaLink::Create(dev_, opt, *cqb);
    ASSERT_TRUE(x.ok() && y.ok()) << x.status().ToString() << y.status().ToString();
    a[i] = std::move(*x);
    b[i] = std::move(*y);
    ASSERT_TRUE(a[i]->Connect(b[i]->LocalInfo()).ok());
    ASSERT_TRUE(b[i]->Connect(a[i]->LocalInfo()).ok());
  }
  EXPECT_EQ((*cqa)->links(), 2);
  auto third = RdmaLink::Create(dev_, opt, *cqa);
  EXPECT_EQ(third.status().code(), Code::kResourceExhausted);
  EXPECT_EQ(a[0]->wake_fd() == a[1]->wake_fd(), false);

  constexpr int kFrames = 300;
  Sink got[2], ignore;
  int sent[2] = {0, 0};
  int64_t deadline = MonotonicMs() + 20000;
  while ((got[0].frames.size() < kFrames || got[1].frames.size() < kFrames) && MonotonicMs() < deadline) {
    for (int i = 0; i < 2; ++i) {
      while (sent[i] < kFrames && a[i]->Send(Frame(FrameType::kCredit, uint64_t(i) * 1000000 + sent[i] + 1), {}))
        ++sent[i];
      ASSERT_TRUE(a[i]->Flush().ok());
    }
    // Only b[1] polls first: it drains b[0]'s receive completions too,
    // which must reach b[0] (and wake it), not b[1].
    for (int i : {1, 0}) ASSERT_TRUE(b[i]->Poll(got[i], 64).ok());
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(a[i]->Poll(ignore, 64).ok());
    pollfd p[4] = {{a[0]->wake_fd(), POLLIN, 0},
                   {a[1]->wake_fd(), POLLIN, 0},
                   {b[0]->wake_fd(), POLLIN, 0},
                   {b[1]->wake_fd(), POLLIN, 0}};
    poll(p, 4, 5);
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(got[i].frames.size(), size_t{kFrames}) << "link " << i;
    for (int k = 0; k < kFrames; ++k) ASSERT_EQ(got[i].frames[k].value, uint64_t(i) * 1000000 + k + 1);
  }
  // One QP fails: its link dies, the other keeps carrying frames.
  ASSERT_TRUE(b[0]->ForceErrorForTest().ok());
  Status st0;
  deadline = MonotonicMs() + 5000;
  while (st0.ok() && MonotonicMs() < deadline) {
    st0 = b[0]->Poll(ignore, 64);
    pollfd p{b[0]->wake_fd(), POLLIN, 0};
    poll(&p, 1, 5);
  }
  EXPECT_FALSE(st0.ok());
  ASSERT_TRUE(a[1]->Send(Frame(FrameType::kCredit, 42), {}));
  ASSERT_TRUE(a[1]->Flush().ok());
  got[1].frames.clear();
  deadline = MonotonicMs() + 5000;
  while (got[1].frames.empty() && MonotonicMs() < deadline) {
    ASSERT_TRUE(b[1]->Poll(got[1], 64).ok());
    pollfd p{b[1]->wake_fd(), POLLIN, 0};
    poll(&p, 1, 5);
  }
  ASSERT_EQ(got[1].frames.size(), 1u);
  EXPECT_EQ(got[1].frames[0].value, 42u);
}

}  // namespace
}  // namespace vsocket::fabric
