#include "guest/agent/virtio_device.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

namespace vsocket::agent {
namespace {

// struct virtio_pci_common_cfg (spec §4.1.4.3).
enum CommonCfg : uint32_t {
  kDeviceFeatureSelect = 0,
  kDeviceFeature = 4,
  kDriverFeatureSelect = 8,
  kDriverFeature = 12,
  kConfigMsixVector = 16,
  kNumQueues = 18,
  kDeviceStatus = 20,
  kQueueSelect = 22,
  kQueueSize = 24,
  kQueueMsixVector = 26,
  kQueueEnable = 28,
  kQueueNotifyOff = 30,
  kQueueDesc = 32,
  kQueueDriver = 40,
  kQueueDevice = 48,
  kCommonCfgBytes = 56,
};
constexpr uint16_t kNoVector = 0xffff;
// struct virtio_net_config (spec §5.1.4): mac[6], then status.
constexpr uint32_t kNetConfigStatus = 6, kNetConfigStatusEnd = 8;
constexpr uint16_t kNetStatusLinkUp = 1;

// MMIO: each access is one load or store of its width, in program order
// (volatile is for device registers, not for synchronization with threads).
template <typename T>
T Read(volatile uint8_t* base, uint32_t off) {
  return *reinterpret_cast<volatile T*>(base + off);
}
template <typename T>
void Write(volatile uint8_t* base, uint32_t off, T v) {
  *reinterpret_cast<volatile T*>(base + off) = v;
}
// 64-bit fields as two 32-bit writes, low half first (spec §4.1.3.1).
void Write64(volatile uint8_t* base, uint32_t off, uint64_t v) {
  Write<uint32_t>(base, off, static_cast<uint32_t>(v));
  Write<uint32_t>(base, off + 4, static_cast<uint32_t>(v >> 32));
}

}  // namespace

Result<std::unique_ptr<VirtioDevice>> VirtioDevice::Open(const std::string& bdf) {
  auto pci = PciFunction::BindToUio(bdf);
  if (!pci.ok()) return pci.status();
  auto config = pci->ReadConfig();
  if (!config.ok()) return config.status();
  auto caps = ParseVirtioCaps(*config);
  if (!caps.ok()) return caps.status();
  VS_RETURN_IF_ERROR(pci->EnableMemoryAndBusMaster());
  std::unique_ptr<VirtioDevice> d(new VirtioDevice(std::move(pci).value(), *caps));
  auto locate = [&](const VirtioCap& c, uint32_t min_len, const char* what) -> Result<volatile uint8_t*> {
    if (d->bars_[c.bar].base() == nullptr) {
      auto m = d->pci_.MapBar(c.bar);
      if (!m.ok()) return m.status();
      d->bars_[c.bar] = std::move(m).value();
    }
    const BarMapping& b = d->bars_[c.bar];
    if (c.length < min_len || c.offset > b.size() || c.length > b.size() - c.offset)
      return Status(Code::kDataLoss, std::string(what) + " structure does not fit its BAR");
    return static_cast<volatile uint8_t*>(b.base() + c.offset);
  };
  auto common = locate(d->caps_.common, kCommonCfgBytes, "common configuration");
  if (!common.ok()) return common.status();
  auto notify = locate(d->caps_.notify, 2, "notification");
  if (!notify.ok()) return notify.status();
  auto isr = locate(d->caps_.isr, 1, "ISR");
  if (!isr.ok()) return isr.status();
  d->common_ = *common;
  d->notify_ = *notify;
  d->isr_ = *isr;
  // virtio-net's configuration: mac[6], then the 16-bit status (§5.1.4).
  if (d->caps_.device) {
    auto cfg = locate(*d->caps_.device, kNetConfigStatusEnd, "device configuration");
    if (cfg.ok()) d->device_cfg_ = *cfg;  // (shorter: no status word, no link to watch)
  }
  return d;
}

VirtioDevice::~VirtioDevice() {
  if (common_ != nullptr) SetStatus(0);
}

uint8_t VirtioDevice::status() const { return Read<uint8_t>(common_, kDeviceStatus); }

void VirtioDevice::SetStatus(uint8_t s) { Write<uint8_t>(common_, kDeviceStatus, s); }

Result<uint64_t> VirtioDevice::Negotiate(uint64_t wanted, uint64_t required) {
  // Reset; the device says it is done by reading back 0 (spec §4.1.4.3.2).
  SetStatus(0);
  for (int i = 0; status() != 0; ++i) {
    if (i > 1000) return Status(Code::kDeadlineExceeded, "device did not reset");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  SetStatus(kStatusAcknowledge);
  SetStatus(kStatusAcknowledge | kStatusDriver);
  uint64_t offered = 0;
  for (uint32_t sel = 0; sel < 2; ++sel) {
    Write<uint32_t>(common_, kDeviceFeatureSelect, sel);
    offered |= static_cast<uint64_t>(Read<uint32_t>(common_, kDeviceFeature)) << (32 * sel);
  }
  if ((offered & required) != required) {
    SetStatus(kStatusFailed);
    char buf[128];
    snprintf(buf, sizeof(buf), "device offers features %#llx, lacks %#llx", static_cast<unsigned long long>(offered),
             static_cast<unsigned long long>(required & ~offered));
    return Status(Code::kFailedPrecondition, buf);
  }
  uint64_t accepted = offered & wanted;
  accepted_ = accepted;
  for (uint32_t sel = 0; sel < 2; ++sel) {
    Write<uint32_t>(common_, kDriverFeatureSelect, sel);
    Write<uint32_t>(common_, kDriverFeature, static_cast<uint32_t>(accepted >> (32 * sel)));
  }
  SetStatus(kStatusAcknowledge | kStatusDriver | kStatusFeaturesOk);
  if (!(status() & kStatusFeaturesOk)) {
    SetStatus(kStatusFailed);
    return Status(Code::kFailedPrecondition, "device refused FEATURES_OK");
  }
  // INTx, not MSI-X: no configuration-change vector.
  Write<uint16_t>(common_, kConfigMsixVector, kNoVector);
  return accepted;
}

uint16_t VirtioDevice::num_queues() const { return Read<uint16_t>(common_, kNumQueues); }

uint16_t VirtioDevice::QueueMaxSize(uint16_t q) const {
  Write<uint16_t>(common_, kQueueSelect, q);
  return Read<uint16_t>(common_, kQueueSize);
}

Status VirtioDevice::SetUpQueue(uint16_t q, uint16_t size, uint64_t desc_gpa, uint64_t avail_gpa,
                                uint64_t used_gpa) {
  if (q >= num_queues() || q >= sizeof(notify_off_) / sizeof(notify_off_[0]))
    return Status(Code::kOutOfRange, "device has no queue " + std::to_string(q));
  Write<uint16_t>(common_, kQueueSelect, q);
  uint16_t max = Read<uint16_t>(common_, kQueueSize);
  if (size == 0 || size > max || (size & (size - 1)) != 0)
    return Status(Code::kOutOfRange, "queue " + std::to_string(q) + ": size " + std::to_string(size) +
                                         " (device allows up to " + std::to_string(max) + ")");
  Write<uint16_t>(common_, kQueueSize, size);
  Write<uint16_t>(common_, kQueueMsixVector, kNoVector);
  Write64(common_, kQueueDesc, desc_gpa);
  Write64(common_, kQueueDriver, avail_gpa);
  Write64(common_, kQueueDevice, used_gpa);
  uint16_t off = Read<uint16_t>(common_, kQueueNotifyOff);
  uint64_t at = static_cast<uint64_t>(off) * caps_.notify_off_multiplier;
  if (at + 2 > caps_.notify.length)
    return Status(Code::kDataLoss, "queue " + std::to_string(q) + ": notify offset beyond the notify structure");
  notify_off_[q] = off;
  Write<uint16_t>(common_, kQueueEnable, 1);
  return Status::Ok();
}

Status VirtioDevice::DriverOk() {
  SetStatus(kStatusAcknowledge | kStatusDriver | kStatusFeaturesOk | kStatusDriverOk);
  uint8_t s = status();
  if (s & kStatusFailed || !(s & kStatusDriverOk))
    return Status(Code::kFailedPrecondition, "device status after DRIVER_OK: " + std::to_string(s));
  return Status::Ok();
}

Status VirtioDevice::RestartQueues() {
  uint8_t s = status();
  if ((s & kStatusFailed) || !(s & kStatusDriverOk))
    return Status(Code::kFailedPrecondition, "device not running (status " + std::to_string(s) + ")");
  SetStatus(static_cast<uint8_t>(s & ~kStatusDriverOk));  // QEMU stops vhost before this write returns
  // Stopped: nothing interrupts until DRIVER_OK (the ISR read clears what
  // the stop flushed), so INTx is still enabled when QEMU looks at it.
  (void)ReadIsr();
  VS_RETURN_IF_ERROR(pci_.Unmask());
  SetStatus(s);
  if (uint8_t now = status(); now != s)
    return Status(Code::kFailedPrecondition, "device status after DRIVER_OK again: " + std::to_string(now));
  return Status::Ok();
}

void VirtioDevice::Notify(uint16_t q) {
  // The write that QEMU's ioeventfd turns into vsocketd's kick (vhost-user
  // SET_VRING_KICK). Pairs with the device's read of avail->idx after the
  // kick: the ring's publish (VirtqueueDriver::Publish) must be visible
  // before the doorbell store, hence the full fence (virtio_ring.c's
  // virtio_mb before the notify).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  Write<uint16_t>(notify_, static_cast<uint32_t>(notify_off_[q] * caps_.notify_off_multiplier), q);
}

uint8_t VirtioDevice::ReadIsr() { return Read<uint8_t>(isr_, 0); }

std::optional<bool> VirtioDevice::LinkUp() const {
  if (device_cfg_ == nullptr || !(accepted_ & kFeatureNetStatus)) return std::nullopt;
  return (Read<uint16_t>(device_cfg_, kNetConfigStatus) & kNetStatusLinkUp) != 0;
}

}  // namespace vsocket::agent
