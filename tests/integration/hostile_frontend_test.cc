// A hostile frontend can never crash vsocketd or make it touch memory outside
// that frontend's region. Each attack runs against the real rte_vhost
// backend while a well-behaved guest keeps doing checksummed echoes; the
// attacked device is latched broken (or refused) and counted, and the good
// guest never notices.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>

#include <atomic>
#include <random>
#include <vector>
#include <thread>

#include "proto/virtio_ring.h"
#include "tests/integration/control_channel.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/good_guest.h"

namespace vsocket {
namespace {

using testing::GoodGuest;
using testing::Daemon;
using vhost::VhostUserFrontend;
namespace user = vhost::user;

std::unique_ptr<VhostUserFrontend> NewFrontend(const std::string& sock, uint16_t nq = 2) {
  vhost::FrontendOptions o;
  o.socket_path = sock;
  o.num_queues = nq;
  o.queue_size = 16;
  o.region_bytes = 1 << 20;
  o.timeout_ms = 3000;
  auto fe = VhostUserFrontend::Create(o);
  EXPECT_TRUE(fe.ok());
  return std::move(fe).value();
}

user::Message Msg(user::Request r, uint32_t size) {
  user::Message m{};
  m.hdr = {static_cast<uint32_t>(r), user::kFlagVersion, size};
  return m;
}

class HostileFrontendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.Start());
    good_ = std::make_unique<GoodGuest>(daemon_.socket_path("good"));
  }
  void TearDown() override {
    EXPECT_GT(good_->StopAndCheck(), 0u) << "the good guest made progress";
    EXPECT_TRUE(daemon_.Alive()) << "vsocketd survived";
  }
  std::string bad() { return daemon_.socket_path("bad"); }

  // Attaches a correctly negotiated frontend, then corrupts its request
  // queue with `corrupt` and kicks; expects the device to be broken.
  void RingAttack(const std::function<void(vhost::SplitRing&, uint64_t)>& corrupt, const char* reason) {
    auto fe = NewFrontend(bad());
    ASSERT_TRUE(fe->Connect().ok());
    long long before = Daemon::Number(daemon_.Stats(), "broken_devices");
    vhost::SplitRing ring = fe->queue(0).ring();
    corrupt(ring, reinterpret_cast<uint64_t>(fe->region().base()));
    fe->Kick(0);
    std::string s;
    for (int i = 0; i < 200; ++i) {
      s = daemon_.Stats();
      if (Daemon::Number(s, "broken_devices") > before) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(Daemon::Number(s, "broken_devices"), before + 1) << s;
    EXPECT_NE(s.find(reason), std::string::npos) << s;
    EXPECT_NE(s.find("\"broken\":true"), std::string::npos);
  }

  Daemon daemon_{{"good", "bad"}};
  std::unique_ptr<GoodGuest> good_;
};

void Offer(vhost::SplitRing& r, uint16_t head) {
  uint16_t idx = r.avail_idx().load();
  r.avail_slot(idx) = head;
  r.avail_idx().store(idx + 1);
}

TEST_F(HostileFrontendTest, DescriptorOutsideGuestMemory) {
  RingAttack(
      [](vhost::SplitRing& r, uint64_t) {
        r.desc()[0] = {0x1000, 64, 0, 0};  // not in the region
        Offer(r, 0);
      },
      "outside guest memory");
}

TEST_F(HostileFrontendTest, DescriptorLengthRunsOffRegion) {
  RingAttack(
      [](vhost::SplitRing& r, uint64_t base) {
        r.desc()[0] = {base + 4096, 0x7fffffff, 0, 0};
        Offer(r, 0);
      },
      "outside guest memory");
}

TEST_F(HostileFrontendTest, LoopedDescriptorChain) {
  RingAttack(
      [](vhost::SplitRing& r, uint64_t base) {
        r.desc()[0] = {base, 1, proto::kDescFlagNext, 1};
        r.desc()[1] = {base, 1, proto::kDescFlagNext, 0};
        Offer(r, 0);
      },
      "loops");
}

TEST_F(HostileFrontendTest, AbsurdAvailIndex) {
  RingAttack([](vhost::SplitRing& r, uint64_t) { r.avail_idx().store(40000); }, "further than the queue size");
}

TEST_F(HostileFrontendTest, HeadBeyondQueue) {
  RingAttack([](vhost::SplitRing& r, uint64_t) { Offer(r, 999); }, "beyond the queue");
}

TEST_F(HostileFrontendTest, IndirectDescriptor) {
  RingAttack(
      [](vhost::SplitRing& r, uint64_t base) {
        r.desc()[0] = {base, 16, proto::kDescFlagIndirect, 0};
        Offer(r, 0);
      },
      "indirect");
}

TEST_F(HostileFrontendTest, GarbageRequestGetsErrorNotBreakage) {
  auto fe = NewFrontend(bad());
  ASSERT_TRUE(fe->Connect().ok());
  uint8_t* req = fe->allocator().Allocate(64);
  uint8_t* resp = fe->allocator().Allocate(64);
  std::memset(req, 0xab, 64);
  vhost::VirtqueueDriver::Buf out{reinterpret_cast<uint64_t>(req), 64};
  vhost::VirtqueueDriver::Buf in{reinterpret_cast<uint64_t>(resp), 64};
  ASSERT_TRUE(fe->queue(0).Add({&out, 1}, {&in, 1}, 0).ok());
  fe->queue(0).Publish();
  fe->Kick(0);
  std::optional<vhost::VirtqueueDriver::Used> u;
  for (int i = 0; i < 300 && !u; ++i) {
    fe->WaitCall(0, 10);
    u = fe->queue(0).PopUsed();
  }
  ASSERT_TRUE(u.has_value());
  auto m = proto::Decode({resp, u->len});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->type, proto::MsgType::kError);
  EXPECT_EQ(std::get<proto::Error>(m->body).code, proto::WireError::kBadMessage);
  EXPECT_EQ(Daemon::Number(daemon_.Stats(), "broken_devices"), 0);
}

// The guest kernel's virtio_net bound to a vSocket port (a QEMU
// virtio-net-pci device): its receive queue (queue 0, our request queue) is
// full of device-writable buffers. vsocketd must not answer them (an error
// message written there is a corrupt packet to the guest: "bad gso") but
// mark the device broken, naming the foreign driver.
TEST_F(HostileFrontendTest, ForeignNetDriverReceiveBuffersBreakTheDeviceUntouched) {
  auto fe = NewFrontend(bad());
  ASSERT_TRUE(fe->Connect().ok());
  long long before = Daemon::Number(daemon_.Stats(), "broken_devices");
  constexpr uint32_t kRxBytes = 1526;  // virtio_net_hdr + an Ethernet frame
  std::vector<uint8_t*> bufs;
  for (uint64_t i = 0; i < 4; ++i) {
    uint8_t* rx = fe->allocator().Allocate(kRxBytes);
    ASSERT_NE(rx, nullptr);
    std::memset(rx, 0x5a, kRxBytes);
    bufs.push_back(rx);
    vhost::VirtqueueDriver::Buf in{reinterpret_cast<uint64_t>(rx), kRxBytes};
    ASSERT_TRUE(fe->queue(0).Add({}, {&in, 1}, i).ok());
  }
  fe->queue(0).Publish();
  fe->Kick(0);
  std::string s;
  for (int i = 0; i < 300; ++i) {
    s = daemon_.Stats();
    if (Daemon::Number(s, "broken_devices") > before) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Daemon::Number(s, "broken_devices"), before + 1) << s;
  EXPECT_NE(s.find("foreign driver"), std::string::npos) << s;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(fe->queue(0).PopUsed().has_value()) << "a receive buffer was returned";
  for (uint8_t* rx : bufs)
    for (uint32_t i = 0; i < kRxBytes; ++i) ASSERT_EQ(rx[i], 0x5a) << "vsocketd wrote into a receive buffer at " << i;
}

TEST_F(HostileFrontendTest, WrongFdCountsCloseOnlyThatConnection) {
  auto fe = NewFrontend(bad());
  ASSERT_TRUE(fe->OpenSocket().ok());
  // SET_MEM_TABLE announcing one region but carrying no fd.
  user::Message m = Msg(user::Request::kSetOwner, 0);
  ASSERT_TRUE(fe->SendMessage(m).ok());
  m = Msg(user::Request::kSetMemTable, 8 + sizeof(user::MemoryRegionDesc));
  m.payload.memory.nregions = 1;
  m.payload.memory.regions[0] = {0x1000, 4096, 0x1000, 0};
  ASSERT_TRUE(fe->SendMessage(m).ok());
  // The backend drops the connection.
  for (int i = 0; i < 200 && !fe->BackendGone(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(fe->BackendGone());
  // KICK with three fds instead of one.
  auto fe2 = NewFrontend(bad());
  ASSERT_TRUE(fe2->OpenSocket().ok());
  int efd[3] = {eventfd(0, 0), eventfd(0, 0), eventfd(0, 0)};
  m = Msg(user::Request::kSetVringKick, 8);
  m.payload.u64 = 0;
  ASSERT_TRUE(fe2->SendMessage(m, efd).ok());
  for (int i = 0; i < 200 && !fe2->BackendGone(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(fe2->BackendGone());
  for (int fd : efd) close(fd);
}

TEST_F(HostileFrontendTest, WrongNumberOfQueuesIsRefused) {
  auto fe = NewFrontend(bad(), 3);
  (void)fe->Connect();  // negotiation itself succeeds; the device never starts
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::string s = daemon_.Stats();
  EXPECT_GE(Daemon::Number(s, "devices_rejected"), 1) << s;
}

TEST_F(HostileFrontendTest, KickFdThatIsNotPollable) {
  // A regular file as kick fd: epoll refuses it; the device is broken, not
  // the daemon.
  auto fe = NewFrontend(bad());
  ASSERT_TRUE(fe->OpenSocket().ok());
  // Replay a normal handshake but swap in a regular file for queue 0's kick.
  // Simplest: negotiate normally, then re-send SET_VRING_KICK while running.
  ASSERT_TRUE(fe->Connect().ok());
  int file = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  user::Message m = Msg(user::Request::kSetVringKick, 8);
  m.hdr.flags |= user::kFlagNeedReply;
  m.payload.u64 = 0;
  ASSERT_TRUE(fe->SendMessage(m, {&file, 1}).ok());
  (void)fe->ReceiveReply(user::Request::kSetVringKick);
  close(file);
  std::string s;
  for (int i = 0; i < 100; ++i) {
    s = daemon_.Stats();
    if (s.find("not pollable") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_NE(s.find("not pollable"), std::string::npos) << s;
}

// A frontend (a guest's driver, through QEMU) that moves a running queue's
// rings to addresses no region of its memory holds (SET_VRING_ADDR): the
// device is stopped or latched broken and never read there; vsocketd and
// the good guest go on (issue 35: bad ring addresses from a guest driver).
TEST_F(HostileFrontendTest, VringAddressesOutsideGuestMemory) {
  auto fe = NewFrontend(bad());
  ASSERT_TRUE(fe->Connect().ok());
  uint64_t far = reinterpret_cast<uint64_t>(fe->region().base()) + (uint64_t{1} << 40);
  user::Message m = Msg(user::Request::kSetVringAddr, sizeof(user::VringAddr));
  m.hdr.flags |= user::kFlagNeedReply;
  m.payload.addr = {0, 0, far, far + 4096, far + 8192, 0};
  ASSERT_TRUE(fe->SendMessage(m, {}).ok());
  (void)fe->ReceiveReply(user::Request::kSetVringAddr);
  // Requests on the moved queue: whatever vsocketd decided, it must not
  // serve them from the old rings nor read the new addresses.
  fe->Kick(0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::string s = daemon_.Stats();
  // Stopped (no longer listed) or listed broken.
  size_t at = s.find("\"vm\":\"bad\"");
  bool off = at == std::string::npos;
  const std::string broken = "\"broken\":true";
  if (!off) off = s.compare(s.find("\"broken\":", at), broken.size(), broken) == 0;
  EXPECT_TRUE(off) << s;
  EXPECT_NE(s.find("lies outside guest memory"), std::string::npos) << s;
}

TEST_F(HostileFrontendTest, MemoryTableSwappedUnderRunningDevice) {
  auto fe = NewFrontend(bad());
  ASSERT_TRUE(fe->Connect().ok());
  // A new, tiny region that no longer contains the rings.
  auto small = vhost::ShmRegion::Create("evil", 4096);
  ASSERT_TRUE(small.ok());
  user::Message m = Msg(user::Request::kSetMemTable, 8 + sizeof(user::MemoryRegionDesc));
  m.hdr.flags |= user::kFlagNeedReply;
  m.payload.memory.nregions = 1;
  auto base = reinterpret_cast<uint64_t>((*small)->base());
  m.payload.memory.regions[0] = {base, 4096, base, 0};
  int fd = (*small)->fd();
  ASSERT_TRUE(fe->SendMessage(m, {&fd, 1}).ok());
  (void)fe->ReceiveReply(user::Request::kSetMemTable);
  // Whatever the library decided, our device must not run on stale maps.
  fe->Kick(0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::string s = daemon_.Stats();
  EXPECT_GE(Daemon::Number(s, "reconfigurations"), 1) << s;
  EXPECT_NE(s.find("reconfiguration rejected"), std::string::npos) << s;
}

TEST_F(HostileFrontendTest, RandomMessagesAndRingFuzzNeverHurtOthers) {
  std::mt19937_64 rng(2024);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  int iterations = 0;
  for (; iterations < 150 && std::chrono::steady_clock::now() < deadline; ++iterations) {
    auto fe = NewFrontend(bad());
    switch (rng() % 3) {
      case 0: {  // random vhost-user messages, random fd counts
        if (!fe->OpenSocket().ok()) break;
        for (int k = 0; k < 5; ++k) {
          user::Message m{};
          m.hdr.request = static_cast<uint32_t>(rng() % 45);
          m.hdr.flags = user::kFlagVersion | (rng() % 2 ? user::kFlagNeedReply : 0);
          m.hdr.size = static_cast<uint32_t>(rng() % (sizeof(user::Payload) + 1));
          auto* bytes = reinterpret_cast<uint8_t*>(&m.payload);
          for (size_t i = 0; i < sizeof(m.payload); ++i) bytes[i] = static_cast<uint8_t>(rng());
          int fds[3] = {eventfd(0, 0), eventfd(0, 0), eventfd(0, 0)};
          (void)fe->SendMessage(m, std::span<const int>(fds, rng() % 4));
          for (int f : fds) close(f);
        }
        break;
      }
      default: {  // a good handshake, then random ring contents
        if (!fe->Connect().ok()) break;
        vhost::SplitRing r = fe->queue(rng() % 2).ring();
        uint64_t base = reinterpret_cast<uint64_t>(fe->region().base());
        for (uint16_t i = 0; i < r.size(); ++i) {
          uint64_t addr = rng() % 3 ? base + rng() % (fe->region().size() + 8192) : rng();
          r.desc()[i] = {addr, static_cast<uint32_t>(rng() % 70000), static_cast<uint16_t>(rng() % 8),
                         static_cast<uint16_t>(rng() % 20)};
          r.avail_slot(i) = static_cast<uint16_t>(rng() % 20);
        }
        r.avail_idx().store(static_cast<uint16_t>(rng() % 24));
        fe->Kick(0);
        fe->Kick(1);
        break;
      }
    }
  }
  EXPECT_GT(iterations, 20);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(daemon_.Alive());
}

}  // namespace
}  // namespace vsocket
