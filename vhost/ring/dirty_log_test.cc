// The device side of a virtqueue marks every byte it writes into guest
// memory in the dirty log while it is on (live migration), and nothing
// while it is off.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "vhost/region/dirty_log.h"
#include "vhost/ring/ring_test_util.h"
#include "vhost/ring/virtqueue_device.h"
#include "vhost/ring/virtqueue_driver.h"

namespace vsocket::vhost {
namespace {

using testing::RingArena;
using Buf = VirtqueueDriver::Buf;

struct Range {
  uint64_t gpa, len;
};
std::vector<Range> g_marked;
void Record(int, uint64_t gpa, uint64_t len) { g_marked.push_back({gpa, len}); }

bool Marked(uint64_t gpa) {
  for (const Range& r : g_marked)
    if (gpa >= r.gpa && gpa - r.gpa < r.len) return true;
  return false;
}

class DirtyLogTest : public ::testing::TestWithParam<bool> {
 protected:
  DirtyLogTest() : arena_(8), drv_(arena_.ring, GetParam()), log_(&Record, 0, &counters_) {
    g_marked.clear();
    arena_.guest.set_log(&log_);
    dev_ = VirtqueueDevice(arena_.ring, &arena_.guest, GetParam(), 0, 0);
  }

  // The driver offers a request with a 16-byte reply buffer; the device
  // answers it the way vsocketd does (CopyIn, Push, PublishUsed) and then
  // re-arms and suppresses notifications. Returns every byte offset of the
  // arena the device changed.
  std::vector<size_t> DeviceRound(uint8_t tag) {
    Buf out{RingArena::Gpa(arena_.data), 1}, in{RingArena::Gpa(arena_.data + 64), 16};
    EXPECT_TRUE(drv_.Add({&out, 1}, {&in, 1}, tag).ok());
    drv_.Publish();
    std::vector<uint8_t> before(arena_.mem.get(), arena_.mem.get() + arena_.size);
    DescChain c;
    EXPECT_EQ(dev_.Pop(&c), PopResult::kChain);
    uint8_t reply[16];
    std::memset(reply, tag, sizeof(reply));
    EXPECT_EQ(c.CopyIn(reply), sizeof(reply));
    dev_.Push(c.head, sizeof(reply));
    dev_.PublishUsed();
    dev_.EnableNotify();
    dev_.DisableNotify();
    std::vector<size_t> changed;
    for (size_t i = 0; i < arena_.size; ++i)
      if (arena_.mem.get()[i] != before[i]) changed.push_back(i);
    EXPECT_TRUE(drv_.PopUsed().has_value());
    return changed;
  }

  RingArena arena_;
  VirtqueueDriver drv_;
  DirtyLogCounters counters_;
  DirtyLog log_;
  VirtqueueDevice dev_;
};

TEST_P(DirtyLogTest, OffMarksNothing) {
  for (uint8_t t = 1; t < 20; ++t) DeviceRound(t);
  EXPECT_TRUE(g_marked.empty());
  EXPECT_EQ(counters_.bytes.load(), 0u);
}

TEST_P(DirtyLogTest, OnMarksEveryByteTheDeviceWrites) {
  log_.Set(true);
  size_t changed_total = 0;
  // Twenty rounds: the used ring wraps twice, every slot is written.
  for (uint8_t t = 1; t < 20; ++t) {
    std::vector<size_t> changed = DeviceRound(t);
    changed_total += changed.size();
    for (size_t off : changed)
      EXPECT_TRUE(Marked(RingArena::Gpa(arena_.mem.get() + off))) << "byte at arena offset " << off << " not marked";
  }
  EXPECT_GT(changed_total, 19u * 16);  // the replies at least
  EXPECT_EQ(counters_.writes.load(), g_marked.size());
}

TEST_P(DirtyLogTest, LogOffAgainStopsMarking) {
  log_.Set(true);
  DeviceRound(1);
  size_t n = g_marked.size();
  EXPECT_GT(n, 0u);
  log_.Set(false);
  DeviceRound(2);
  EXPECT_EQ(g_marked.size(), n);
}

INSTANTIATE_TEST_SUITE_P(EventIdx, DirtyLogTest, ::testing::Bool());

}  // namespace
}  // namespace vsocket::vhost
