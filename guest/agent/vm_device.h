// The VM's vSocket device as the agent drives it: the virtio-net-pci
// function QEMU attached to vsocketd, its two queues laid out in DMA memory
// (queue 0 carries requests with in-chain responses, queue 1 the event
// buffers vsocketd fills: guest/core/transport.h's QueueId), and vSocket's
// control protocol over them (HELLO, ECHO).
//
// One caller at a time (the agent's main thread).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "guest/agent/dma_memory.h"
#include "guest/agent/virtio_device.h"
#include "proto/control.h"
#include "vhost/ring/virtqueue_driver.h"

namespace vsocket::agent {

struct VmDeviceOptions {
  std::string bdf;           // the PCI function; empty: the only vSocket function
  // Which functions are vSocket's when none is named (decision 119):
  // PciFunction::FindVsocket's prefix ("" takes every 1af4:1041 function).
  std::string mac_prefix = kVsocketMacPrefix;
  uint16_t queue_size = 256;  // or the device's maximum if smaller
  size_t huge_pages = 2;
  int call_timeout_ms = 10000;  // TCG guests are slow
  // false: stop after DRIVER_OK; the queues' driver side is handed to an
  // application process (grant.h), which posts buffers and says HELLO.
  bool own_session = true;
};

struct VmDeviceCounters {
  uint64_t calls = 0;
  uint64_t interrupts = 0;  // INTx seen through uio
  uint64_t polls = 0;       // waits that ended with no interrupt
};

class VmDevice {
 public:
  // Binds the function, negotiates VERSION_1 (and EVENT_IDX if offered),
  // sets the queues up, DRIVER_OK, posts the event buffers.
  static Result<std::unique_ptr<VmDevice>> Open(const VmDeviceOptions& options);

  // HELLO: opens vSocket's session on this device.
  Result<proto::HelloAck> Hello(uint64_t features);
  // ECHO: the payload travels to vsocketd and back; the answer's checksum
  // and bytes are checked.
  Status Echo(std::span<const uint8_t> payload);
  // VOUCH (this device is the VM's socket-proof authority, decision 100):
  // the device whose request descriptor table is at device_ring_gpa may
  // register local/peer once. kNotFound: vsocketd has no such device
  // running; kPermissionDenied: it does not take this device for the
  // authority.
  Status Vouch(uint64_t device_ring_gpa, const proto::Endpoint& local, const proto::Endpoint& peer);
  // LIMIT_MEMORY (the VM's authority too, decision 130): the device whose
  // request descriptor table is at device_ring_gpa may reach only `ranges`.
  // kNotFound: no such device running (yet); kFailedPrecondition: refused
  // (already limited, or ranges vsocketd will not take).
  Status LimitMemory(uint64_t device_ring_gpa, const std::vector<proto::MemRange>& ranges);

  // vsocketd says it cannot interrupt this function (proto::kUsedFlagNoCall
  // in either queue's used ring): QEMU started its device while INTx was
  // disabled and gave vsocketd no call eventfd (decisions 128, 129).
  bool BackendCannotCall() const { return queues_[0].DeviceCannotCall() || queues_[1].DeviceCannotCall(); }
  // vsocketd waits for this function's memory limit (decision 130: a device
  // new to it, e.g. after a live migration's arrival or its restart).
  bool BackendNeedsLimit() const { return queues_[0].DeviceNeedsLimit(); }
  // VirtioDevice::RestartQueues, then KickQueues.
  Status RestartQueues();
  // A notification on both queues: vsocketd looks at whatever the driver
  // published (a spurious one costs it one look).
  void KickQueues();

  const std::string& bdf() const { return dev_->pci().bdf(); }
  VirtioDevice& device() { return *dev_; }
  DmaMemory& memory() { return *mem_; }
  // Where queue q's rings are in memory() (offset from its base).
  uint64_t ring_offset(size_t q) const { return ring_offset_[q]; }
  // Queue q's descriptor table's guest-physical address (what vsocketd
  // names this device by in a VOUCH).
  uint64_t ring_gpa(size_t q) const { return mem_->Gpa(mem_->base() + ring_offset_[q]); }
  uint64_t features() const { return features_; }
  uint16_t queue_size() const { return queue_size_; }
  const VmDeviceCounters& counters() const { return counters_; }

 private:
  VmDevice() = default;
  Status Start(const VmDeviceOptions& options);
  // Sends m and waits for the in-chain answer.
  Result<proto::Message> Call(const proto::Message& m);
  // Sends m (VOUCH, LIMIT_MEMORY: `what`) and returns the status of the
  // REGISTER_ACK that answers it.
  Result<proto::WireError> CallForAck(const proto::Message& m, const char* what);
  // Waits for a used entry on queue q: interrupts through uio, and a look
  // at the ring every 50 ms in case one was missed.
  Result<vhost::VirtqueueDriver::Used> WaitUsed(size_t q);

  // Destruction order (last member first): the device's reset stops
  // vsocketd's side before the huge pages its rings are in go back to the
  // kernel (vsocketd must never write into memory reused for something else).
  std::unique_ptr<DmaMemory> mem_;
  std::unique_ptr<VirtioDevice> dev_;
  vhost::VirtqueueDriver queues_[2];
  uint64_t ring_offset_[2] = {};
  uint8_t* req_ = nullptr;
  uint8_t* resp_ = nullptr;
  std::vector<uint8_t*> event_bufs_;
  uint64_t features_ = 0;
  uint16_t queue_size_ = 0;
  uint32_t next_request_id_ = 1;
  int call_timeout_ms_ = 10000;
  VmDeviceCounters counters_;
};

}  // namespace vsocket::agent
