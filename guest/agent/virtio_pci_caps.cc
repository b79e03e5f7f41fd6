#include "guest/agent/virtio_pci_caps.h"

#include <cstring>
#include <string>

namespace vsocket::agent {
namespace {

constexpr uint8_t kCapVendor = 0x09;
constexpr uint8_t kCommonCfg = 1, kNotifyCfg = 2, kIsrCfg = 3, kDeviceCfg = 4;
constexpr size_t kStatus = 0x06, kCapPointer = 0x34;
constexpr uint16_t kStatusCapList = 1 << 4;
constexpr size_t kVirtioCapLen = 16, kNotifyCapLen = 20;
constexpr int kMaxBar = 5;

uint32_t Le32(std::span<const uint8_t> c, size_t at) {
  uint32_t v;
  std::memcpy(&v, c.data() + at, sizeof(v));
  return v;
}

}  // namespace

Result<VirtioCaps> ParseVirtioCaps(std::span<const uint8_t> config) {
  if (config.size() < 256) return Status(Code::kInvalidArgument, "config space shorter than 256 bytes");
  uint16_t status = static_cast<uint16_t>(config[kStatus] | config[kStatus + 1] << 8);
  if (!(status & kStatusCapList)) return Status(Code::kNotFound, "no capability list");
  VirtioCaps caps;
  bool have_common = false, have_notify = false, have_isr = false;
  uint8_t ptr = config[kCapPointer] & 0xfc;
  for (int seen = 0; ptr != 0; ++seen) {
    // 48 capabilities of 4 bytes fill the 192 bytes after the header.
    if (seen > 48 || ptr < 0x40) return Status(Code::kDataLoss, "capability list loops or points into the header");
    if (ptr + 2u > config.size()) return Status(Code::kDataLoss, "capability beyond config space");
    uint8_t id = config[ptr], next = config[ptr + 1] & 0xfc;
    if (id == kCapVendor) {
      if (ptr + kVirtioCapLen > config.size() || config[ptr + 2] < kVirtioCapLen)
        return Status(Code::kDataLoss, "virtio capability at " + std::to_string(ptr) + " is cut short");
      uint8_t type = config[ptr + 3];
      VirtioCap cap{config[ptr + 4], Le32(config, ptr + 8), Le32(config, ptr + 12)};
      if (type >= kCommonCfg && type <= kDeviceCfg && cap.bar > kMaxBar)
        return Status(Code::kDataLoss, "virtio capability names BAR " + std::to_string(cap.bar));
      // The spec lets a device repeat a type; the driver takes the first.
      if (type == kCommonCfg && !have_common) {
        caps.common = cap;
        have_common = true;
      } else if (type == kNotifyCfg && !have_notify) {
        if (ptr + kNotifyCapLen > config.size() || config[ptr + 2] < kNotifyCapLen)
          return Status(Code::kDataLoss, "notify capability is cut short");
        caps.notify = cap;
        caps.notify_off_multiplier = Le32(config, ptr + 16);
        have_notify = true;
      } else if (type == kIsrCfg && !have_isr) {
        caps.isr = cap;
        have_isr = true;
      } else if (type == kDeviceCfg && !caps.device) {
        caps.device = cap;
      }
    }
    ptr = next;
  }
  if (!have_common || !have_notify || !have_isr)
    return Status(Code::kNotFound, "not a modern virtio device (common, notify or ISR capability missing)");
  return caps;
}

}  // namespace vsocket::agent
