// A virtio 1.x ("modern") PCI device driven from user space: status and
// feature negotiation, split-queue setup with guest-physical addresses,
// notifications and ISR status (virtio spec 1.2 §3.1.1, §4.1.4, §4.1.5).
// The device is QEMU's virtio-net-pci whose queues vsocketd serves over
// vhost-user; what the queues carry is vSocket's protocol, not packets.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "base/status.h"
#include "guest/agent/pci_function.h"
#include "guest/agent/virtio_pci_caps.h"

namespace vsocket::agent {

// Device status bits (spec §2.1).
inline constexpr uint8_t kStatusAcknowledge = 1, kStatusDriver = 2, kStatusDriverOk = 4, kStatusFeaturesOk = 8,
                         kStatusFailed = 128;
// ISR status bits (spec §4.1.4.5): a queue's interrupt, a configuration change.
inline constexpr uint8_t kIsrQueue = 1, kIsrConfig = 2;
// virtio-net's link status word in the device configuration (spec §5.1.4).
inline constexpr uint64_t kFeatureNetStatus = 1ull << 16;  // VIRTIO_NET_F_STATUS

class VirtioDevice {
 public:
  // Binds bdf to uio_pci_generic, maps its BARs and finds its structures.
  static Result<std::unique_ptr<VirtioDevice>> Open(const std::string& bdf);
  // Resets the device (what vhost-user sees as the device stopping).
  ~VirtioDevice();

  // Reset, then ACKNOWLEDGE | DRIVER, then accepts `wanted` & what the
  // device offers, which must include `required`; FEATURES_OK checked.
  // Returns the accepted features.
  Result<uint64_t> Negotiate(uint64_t wanted, uint64_t required);
  uint16_t num_queues() const;
  // The largest size the device allows for queue q (0: no such queue).
  uint16_t QueueMaxSize(uint16_t q) const;
  // Places queue q's three parts at these guest-physical addresses and
  // enables it (spec §4.1.5.1.3); no MSI-X vector (INTx through uio).
  Status SetUpQueue(uint16_t q, uint16_t size, uint64_t desc_gpa, uint64_t avail_gpa, uint64_t used_gpa);
  // DRIVER_OK: QEMU starts the vhost-user device (vsocketd sees it).
  Status DriverOk();
  // Stops and starts a running device's queues without a reset: DRIVER_OK
  // cleared, any interrupt acknowledged and INTx enabled, DRIVER_OK set
  // again. QEMU stops its vhost-user device and starts it afresh with the
  // rings and indices as they were (vsocketd: a pause and a resume,
  // decision 123), and with INTx enabled now it gives vsocketd a call
  // eventfd again (decision 129). The spec has a driver never clear a
  // status bit; QEMU takes it as the stop it is.
  Status RestartQueues();
  void Notify(uint16_t q);
  // Reading the ISR status acknowledges the interrupt (deasserts INTx).
  uint8_t ReadIsr();
  // virtio-net's link (VIRTIO_NET_S_LINK_UP), where VIRTIO_NET_F_STATUS was
  // negotiated: QEMU takes it down when its vhost-user backend (vsocketd)
  // goes away and up when it is back, with a configuration interrupt each
  // time. nullopt without the feature (QEMU's `status=off`).
  std::optional<bool> LinkUp() const;
  uint8_t status() const;
  const PciFunction& pci() const { return pci_; }

 private:
  VirtioDevice(PciFunction pci, VirtioCaps caps) : pci_(std::move(pci)), caps_(caps) {}
  void SetStatus(uint8_t s);

  PciFunction pci_;
  VirtioCaps caps_;
  BarMapping bars_[6];
  volatile uint8_t* common_ = nullptr;
  volatile uint8_t* notify_ = nullptr;
  volatile uint8_t* isr_ = nullptr;
  volatile uint8_t* device_cfg_ = nullptr;  // virtio-net's configuration, if it has the status word
  uint64_t accepted_ = 0;
  uint16_t notify_off_[64] = {};  // per queue, read at setup
};

}  // namespace vsocket::agent
