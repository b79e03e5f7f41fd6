// Hostile guests and their own memory (issue 17, finding 2): a guest must
// never be able to crash vsocketd through the file behind its memory
// region. A process-mode guest owns its memfd: it can shrink it under the
// backend's mapping, or declare a region larger than the file, and the
// backend's next access to that memory would be a SIGBUS that kills
// vsocketd with every tenant's connections. The backend accepts only size-
// sealed files at least as large as the region, and survives an access
// beyond a file's end anyway (the page reads as zeros, the device is
// refused). A well-behaved guest keeps doing checksummed echoes throughout.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "tests/integration/daemon_fixture.h"
#include "tests/integration/good_guest.h"
#include "vhost/user/frontend.h"

namespace vsocket {
namespace {

using testing::Daemon;
using testing::GoodGuest;
using vhost::ShmRegion;
using vhost::VhostUserFrontend;
namespace user = vhost::user;

constexpr size_t kRegionBytes = 1 << 20;

std::unique_ptr<VhostUserFrontend> NewFrontend(const std::string& sock, ShmRegion::Seal seal) {
  vhost::FrontendOptions o;
  o.socket_path = sock;
  o.queue_size = 16;
  o.region_bytes = kRegionBytes;
  o.timeout_ms = 3000;
  o.seal = seal;
  auto fe = VhostUserFrontend::Create(o);
  EXPECT_TRUE(fe.ok());
  return fe.ok() ? std::move(fe).value() : nullptr;
}

class HostileMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.Start());
    pid_ = daemon_.pid();
    good_ = std::make_unique<GoodGuest>(daemon_.socket_path("good"));
  }
  void TearDown() override {
    EXPECT_GT(good_->StopAndCheck(), 0u) << "the good guest made progress";
    EXPECT_TRUE(daemon_.Alive()) << "vsocketd survived";
    EXPECT_EQ(daemon_.pid(), pid_);
    good_.reset();
    EXPECT_TRUE(daemon_.StopsCleanly()) << "vsocketd exits with status 0 on SIGTERM";
  }
  std::string bad() { return daemon_.socket_path("bad"); }
  long long Counter(const char* key) { return Daemon::Number(daemon_.Stats(), key); }
  // Waits (bounded) for counter key to exceed before.
  long long AwaitAbove(const char* key, long long before) {
    long long v = before;
    for (int i = 0; i < 200 && v <= before; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      v = Counter(key);
    }
    return v;
  }

  Daemon daemon_{{"good", "bad"}};
  pid_t pid_ = -1;
  std::unique_ptr<GoodGuest> good_;
};

// The library's own region: its size cannot change.
TEST_F(HostileMemoryTest, TheLibrarysRegionCannotBeResized) {
  auto fe = NewFrontend(bad(), ShmRegion::Seal::kSizeSealed);
  ASSERT_NE(fe, nullptr);
  ASSERT_TRUE(fe->Connect().ok());
  int fd = fe->region().fd();
  int seals = fcntl(fd, F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW), F_SEAL_SHRINK | F_SEAL_GROW);
  errno = 0;
  EXPECT_NE(ftruncate(fd, 0), 0);
  EXPECT_EQ(errno, EPERM);
}

// A guest whose file is not sealed is refused before the backend uses its
// memory; it shrinks the file and kicks anyway.
TEST_F(HostileMemoryTest, UnsealedRegionShrunkUnderTheBackend) {
  long long before = Counter("devices_rejected");
  auto fe = NewFrontend(bad(), ShmRegion::Seal::kUnsealed);
  ASSERT_NE(fe, nullptr);
  (void)fe->Connect();  // the device is refused: DRIVER_OK may or may not be answered
  ASSERT_EQ(ftruncate(fe->region().fd(), 0), 0);
  for (size_t q = 0; q < fe->num_queues(); ++q) fe->Kick(q);
  EXPECT_GT(AwaitAbove("devices_rejected", before), before);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(Counter("devices_started"), 1) << "only the good guest's device runs";
}

// A running device gets a new memory table, one page larger than the old
// one (rte_vhost ignores a table that did not change), whose file is one
// page long and mapped from that page's end: rte_vhost itself reads the
// rings while it applies the table, beyond the file's end, before any
// check of ours runs. The guard absorbs that; the device is refused.
TEST_F(HostileMemoryTest, RegionLargerThanItsFile) {
  auto fe = NewFrontend(bad(), ShmRegion::Seal::kSizeSealed);
  ASSERT_NE(fe, nullptr);
  ASSERT_TRUE(fe->Connect().ok());
  long long absorbed = std::max(0LL, Counter("sigbus_absorbed"));
  auto small = ShmRegion::Create("short", 4096);
  ASSERT_TRUE(small.ok());
  user::Message m{};
  m.hdr = {static_cast<uint32_t>(user::Request::kSetMemTable), user::kFlagVersion | user::kFlagNeedReply,
           static_cast<uint32_t>(8 + sizeof(user::MemoryRegionDesc))};
  m.payload.memory.nregions = 1;
  auto base = reinterpret_cast<uint64_t>(fe->region().base());
  m.payload.memory.regions[0] = {base, fe->region().size() + 4096, base, 4096};
  int fd = (*small)->fd();
  ASSERT_TRUE(fe->SendMessage(m, {&fd, 1}).ok());
  (void)fe->ReceiveReply(user::Request::kSetMemTable);
  for (size_t q = 0; q < fe->num_queues(); ++q) fe->Kick(q);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::string s = daemon_.Stats();
  EXPECT_NE(s.find("reconfiguration rejected"), std::string::npos) << s;
  EXPECT_GT(Daemon::Number(s, "sigbus_absorbed"), absorbed) << s;
}

}  // namespace
}  // namespace vsocket
