#include "proto/fabric.h"

#include <algorithm>
#include <string>

#include "proto/wire.h"

namespace vsocket::proto {
namespace {

Status Bad(std::string why) { return Status(Code::kDataLoss, "fabric frame: " + why); }

// Payload bytes each frame type may carry.
bool PayloadAllowed(FrameType t, uint32_t len) {
  switch (t) {
    case FrameType::kLinkHello: return len == 32;
    case FrameType::kRdmaSetup: return len == kRdmaSetupSize;
    case FrameType::kPairRequest:
    case FrameType::kPairAccept:
    case FrameType::kPairDecline: return len == kPairInfoSize;
    case FrameType::kData: return len > 0 && len <= kMaxDataFrame;
    default: return len == 0;
  }
}

void PutEndpoint(WireWriter& w, const Endpoint& e) {
  w.U8(static_cast<uint8_t>(e.family));
  w.U8(0);
  w.U16(e.port);
  w.Bytes(e.addr.data(), e.addr.size());
}

Status GetEndpoint(WireReader& r, Endpoint* e, const char* which) {
  uint8_t fam = r.U8();
  uint8_t pad = r.U8();
  e->port = r.U16();
  r.Bytes(e->addr.data(), e->addr.size());
  if (!r.ok()) return Bad("pair info truncated");
  if (fam != 4 && fam != 6) return Bad(std::string(which) + " address family is neither 4 nor 6");
  e->family = static_cast<Family>(fam);
  if (pad != 0) return Bad("reserved byte is not zero");
  if (e->family == Family::kIpv4 && std::any_of(e->addr.begin() + 4, e->addr.end(), [](uint8_t b) { return b != 0; }))
    return Bad(std::string(which) + " IPv4 address has non-zero padding");
  if (e->port == 0) return Bad(std::string(which) + " port is 0");
  return Status::Ok();
}

}  // namespace

const char* ToString(FrameType t) {
  switch (t) {
    case FrameType::kLinkHello: return "LINK_HELLO";
    case FrameType::kLinkClose: return "LINK_CLOSE";
    case FrameType::kKeepalive: return "KEEPALIVE";
    case FrameType::kLinkReady: return "LINK_READY";
    case FrameType::kRdmaSetup: return "RDMA_SETUP";
    case FrameType::kPairRequest: return "PAIR_REQUEST";
    case FrameType::kPairAccept: return "PAIR_ACCEPT";
    case FrameType::kPairReject: return "PAIR_REJECT";
    case FrameType::kPairCancel: return "PAIR_CANCEL";
    case FrameType::kPairDecline: return "PAIR_DECLINE";
    case FrameType::kData: return "DATA";
    case FrameType::kCredit: return "CREDIT";
    case FrameType::kFence: return "FENCE";
    case FrameType::kShutWr: return "SHUT_WR";
    case FrameType::kGone: return "GONE";
    case FrameType::kAbort: return "ABORT";
    case FrameType::kRelease: return "RELEASE";
    case FrameType::kDowngrade: return "DOWNGRADE";
    case FrameType::kPairConfirm: return "PAIR_CONFIRM";
    case FrameType::kFenceAck: return "FENCE_ACK";
    case FrameType::kPlacement: return "PLACEMENT";
    case FrameType::kPlacementAck: return "PLACEMENT_ACK";
  }
  return "?";
}

bool IsKnownFrameType(uint8_t t) { return (t >= 1 && t <= 5) || (t >= 10 && t <= 14) || (t >= 20 && t <= 31); }

void EncodeFrameHeader(const FrameHeader& h, uint8_t* out) {
  WireWriter w({out, kFrameHeaderSize});
  w.U16(kFabricMagic);
  w.U8(kFabricVersion);
  w.U8(static_cast<uint8_t>(h.type));
  w.U32(h.tenant);
  w.U64(h.handle);
  w.U64(h.value);
  w.U32(h.len);
  w.U32(h.aux);
}

Result<FrameHeader> DecodeFrameHeader(std::span<const uint8_t, kFrameHeaderSize> in) {
  WireReader r(in);
  if (r.U16() != kFabricMagic) return Bad("bad magic");
  if (r.U8() != kFabricVersion) return Bad("unsupported version");
  uint8_t type = r.U8();
  if (!IsKnownFrameType(type)) return Bad("unknown type " + std::to_string(type));
  FrameHeader h;
  h.type = static_cast<FrameType>(type);
  h.tenant = r.U32();
  h.handle = r.U64();
  h.value = r.U64();
  h.len = r.U32();
  h.aux = r.U32();
  if (!PayloadAllowed(h.type, h.len))
    return Bad(std::string(ToString(h.type)) + " with a payload of " + std::to_string(h.len) + " bytes");
  bool per_conn = type >= 20;
  if (per_conn && (h.handle == 0 || h.tenant == 0)) return Bad("connection frame without handle or tenant");
  if (h.type == FrameType::kPairRequest && (h.tenant == 0 || h.value == 0))
    return Bad("PAIR_REQUEST without tenant or handle");
  if (h.type == FrameType::kPairDecline && (h.tenant == 0 || h.handle != 0 || h.value != 0))
    return Bad("PAIR_DECLINE without tenant, or with a handle");
  if (h.type == FrameType::kShutWr && h.aux != 0 &&
      ((h.aux & 0xff) != kShutRingEnd || (h.aux >> 8) == 0 || !IsWireReason(h.aux >> 8)))
    return Bad("unknown SHUT_WR flags");
  if (h.type == FrameType::kDowngrade || h.type == FrameType::kPairReject || h.type == FrameType::kPairDecline) {
    if (!IsWireReason(h.aux)) return Bad("unknown reason code");
  }
  return h;
}

void EncodePairInfo(const PairInfo& p, uint8_t* out) {
  WireWriter w({out, kPairInfoSize});
  PutEndpoint(w, p.local);
  PutEndpoint(w, p.peer);
  w.U8(static_cast<uint8_t>(p.role));
  w.Zeros(3);
  w.U64(p.rx_addr);
  w.U32(p.rx_rkey);
}

Result<PairInfo> DecodePairInfo(std::span<const uint8_t> in) {
  if (in.size() != kPairInfoSize) return Bad("pair info has the wrong size");
  WireReader r(in);
  PairInfo p;
  VS_RETURN_IF_ERROR(GetEndpoint(r, &p.local, "local"));
  VS_RETURN_IF_ERROR(GetEndpoint(r, &p.peer, "peer"));
  uint8_t role = r.U8();
  if (role != 1 && role != 2) return Bad("bad role");
  p.role = static_cast<Role>(role);
  if (r.U8() != 0 || r.U16() != 0) return Bad("reserved bytes are not zero");
  p.rx_addr = r.U64();
  p.rx_rkey = r.U32();
  if (!r.ok()) return Bad("pair info truncated");
  if (p.local.family != p.peer.family) return Bad("mixed address families");
  return p;
}

}  // namespace vsocket::proto
