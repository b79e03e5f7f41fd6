#include "host-backend/request_service.h"

#include <array>

#include "base/log.h"
#include "proto/control.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {

using proto::Message;
using proto::MsgType;

namespace {

constexpr uint32_t kMaxConns = 4096;

const proto::Error kBadMessageError{0, proto::WireError::kBadMessage, proto::Reason::kProtocolError};
constexpr uint32_t kMaxOutstanding = 64;

}  // namespace

constinit const RequestService::RequestHandler RequestService::kRequestHandlers[] = {
    {MsgType::kHello, &RequestService::OnHello},
    {MsgType::kEcho, &RequestService::OnEcho},
    {MsgType::kVouch, &RequestService::OnVouch},
    {MsgType::kLimitMemory, &RequestService::OnLimitMemory},
};

uint32_t RequestService::HandleRequest(vhost::BackendDevice& device, const vhost::DescChain& chain,
                                       RequestTaker& taker) {
  std::array<uint8_t, proto::kMaxMessageSize> in;
  size_t n = chain.CopyOut(in);
  auto req = proto::Decode({in.data(), n});

  Message resp;
  if (!req.ok()) {
    counters_.bad_messages.fetch_add(1, std::memory_order_relaxed);
    device.counters().bad_messages.fetch_add(1, std::memory_order_relaxed);
    VS_LOG(kDebug, "device %lu: %s", static_cast<unsigned long>(device.id()), req.status().ToString().c_str());
    resp = {MsgType::kError, 0, kBadMessageError};
  } else if (Dispatch(device, *req, &resp, taker) == RequestResult::kNoReply || taker.taken()) {
    return 0;  // fire-and-forget message (or one returned before it acted): empty used entry
  }
  std::array<uint8_t, proto::kMaxMessageSize> out;
  auto len = proto::Encode(resp, out);
  if (!len.ok() || *len > chain.writable_bytes) return 0;  // no room: empty reply
  return static_cast<uint32_t>(chain.CopyIn({out.data(), *len}));
}

RequestResult RequestService::Dispatch(vhost::BackendDevice& device, const Message& req, Message* reply,
                                       RequestTaker& taker) {
  for (const RequestHandler& h : kRequestHandlers)
    if (h.type == req.type) return (this->*h.handle)(device, req, reply);
  if (ConnManager::Serves(req.type)) return conns_.Handle(device, req, reply, &taker);
  counters_.bad_messages.fetch_add(1, std::memory_order_relaxed);
  *reply = {MsgType::kError, req.request_id, kBadMessageError};
  return RequestResult::kReply;
}

RequestResult RequestService::OnHello(vhost::BackendDevice& device, const Message& req, Message* reply) {
  counters_.hellos.fetch_add(1, std::memory_order_relaxed);
  const auto& hello = std::get<proto::Hello>(req.body);
  proto::HelloAck ack{proto::WireError::kOk, static_cast<uint32_t>(device.id()), kMaxConns, kMaxOutstanding, 0};
  if (hello.abi_major != proto::kControlVersion) ack.status = proto::WireError::kUnsupportedVersion;
  else ack.features = conns_.OnHello(device, hello.features);
  // The VM's agent asks on each of its functions; only the one QEMU
  // attached to the port's agent socket is told it is the authority.
  if (ack.status == proto::WireError::kOk && device.authority() && (hello.features & proto::kFeatureProofAuthority))
    ack.features |= proto::kFeatureProofAuthority;
  *reply = {MsgType::kHelloAck, req.request_id, ack};
  return RequestResult::kReply;
}

RequestResult RequestService::OnEcho(vhost::BackendDevice&, const Message& req, Message* reply) {
  const auto& echo = std::get<proto::Echo>(req.body);
  uint32_t crc = proto::Crc32c(echo.payload);
  if (crc != echo.checksum) {
    counters_.checksum_errors.fetch_add(1, std::memory_order_relaxed);
    *reply = {MsgType::kError, req.request_id, kBadMessageError};
    return RequestResult::kReply;
  }
  counters_.echoes.fetch_add(1, std::memory_order_relaxed);
  counters_.echo_bytes.fetch_add(echo.payload.size(), std::memory_order_relaxed);
  *reply = {MsgType::kEcho, req.request_id, proto::Echo{crc, echo.payload}};
  return RequestResult::kReply;
}

// A VM's agent vouches for a socket one of its processes proved it holds
// (decision 100): recorded for the device the agent granted that process,
// exactly as a process-mode proof is recorded for its own device.
RequestResult RequestService::OnVouch(vhost::BackendDevice& device, const Message& req, Message* reply) {
  const auto& v = std::get<proto::Vouch>(req.body);
  const vhost::PortConfig& port = *device.port();
  auto refuse = [&](proto::WireError e, const char* why) {
    counters_.vouches_refused.fetch_add(1, std::memory_order_relaxed);
    VS_LOG(kWarn, "vm %s: VOUCH from device %lu refused: %s", port.vm_name.c_str(),
           static_cast<unsigned long>(device.id()), why);
    *reply = {MsgType::kRegisterAck, req.request_id, proto::RegisterAck{0, e, proto::Reason::kSpoofedAddress, 0}};
    return RequestResult::kReply;
  };
  if (!device.authority() || !port.proofs_by_agent) return refuse(proto::WireError::kBadMessage, "not the VM's agent");
  auto target = vhost::VhostBackend::Instance().DeviceWithRequestRing(&port, v.device_ring_gpa);
  if (!target) return refuse(proto::WireError::kUnknownConnection, "no running device has its request ring there");
  vhost::SocketTuple t;
  t.family = v.local.family == proto::Family::kIpv4 ? 4 : 6;
  t.local_addr = v.local.addr;
  t.peer_addr = v.peer.addr;
  t.local_port = v.local.port;
  t.peer_port = v.peer.port;
  target->proofs().Add(t);
  counters_.vouches.fetch_add(1, std::memory_order_relaxed);
  *reply = {MsgType::kRegisterAck, req.request_id, proto::RegisterAck{0, proto::WireError::kOk, proto::Reason::kNone, 0}};
  return RequestResult::kReply;
}

// A VM's agent limits the device it is about to grant a process to the
// memory it gave that function (decision 130): until then such a device
// reaches no guest memory, and from then on nothing else.
RequestResult RequestService::OnLimitMemory(vhost::BackendDevice& device, const Message& req, Message* reply) {
  const auto& l = std::get<proto::LimitMemory>(req.body);
  const vhost::PortConfig& port = *device.port();
  auto answer = [&](proto::WireError e, const std::string& why) {
    if (e != proto::WireError::kOk) {
      counters_.memory_limits_refused.fetch_add(1, std::memory_order_relaxed);
      VS_LOG(kWarn, "vm %s: LIMIT_MEMORY from device %lu refused: %s", port.vm_name.c_str(),
             static_cast<unsigned long>(device.id()), why.c_str());
    }
    *reply = {MsgType::kRegisterAck, req.request_id, proto::RegisterAck{0, e, proto::Reason::kNone, 0}};
    return RequestResult::kReply;
  };
  if (!device.authority() || !port.proofs_by_agent) return answer(proto::WireError::kBadMessage, "not the VM's agent");
  auto target = vhost::VhostBackend::Instance().DeviceWithRequestRing(&port, l.device_ring_gpa);
  if (!target) return answer(proto::WireError::kUnknownConnection, "no running device has its request ring there");
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < l.num_ranges; ++i) ranges.emplace_back(l.ranges[i].gpa, l.ranges[i].len), bytes += l.ranges[i].len;
  if (Status st = target->LimitMemory(ranges); !st.ok())
    return answer(proto::WireError::kBadRing, "device " + std::to_string(target->id()) + ": " + st.message());
  counters_.memory_limits.fetch_add(1, std::memory_order_relaxed);
  VS_LOG(kInfo, "vm %s: device %lu limited by the VM's agent to %u ranges, %lu KiB (decision 130)",
         port.vm_name.c_str(), static_cast<unsigned long>(target->id()), l.num_ranges,
         static_cast<unsigned long>(bytes >> 10));
  return answer(proto::WireError::kOk, "");
}

}  // namespace vsocket::backend
