#include "guest/agent/vm_device.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "proto/virtio_ring.h"
#include "vhost/ring/split_ring.h"

namespace vsocket::agent {
namespace {

constexpr uint16_t kVirtioVendor = 0x1af4;
constexpr uint16_t kModernNet = 0x1041;  // virtio-net, modern-only (disable-legacy=on)
constexpr size_t kMsgBytes = proto::kMaxMessageSize;
constexpr size_t kEventBufs = 16;
constexpr uint32_t kEventBufBytes = 4096;

Result<std::string> PickFunction(const std::string& asked, const std::string& mac_prefix) {
  if (!asked.empty()) return asked;
  auto found = PciFunction::VsocketFunctions(mac_prefix);
  if (!found.ok()) return found.status();
  if (found->size() > 1) {
    std::string all;
    for (const auto& f : *found) all += " " + f;
    return Status(Code::kInvalidArgument, "several 1af4:1041 functions:" + all + "; choose one with --pci");
  }
  return (*found)[0];
}

}  // namespace

Result<std::unique_ptr<VmDevice>> VmDevice::Open(const VmDeviceOptions& options) {
  std::unique_ptr<VmDevice> d(new VmDevice());
  VS_RETURN_IF_ERROR(d->Start(options));
  return d;
}

Status VmDevice::Start(const VmDeviceOptions& o) {
  call_timeout_ms_ = o.call_timeout_ms;
  auto bdf = PickFunction(o.bdf, o.mac_prefix);
  if (!bdf.ok()) return bdf.status();
  auto dev = VirtioDevice::Open(*bdf);
  if (!dev.ok()) return dev.status();
  dev_ = std::move(dev).value();
  auto mem = DmaMemory::Create(o.huge_pages);
  if (!mem.ok()) return mem.status();
  mem_ = std::move(mem).value();

  // vsocketd offers VERSION_1 and EVENT_IDX (vhost/backend); QEMU passes
  // them through and adds virtio-net's own bits, which we leave alone but
  // for STATUS: QEMU's own (never sent to vsocketd), whose link goes down
  // when vsocketd goes away (agent_server.h). ACCESS_PLATFORM is never
  // accepted: GPAs here are physical, no IOMMU.
  auto f = dev_->Negotiate(proto::kFeatureVersion1 | proto::kFeatureEventIdx | kFeatureNetStatus,
                           proto::kFeatureVersion1);
  if (!f.ok()) return f.status();
  features_ = *f;
  if (dev_->num_queues() < 2)
    return Status(Code::kFailedPrecondition, "device has " + std::to_string(dev_->num_queues()) + " queues, need 2");
  for (uint16_t q = 0; q < 2; ++q) {
    uint16_t size = std::min(o.queue_size, dev_->QueueMaxSize(q));
    if (!proto::IsValidQueueSize(size)) return Status(Code::kOutOfRange, "queue size " + std::to_string(size));
    if (q == 0) queue_size_ = size;
    uint8_t* ring_mem = mem_->Allocate(vhost::SplitRing::BytesFor(size), 4096);
    if (ring_mem == nullptr) return Status(Code::kResourceExhausted, "DMA memory too small for the rings");
    ring_offset_[q] = static_cast<uint64_t>(ring_mem - mem_->base());
    vhost::SplitRing ring = vhost::SplitRing::LayOut(ring_mem, size);
    queues_[q] = vhost::VirtqueueDriver(ring, (features_ & proto::kFeatureEventIdx) != 0);
    VS_RETURN_IF_ERROR(dev_->SetUpQueue(q, size, mem_->Gpa(ring.desc()), mem_->Gpa(ring.avail_base()),
                                        mem_->Gpa(ring.used_base())));
  }
  // INTx on before DRIVER_OK, never after: QEMU (7.2.19 and later: "vhost:
  // Don't set vring call if guest notifier is unused") gives vsocketd no
  // call eventfd for a function whose INTx is disabled when its vhost
  // device starts, and never gives one later: every interrupt of that
  // device would be lost for good. uio_pci_generic's handler leaves INTx
  // disabled after each interrupt until we unmask it, so a function reset
  // between an interrupt and its unmask (a killed agent's, or one that
  // fired during the reset) starts disabled. Nothing can interrupt between
  // here and DRIVER_OK: a reset device has no interrupt pending (the ISR
  // read clears any), queues and configuration changes interrupt only
  // once it is DRIVER_OK.
  (void)dev_->ReadIsr();
  VS_RETURN_IF_ERROR(dev_->pci().Unmask());
  if (!o.own_session) return dev_->DriverOk();
  req_ = mem_->Allocate(kMsgBytes);
  resp_ = mem_->Allocate(kMsgBytes);
  for (size_t i = 0; i < kEventBufs; ++i) event_bufs_.push_back(mem_->Allocate(kEventBufBytes));
  if (req_ == nullptr || resp_ == nullptr || event_bufs_.back() == nullptr)
    return Status(Code::kResourceExhausted, "DMA memory too small for the buffers");
  VS_RETURN_IF_ERROR(dev_->DriverOk());
  // Event buffers, as the library's session posts them.
  vhost::VirtqueueDriver& eq = queues_[1];
  for (size_t i = 0; i < kEventBufs; ++i) {
    vhost::VirtqueueDriver::Buf in{mem_->Gpa(event_bufs_[i]), kEventBufBytes};
    if (!eq.Add({}, {&in, 1}, i).ok()) return Status(Code::kInternal, "cannot post event buffers");
  }
  if (eq.Publish()) dev_->Notify(1);
  return Status::Ok();
}

Status VmDevice::RestartQueues() {
  VS_RETURN_IF_ERROR(dev_->RestartQueues());
  KickQueues();
  return Status::Ok();
}

void VmDevice::KickQueues() {
  for (uint16_t q = 0; q < 2; ++q) dev_->Notify(q);
}

Result<vhost::VirtqueueDriver::Used> VmDevice::WaitUsed(size_t q) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(call_timeout_ms_);
  vhost::VirtqueueDriver& vq = queues_[q];
  for (;;) {
    if (auto u = vq.PopUsed()) return *u;
    if (vq.broken()) return Status(Code::kDataLoss, std::string("queue broken: ") + vq.broken_reason());
    if (vq.EnableInterrupts()) continue;  // an entry landed meanwhile
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Status(Code::kDeadlineExceeded, "vsocketd did not answer (is the port served?)");
    auto irq = dev_->pci().Wait(static_cast<int>(std::min<long long>(left, 50)));
    if (!irq.ok()) return irq.status();
    if (*irq) {
      // Reading ISR deasserts the line; only then let INTx through again.
      dev_->ReadIsr();
      VS_RETURN_IF_ERROR(dev_->pci().Unmask());
      ++counters_.interrupts;
    } else {
      ++counters_.polls;
    }
  }
}

Result<proto::Message> VmDevice::Call(const proto::Message& m) {
  auto n = proto::Encode(m, {req_, kMsgBytes});
  if (!n.ok()) return n.status();
  vhost::VirtqueueDriver& rq = queues_[0];
  vhost::VirtqueueDriver::Buf out{mem_->Gpa(req_), static_cast<uint32_t>(*n)};
  vhost::VirtqueueDriver::Buf in{mem_->Gpa(resp_), static_cast<uint32_t>(kMsgBytes)};
  auto head = rq.Add({&out, 1}, {&in, 1}, m.request_id);
  if (!head.ok()) return head.status();
  if (rq.Publish()) dev_->Notify(0);
  ++counters_.calls;
  auto used = WaitUsed(0);
  if (!used.ok()) return used.status();
  if (used->cookie != m.request_id) return Status(Code::kDataLoss, "answer to another request");
  return proto::Decode({resp_, used->len});
}

Result<proto::HelloAck> VmDevice::Hello(uint64_t features) {
  proto::Hello hello;
  hello.pid = static_cast<uint32_t>(getpid());
  hello.features = features;
  auto resp = Call({proto::MsgType::kHello, next_request_id_++, hello});
  if (!resp.ok()) return resp.status();
  const auto* ack = std::get_if<proto::HelloAck>(&resp->body);
  if (resp->type != proto::MsgType::kHelloAck || ack == nullptr)
    return Status(Code::kDataLoss, std::string("HELLO answered with ") + proto::ToString(resp->type));
  if (ack->status != proto::WireError::kOk)
    return Status(Code::kFailedPrecondition, std::string("HELLO refused: ") + proto::ToString(ack->status));
  return *ack;
}

Status VmDevice::Echo(std::span<const uint8_t> payload) {
  uint32_t crc = proto::Crc32c(payload);
  auto resp = Call({proto::MsgType::kEcho, next_request_id_++, proto::Echo{crc, payload}});
  if (!resp.ok()) return resp.status();
  const auto* echo = std::get_if<proto::Echo>(&resp->body);
  if (resp->type != proto::MsgType::kEcho || echo == nullptr)
    return Status(Code::kDataLoss, std::string("ECHO answered with ") + proto::ToString(resp->type));
  if (echo->checksum != crc || echo->payload.size() != payload.size() ||
      !std::equal(payload.begin(), payload.end(), echo->payload.begin()))
    return Status(Code::kDataLoss, "ECHO came back different");
  return Status::Ok();
}

Result<proto::WireError> VmDevice::CallForAck(const proto::Message& m, const char* what) {
  auto resp = Call(m);
  if (!resp.ok()) return resp.status();
  const auto* ack = std::get_if<proto::RegisterAck>(&resp->body);
  if (resp->type != proto::MsgType::kRegisterAck || ack == nullptr)
    return Status(Code::kDataLoss, std::string(what) + " answered with " + proto::ToString(resp->type));
  return ack->status;
}

Status VmDevice::Vouch(uint64_t device_ring_gpa, const proto::Endpoint& local, const proto::Endpoint& peer) {
  auto st = CallForAck({proto::MsgType::kVouch, next_request_id_++, proto::Vouch{device_ring_gpa, local, peer}}, "VOUCH");
  if (!st.ok()) return st.status();
  switch (*st) {
    case proto::WireError::kOk: return Status::Ok();
    case proto::WireError::kUnknownConnection: return Status(Code::kNotFound, "VOUCH: vsocketd has no such device");
    default:
      return Status(Code::kPermissionDenied, std::string("VOUCH refused: ") + proto::ToString(*st));
  }
}

Status VmDevice::LimitMemory(uint64_t device_ring_gpa, const std::vector<proto::MemRange>& ranges) {
  if (ranges.empty() || ranges.size() > proto::kLimitMaxRanges)
    return Status(Code::kInvalidArgument, "LIMIT_MEMORY: " + std::to_string(ranges.size()) + " ranges");
  proto::LimitMemory l{device_ring_gpa, static_cast<uint32_t>(ranges.size()), {}};
  std::copy(ranges.begin(), ranges.end(), l.ranges.begin());
  auto st = CallForAck({proto::MsgType::kLimitMemory, next_request_id_++, l}, "LIMIT_MEMORY");
  if (!st.ok()) return st.status();
  switch (*st) {
    case proto::WireError::kOk: return Status::Ok();
    case proto::WireError::kUnknownConnection:
      return Status(Code::kNotFound, "LIMIT_MEMORY: vsocketd has no such device");
    default:
      return Status(Code::kFailedPrecondition, std::string("LIMIT_MEMORY refused: ") + proto::ToString(*st));
  }
}

}  // namespace vsocket::agent
