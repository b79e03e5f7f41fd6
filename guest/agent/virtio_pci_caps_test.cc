#include "guest/agent/virtio_pci_caps.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace vsocket::agent {
namespace {

// A config space with the capability list QEMU gives virtio-net-pci with
// disable-legacy=on, vectors=0: common/ISR/device/notify in BAR 4.
class Config {
 public:
  Config() : c_(256, 0) {
    c_[0x06] = 1 << 4;  // status: capability list
  }
  // Appends a virtio capability at `at` (linking it after the last one).
  Config& Cap(uint8_t at, uint8_t type, uint8_t bar, uint32_t off, uint32_t len, uint32_t mult = 0) {
    uint8_t cap_len = type == 2 ? 20 : 16;
    c_[at] = 0x09;
    c_[at + 2] = cap_len;
    c_[at + 3] = type;
    c_[at + 4] = bar;
    std::memcpy(&c_[at + 8], &off, 4);
    std::memcpy(&c_[at + 12], &len, 4);
    if (type == 2) std::memcpy(&c_[at + 16], &mult, 4);
    Link(at);
    return *this;
  }
  Config& Other(uint8_t at, uint8_t id) {
    c_[at] = id;
    Link(at);
    return *this;
  }
  std::vector<uint8_t>& bytes() { return c_; }

 private:
  void Link(uint8_t at) {
    if (last_ == 0) c_[0x34] = at;
    else c_[last_ + 1] = at;
    last_ = at;
  }
  std::vector<uint8_t> c_;
  uint8_t last_ = 0;
};

TEST(VirtioPciCapsTest, FindsEveryStructureOfQemusVirtioNet) {
  Config c;
  c.Other(0x40, 0x05)  // MSI, skipped
      .Cap(0x84, 1, 4, 0x0000, 0x1000)
      .Cap(0x70, 3, 4, 0x1000, 0x1000)
      .Cap(0x60, 4, 4, 0x2000, 0x1000)
      .Cap(0xa0, 2, 4, 0x3000, 0x1000, 4);
  auto caps = ParseVirtioCaps(c.bytes());
  ASSERT_TRUE(caps.ok()) << caps.status().ToString();
  EXPECT_EQ(caps->common.bar, 4);
  EXPECT_EQ(caps->common.offset, 0u);
  EXPECT_EQ(caps->isr.offset, 0x1000u);
  ASSERT_TRUE(caps->device.has_value());
  EXPECT_EQ(caps->device->offset, 0x2000u);
  EXPECT_EQ(caps->notify.offset, 0x3000u);
  EXPECT_EQ(caps->notify_off_multiplier, 4u);
}

TEST(VirtioPciCapsTest, ALegacyOnlyDeviceIsNotModern) {
  Config c;
  c.Other(0x40, 0x05);
  auto caps = ParseVirtioCaps(c.bytes());
  EXPECT_EQ(caps.status().code(), Code::kNotFound);
}

TEST(VirtioPciCapsTest, ALoopingListIsRefused) {
  Config c;
  c.Cap(0x40, 1, 4, 0, 0x1000).Cap(0x50, 3, 4, 0x1000, 0x1000);
  c.bytes()[0x51] = 0x40;  // back to the first
  auto caps = ParseVirtioCaps(c.bytes());
  EXPECT_EQ(caps.status().code(), Code::kDataLoss);
}

TEST(VirtioPciCapsTest, ABarBeyondFiveIsRefused) {
  Config c;
  c.Cap(0x40, 1, 7, 0, 0x1000).Cap(0x50, 3, 4, 0x1000, 0x1000).Cap(0x60, 2, 4, 0x3000, 0x1000, 4);
  EXPECT_EQ(ParseVirtioCaps(c.bytes()).status().code(), Code::kDataLoss);
}

TEST(VirtioPciCapsTest, ACutShortNotifyCapabilityIsRefused) {
  Config c;
  c.Cap(0x40, 1, 4, 0, 0x1000).Cap(0x50, 3, 4, 0x1000, 0x1000).Cap(0x60, 2, 4, 0x3000, 0x1000, 4);
  c.bytes()[0x62] = 16;  // cap_len too short for notify_off_multiplier
  EXPECT_EQ(ParseVirtioCaps(c.bytes()).status().code(), Code::kDataLoss);
}

}  // namespace
}  // namespace vsocket::agent
