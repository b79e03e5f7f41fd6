#include "host-backend/control_service.h"

#include <array>

#include "base/log.h"
#include "proto/control.h"

namespace vsocket::backend {

using proto::Message;
using proto::MsgType;

namespace {

constexpr uint32_t kMaxConns = 4096;

const proto::Error kBadMessageError{0, proto::WireError::kBadMessage, proto::Reason::kProtocolError};
constexpr uint32_t kMaxOutstanding = 64;

}  // namespace

uint32_t ControlService::HandleRequest(vhost::BackendDevice& device,
                                       const vhost::DescChain& chain) {
  std::array<uint8_t, proto::kMaxMessageSize> in;
  size_t n = chain.CopyOut(in);
  auto req = proto::Decode({in.data(), n});

  Message resp;
  if (!req.ok()) {
    counters_.bad_messages.fetch_add(1, std::memory_order_relaxed);
    device.counters().bad_messages.fetch_add(1, std::memory_order_relaxed);
    VS_LOG(kDebug, "device %lu: %s", static_cast<unsigned long>(device.id()),
           req.status().ToString().c_str());
    resp = {MsgType::kError, 0, kBadMessageError};
  } else {
    resp.request_id = req->request_id;
    switch (req->type) {
      case MsgType::kHello: {
        counters_.hellos.fetch_add(1, std::memory_order_relaxed);
        const auto& hello = std::get<proto::Hello>(req->body);
        proto::HelloAck ack{proto::WireError::kOk, static_cast<uint32_t>(device.id()), kMaxConns,
                            kMaxOutstanding, 0};
        if (hello.abi_major != proto::kControlVersion) ack.status = proto::WireError::kUnsupportedVersion;
        else ack.features = conns_.OnHello(device, hello.features);
        resp.type = MsgType::kHelloAck;
        resp.body = ack;
        break;
      }
      case MsgType::kEcho: {
        const auto& echo = std::get<proto::Echo>(req->body);
        uint32_t crc = proto::Crc32c(echo.payload);
        if (crc != echo.checksum) {
          counters_.checksum_errors.fetch_add(1, std::memory_order_relaxed);
          resp.type = MsgType::kError;
          resp.body = kBadMessageError;
          break;
        }
        counters_.echoes.fetch_add(1, std::memory_order_relaxed);
        counters_.echo_bytes.fetch_add(echo.payload.size(), std::memory_order_relaxed);
        resp.type = MsgType::kEcho;
        resp.body = proto::Echo{crc, echo.payload};
        break;
      }
      case MsgType::kRegisterConn:
      case MsgType::kUnregister:
      case MsgType::kFence:
      case MsgType::kTxTail:
      case MsgType::kConsumed:
      case MsgType::kPairingQuery:
      case MsgType::kShutdown: {
        auto r = conns_.Handle(device, *req);
        if (!r) return 0;  // fire-and-forget message: empty used entry
        resp = *r;
        break;
      }
      default:
        counters_.bad_messages.fetch_add(1, std::memory_order_relaxed);
        resp.type = MsgType::kError;
        resp.body = kBadMessageError;
        break;
    }
  }
  std::array<uint8_t, proto::kMaxMessageSize> out;
  auto len = proto::Encode(resp, out);
  if (!len.ok() || *len > chain.writable_bytes) return 0;  // no room: empty reply
  return static_cast<uint32_t>(chain.CopyIn({out.data(), *len}));
}

}  // namespace vsocket::backend
