// The virtio 1.x PCI capabilities (virtio spec 1.2 §4.1.4): where in which
// BAR the common configuration, notifications, ISR status and device
// configuration live. Parsed from a config-space snapshot, so the parser is
// tested on plain bytes (virtio_pci_caps_test.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "base/status.h"

namespace vsocket::agent {

struct VirtioCap {
  uint8_t bar = 0;
  uint32_t offset = 0;
  uint32_t length = 0;
};

struct VirtioCaps {
  VirtioCap common;
  VirtioCap notify;
  uint32_t notify_off_multiplier = 0;
  VirtioCap isr;
  std::optional<VirtioCap> device;  // virtio-net has one; unused here
};

// Walks the capability list of a 256-byte config space. Every pointer and
// length is checked (the list is the device's word, and loops are refused).
// kNotFound if a required capability (common, notify, ISR) is missing: not a
// modern virtio device.
Result<VirtioCaps> ParseVirtioCaps(std::span<const uint8_t> config);

}  // namespace vsocket::agent
