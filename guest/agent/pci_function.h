// A PCI function owned from user space through uio_pci_generic (decision
// 84): found and bound through sysfs, its config space read and written
// through sysfs, its memory BARs mapped from sysfs resource files, its
// legacy interrupt (INTx) delivered on /dev/uioN.
//
// Needs root (config writes, driver binding) and the uio_pci_generic module.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"

namespace vsocket::agent {

// One mapped memory BAR.
class BarMapping {
 public:
  BarMapping() = default;
  BarMapping(uint8_t* base, size_t size) : base_(base), size_(size) {}
  BarMapping(BarMapping&& o) noexcept : base_(o.base_), size_(o.size_) { o.base_ = nullptr; }
  BarMapping& operator=(BarMapping&& o) noexcept;
  BarMapping(const BarMapping&) = delete;
  BarMapping& operator=(const BarMapping&) = delete;
  ~BarMapping();
  uint8_t* base() const { return base_; }
  size_t size() const { return size_; }

 private:
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

// The MAC prefix that marks a virtio-net-pci function as vSocket's
// (decision 119): QEMU `-device virtio-net-pci,...,mac=02:76:73:..`.
inline constexpr char kVsocketMacPrefix[] = "02:76:73";

// Which modern virtio-net functions (1af4:1041) of the VM are vSocket's
// (decision 119): one the guest's network driver did not take (no driver,
// virtio-pci with no driver on its virtio device, or uio_pci_generic: the
// image kept it for the agent), or one whose network
// interface's MAC starts with `mac_prefix` ("" takes every function). An
// ordinary virtio-net NIC of the VM is never taken. `skipped` says why each
// other function was left alone.
struct FunctionChoice {
  std::vector<std::string> vsocket;  // sorted BDFs
  std::vector<std::string> skipped;  // "BDF: why"
};

class PciFunction {
 public:
  // The functions (BDFs, "0000:00:04.0") with this vendor:device id, sorted.
  // `devices` is sysfs's /sys/bus/pci/devices/ (another root in tests).
  static std::vector<std::string> Find(uint16_t vendor, uint16_t device,
                                       const std::string& devices = "/sys/bus/pci/devices/");
  static FunctionChoice FindVsocket(const std::string& mac_prefix,
                                    const std::string& devices = "/sys/bus/pci/devices/");
  // FindVsocket's functions, each one left alone logged on stderr
  // ("vsocket-guestd: left alone: ..."); kNotFound naming the rule if none.
  static Result<std::vector<std::string>> VsocketFunctions(const std::string& mac_prefix);
  // Unbinds `bdf` from whatever driver has it (virtio-pci, virtio_net's),
  // binds it to uio_pci_generic (driver_override) and opens it.
  static Result<PciFunction> BindToUio(const std::string& bdf);

  const std::string& bdf() const { return bdf_; }
  // Config space (first 256 bytes: the capabilities live there).
  Result<std::vector<uint8_t>> ReadConfig() const;
  Status WriteConfig16(uint32_t offset, uint16_t value) const;
  // Turns on memory decoding and bus mastering (DMA: the device's rings are
  // in guest memory; vhost-user does not look at the bit, an emulated
  // device or an IOMMU would).
  Status EnableMemoryAndBusMaster() const;
  Result<BarMapping> MapBar(int bar) const;

  // INTx through uio: Unmask() lets the next interrupt through (the
  // handler masked it); Wait()
  // returns true if one came within timeout_ms (it stays masked until the
  // next Unmask()).
  Status Unmask() const;
  Result<bool> Wait(int timeout_ms) const;
  // Readable when an interrupt came (read 4 bytes: the count).
  int uio_fd() const { return uio_.get(); }

 private:
  PciFunction(std::string bdf, UniqueFd config, UniqueFd uio)
      : bdf_(std::move(bdf)), config_(std::move(config)), uio_(std::move(uio)) {}
  std::string bdf_;
  UniqueFd config_;
  UniqueFd uio_;
};

}  // namespace vsocket::agent
