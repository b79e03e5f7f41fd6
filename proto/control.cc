#include "proto/control.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "proto/wire.h"

namespace vsocket::proto {
namespace {

// One row per message type: its body kind (variant index) and body size.
// kVariable marks the echo body, whose size is 8 + payload length.
inline constexpr uint32_t kVariable = 0xffffffff;

struct Spec {
  MsgType type;
  const char* name;
  size_t body_index;  // index into Body
  uint32_t body_size;
};

template <typename T>
constexpr size_t IndexOf() {
  return Body(T{}).index();
}

constexpr Spec kSpecs[] = {
    {MsgType::kHello, "HELLO", IndexOf<Hello>(), 16},
    {MsgType::kHelloAck, "HELLO_ACK", IndexOf<HelloAck>(), 24},
    {MsgType::kRegisterConn, "REGISTER_CONN", IndexOf<RegisterConn>(), 72},
    {MsgType::kRegisterAck, "REGISTER_ACK", IndexOf<RegisterAck>(), 16},
    {MsgType::kUpgrade, "UPGRADE", IndexOf<Upgrade>(), 16},
    {MsgType::kFence, "FENCE", IndexOf<ConnCounter>(), 16},
    {MsgType::kTxTail, "TX_TAIL", IndexOf<ConnCounter>(), 16},
    {MsgType::kRxTail, "RX_TAIL", IndexOf<ConnCounter>(), 16},
    {MsgType::kConsumed, "CONSUMED", IndexOf<ConnCounter>(), 16},
    {MsgType::kCredit, "CREDIT", IndexOf<ConnCounter>(), 16},
    {MsgType::kShutdown, "SHUTDOWN", IndexOf<Shutdown>(), 16},
    {MsgType::kDowngrade, "DOWNGRADE", IndexOf<Downgrade>(), 24},
    {MsgType::kError, "ERROR", IndexOf<Error>(), 16},
    {MsgType::kEcho, "ECHO", IndexOf<Echo>(), kVariable},
    {MsgType::kUnregister, "UNREGISTER", IndexOf<Unregister>(), 8},
    {MsgType::kPairingQuery, "PAIRING_QUERY", IndexOf<ConnCounter>(), 16},
    {MsgType::kRingsReleased, "RINGS_RELEASED", IndexOf<ConnCounter>(), 16},
    {MsgType::kFenceDelivered, "FENCE_DELIVERED", IndexOf<ConnCounter>(), 16},
    {MsgType::kDirect, "DIRECT", IndexOf<ConnCounter>(), 16},
    {MsgType::kVouch, "VOUCH", IndexOf<Vouch>(), 48},
    {MsgType::kLimitMemory, "LIMIT_MEMORY", IndexOf<LimitMemory>(), 16 + 16 * kLimitMaxRanges},
};

const Spec* FindSpec(uint8_t type) {
  for (const Spec& s : kSpecs)
    if (static_cast<uint8_t>(s.type) == type) return &s;
  return nullptr;
}

Status Bad(std::string why) { return Status(Code::kDataLoss, "control message: " + why); }

// ---- field groups ---------------------------------------------------------

void PutEndpointAddr(WireWriter& w, const Endpoint& e) { w.Bytes(e.addr.data(), e.addr.size()); }

Status CheckEndpoint(const Endpoint& e, const char* which) {
  if (e.family != Family::kIpv4 && e.family != Family::kIpv6)
    return Bad(std::string(which) + " address family is neither 4 nor 6");
  if (e.family == Family::kIpv4 && std::any_of(e.addr.begin() + 4, e.addr.end(), [](uint8_t b) { return b != 0; }))
    return Bad(std::string(which) + " IPv4 address has non-zero padding");
  if (e.port == 0) return Bad(std::string(which) + " port is 0");
  return Status::Ok();
}

Status CheckReserved(uint64_t v) { return v == 0 ? Status::Ok() : Bad("reserved field is not zero"); }

Status CheckReason(uint16_t r, Reason* out) {
  if (!IsWireReason(r)) return Bad("unknown reason code " + std::to_string(r));
  *out = static_cast<Reason>(r);
  return Status::Ok();
}

Status CheckWireError(uint16_t e, WireError* out) {
  if (e > kMaxWireError) return Bad("unknown error code " + std::to_string(e));
  *out = static_cast<WireError>(e);
  return Status::Ok();
}

// ---- bodies: encode -------------------------------------------------------

void Put(WireWriter& w, const Hello& b) {
  w.U16(b.abi_major);
  w.U16(b.abi_minor);
  w.U32(b.pid);
  w.U64(b.features);
}
void Put(WireWriter& w, const HelloAck& b) {
  w.U16(static_cast<uint16_t>(b.status));
  w.U16(0);
  w.U32(b.device_id);
  w.U32(b.max_conns);
  w.U32(b.max_outstanding);
  w.U64(b.features);
}
void Put(WireWriter& w, const RegisterConn& b) {
  w.U64(b.conn_id);
  w.U8(static_cast<uint8_t>(b.role));
  w.U8(static_cast<uint8_t>(b.local.family));
  w.U8(static_cast<uint8_t>(b.peer.family));
  w.U8(b.flags);
  w.U16(b.local.port);
  w.U16(b.peer.port);
  PutEndpointAddr(w, b.local);
  PutEndpointAddr(w, b.peer);
  w.U64(b.tx_ring_gpa);
  w.U64(b.rx_ring_gpa);
  w.U32(b.tx_ring_bytes);
  w.U32(b.rx_ring_bytes);
}
void Put(WireWriter& w, const RegisterAck& b) {
  w.U64(b.conn_id);
  w.U16(static_cast<uint16_t>(b.status));
  w.U16(static_cast<uint16_t>(b.reason));
  w.U32(b.window_bytes);
}
void Put(WireWriter& w, const Upgrade& b) {
  w.U64(b.conn_id);
  w.U32(b.peer_rx_window);
  w.U32(b.max_outstanding);
}
void Put(WireWriter& w, const ConnCounter& b) {
  w.U64(b.conn_id);
  w.U64(b.bytes);
}
void Put(WireWriter& w, const Shutdown& b) {
  w.U64(b.conn_id);
  w.U8(static_cast<uint8_t>(b.how));
  w.Zeros(7);
}
void Put(WireWriter& w, const Downgrade& b) {
  w.U64(b.conn_id);
  w.U16(static_cast<uint16_t>(b.reason));
  w.U8(b.flags);
  w.Zeros(5);
  w.U64(b.bytes_received);
}
void Put(WireWriter& w, const Error& b) {
  w.U64(b.conn_id);
  w.U16(static_cast<uint16_t>(b.code));
  w.U16(static_cast<uint16_t>(b.reason));
  w.U32(0);
}
void Put(WireWriter& w, const Echo& b) {
  w.U32(b.checksum);
  w.U32(static_cast<uint32_t>(b.payload.size()));
  w.Bytes(b.payload.data(), b.payload.size());
}
void Put(WireWriter& w, const Unregister& b) { w.U64(b.conn_id); }
void Put(WireWriter& w, const Vouch& b) {
  w.U64(b.device_ring_gpa);
  w.U8(static_cast<uint8_t>(b.local.family));
  w.U8(static_cast<uint8_t>(b.peer.family));
  w.U16(b.local.port);
  w.U16(b.peer.port);
  w.U16(0);
  PutEndpointAddr(w, b.local);
  PutEndpointAddr(w, b.peer);
}

void Put(WireWriter& w, const LimitMemory& b) {
  w.U64(b.device_ring_gpa);
  w.U32(b.num_ranges);
  w.U32(0);
  for (const MemRange& r : b.ranges) w.U64(r.gpa), w.U64(r.len);
}

// ---- bodies: decode -------------------------------------------------------

Status Get(WireReader& r, Hello* b, std::span<const uint8_t>) {
  b->abi_major = r.U16();
  b->abi_minor = r.U16();
  b->pid = r.U32();
  b->features = r.U64();
  return Status::Ok();
}
Status Get(WireReader& r, HelloAck* b, std::span<const uint8_t>) {
  uint16_t status = r.U16();
  VS_RETURN_IF_ERROR(CheckReserved(r.U16()));
  b->device_id = r.U32();
  b->max_conns = r.U32();
  b->max_outstanding = r.U32();
  b->features = r.U64();
  return CheckWireError(status, &b->status);
}
Status Get(WireReader& r, RegisterConn* b, std::span<const uint8_t>) {
  b->conn_id = r.U64();
  uint8_t role = r.U8();
  b->local.family = static_cast<Family>(r.U8());
  b->peer.family = static_cast<Family>(r.U8());
  b->flags = r.U8();
  if (b->flags & ~kKnownRegisterFlags) return Bad("unknown registration flags");
  b->local.port = r.U16();
  b->peer.port = r.U16();
  r.Bytes(b->local.addr.data(), b->local.addr.size());
  r.Bytes(b->peer.addr.data(), b->peer.addr.size());
  b->tx_ring_gpa = r.U64();
  b->rx_ring_gpa = r.U64();
  b->tx_ring_bytes = r.U32();
  b->rx_ring_bytes = r.U32();
  if (role != static_cast<uint8_t>(Role::kClient) && role != static_cast<uint8_t>(Role::kServer))
    return Bad("role is neither client nor server");
  b->role = static_cast<Role>(role);
  VS_RETURN_IF_ERROR(CheckEndpoint(b->local, "local"));
  VS_RETURN_IF_ERROR(CheckEndpoint(b->peer, "peer"));
  if (b->local.family != b->peer.family) return Bad("local and peer families differ");
  for (uint32_t size : {b->tx_ring_bytes, b->rx_ring_bytes}) {
    if (!IsValidRingSize(size))
      return Bad("ring size " + std::to_string(size) + " is not a power of two in [4 KiB, 64 MiB]");
  }
  if (b->tx_ring_gpa % 64 != 0 || b->rx_ring_gpa % 64 != 0) return Bad("ring address is not 64-byte aligned");
  return Status::Ok();
}
Status Get(WireReader& r, RegisterAck* b, std::span<const uint8_t>) {
  b->conn_id = r.U64();
  uint16_t status = r.U16();
  uint16_t reason = r.U16();
  b->window_bytes = r.U32();
  VS_RETURN_IF_ERROR(CheckWireError(status, &b->status));
  return CheckReason(reason, &b->reason);
}
Status Get(WireReader& r, Upgrade* b, std::span<const uint8_t>) {
  b->conn_id = r.U64();
  b->peer_rx_window = r.U32();
  b->max_outstanding = r.U32();
  if (b->max_outstanding == 0) return Bad("upgrade allows no outstanding descriptors");
  return Status::Ok();
}
Status Get(WireReader& r, ConnCounter* b, std::span<const uint8_t>) {
  b->conn_id = r.U64();
  b->bytes = r.U64();
  return Status::Ok();
}
Status Get(WireReader& r, Shutdown* b, std::span<const uint8_t>) {
  b->conn_id = r.U64();
  uint8_t how = r.U8();
  uint64_t pad = 0;
  for (int i = 0; i < 7; ++i) pad |= r.U8();
  VS_RETURN_IF_ERROR(CheckReserved(pad));
  if (how < 1 || how > 4) return Bad("shutdown direction " + std::to_string(how));
  b->how = static_cast<ShutdownHow>(how);
  return Status::Ok();
}
Status Get(WireReader& r, Downgrade* b, std::span<const uint8_t>) {
  b->conn_id = r.U64();
  uint16_t reason = r.U16();
  b->flags = r.U8();
  uint64_t pad = r.U8() | uint64_t{r.U32()};
  b->bytes_received = r.U64();
  VS_RETURN_IF_ERROR(CheckReserved(pad));
  if (b->flags & ~(kDowngradeFenceAcked | kDowngradeDrain | kDowngradeResendFrom)) return Bad("unknown DOWNGRADE flags");
  return CheckReason(reason, &b->reason);
}
Status Get(WireReader& r, Error* b, std::span<const uint8_t>) {
  b->conn_id = r.U64();
  uint16_t code = r.U16();
  uint16_t reason = r.U16();
  VS_RETURN_IF_ERROR(CheckReserved(r.U32()));
  VS_RETURN_IF_ERROR(CheckWireError(code, &b->code));
  return CheckReason(reason, &b->reason);
}
Status Get(WireReader& r, Echo* b, std::span<const uint8_t> body) {
  b->checksum = r.U32();
  uint32_t len = r.U32();
  if (len > kMaxEchoPayload) return Bad("echo payload of " + std::to_string(len) + " bytes");
  if (len != body.size() - 8) return Bad("echo payload length disagrees with body length");
  b->payload = body.subspan(8, len);
  r.Skip(len);
  return Status::Ok();
}
Status Get(WireReader& r, Unregister* b, std::span<const uint8_t>) {
  b->conn_id = r.U64();
  return Status::Ok();
}
Status Get(WireReader& r, Vouch* b, std::span<const uint8_t>) {
  b->device_ring_gpa = r.U64();
  b->local.family = static_cast<Family>(r.U8());
  b->peer.family = static_cast<Family>(r.U8());
  b->local.port = r.U16();
  b->peer.port = r.U16();
  uint16_t reserved = r.U16();
  r.Bytes(b->local.addr.data(), b->local.addr.size());
  r.Bytes(b->peer.addr.data(), b->peer.addr.size());
  VS_RETURN_IF_ERROR(CheckReserved(reserved));
  VS_RETURN_IF_ERROR(CheckEndpoint(b->local, "local"));
  VS_RETURN_IF_ERROR(CheckEndpoint(b->peer, "peer"));
  if (b->local.family != b->peer.family) return Bad("local and peer families differ");
  if (b->device_ring_gpa % 16 != 0) return Bad("descriptor table address is not 16-byte aligned");
  return Status::Ok();
}

Status Get(WireReader& r, LimitMemory* b, std::span<const uint8_t>) {
  b->device_ring_gpa = r.U64();
  b->num_ranges = r.U32();
  uint32_t reserved = r.U32();
  for (MemRange& m : b->ranges) m.gpa = r.U64(), m.len = r.U64();
  if (reserved != 0) return Bad("reserved field is not zero");
  if (b->device_ring_gpa % 16 != 0) return Bad("descriptor table address is not 16-byte aligned");
  if (b->num_ranges == 0 || b->num_ranges > kLimitMaxRanges) return Bad("range count out of range");
  for (uint32_t i = 0; i < kLimitMaxRanges; ++i) {
    const MemRange& m = b->ranges[i];
    if (i >= b->num_ranges) {
      if (m.gpa != 0 || m.len != 0) return Bad("a range past the count");
    } else if (m.len == 0 || m.gpa + m.len < m.gpa) {
      return Bad("an empty or wrapping range");
    }
  }
  return Status::Ok();
}

template <typename T>
Status DecodeInto(WireReader& r, std::span<const uint8_t> body, Body* out) {
  T b;
  Status st = Get(r, &b, body);
  *out = b;
  return st;
}

// Indexed by Body's alternative index.
using DecodeFn = Status (*)(WireReader&, std::span<const uint8_t>, Body*);
constexpr DecodeFn kDecoders[] = {
    &DecodeInto<Hello>,   &DecodeInto<HelloAck>,    &DecodeInto<RegisterConn>, &DecodeInto<RegisterAck>,
    &DecodeInto<Upgrade>, &DecodeInto<ConnCounter>, &DecodeInto<Shutdown>,     &DecodeInto<Downgrade>,
    &DecodeInto<Error>,   &DecodeInto<Echo>,        &DecodeInto<Unregister>,  &DecodeInto<Vouch>,
    &DecodeInto<LimitMemory>,
};
static_assert(std::size(kDecoders) == std::variant_size_v<Body>);

}  // namespace

bool Echo::operator==(const Echo& o) const {
  return checksum == o.checksum && payload.size() == o.payload.size() &&
         std::equal(payload.begin(), payload.end(), o.payload.begin());
}

const char* ToString(MsgType type) {
  const Spec* s = FindSpec(static_cast<uint8_t>(type));
  return s ? s->name : "UNKNOWN";
}

const char* ToString(WireError error) {
  static constexpr const char* kNames[] = {"OK",
                                           "BAD_MESSAGE",
                                           "UNSUPPORTED_VERSION",
                                           "SPOOFED_ADDRESS",
                                           "TOO_MANY_CONNECTIONS",
                                           "UNKNOWN_CONNECTION",
                                           "NOT_PAIRED",
                                           "CREDIT_VIOLATION",
                                           "BAD_RING",
                                           "INTERNAL",
                                           "PEER_GONE"};
  auto i = static_cast<size_t>(error);
  return i < std::size(kNames) ? kNames[i] : "UNKNOWN";
}

const char* ToString(Reason reason) {
  static constexpr const char* kNames[] = {"accelerated",
                                           "pending",
                                           "peer-not-registered",
                                           "cross-tenant",
                                           "backend-unavailable",
                                           "disabled-by-rule",
                                           "unsupported-family",
                                           "spoofed-address",
                                           "migration",
                                           "fabric-down",
                                           "operator",
                                           "peer-downgraded",
                                           "resource-limit",
                                           "protocol-error",
                                           "inherited",
                                           "forked",
                                           "rings-held",
                                           "kernel-faster",
                                           "request-response",
                                           "urgent-data",
                                           "directory-unavailable",
                                           "peer-corrupted-ring",
                                           "connection-over",
                                           "direct-unavailable"};
  static_assert(std::size(kNames) == kLastReason + 1, "a name for every reason");
  auto i = static_cast<size_t>(reason);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

Result<size_t> Encode(const Message& msg, std::span<uint8_t> out) {
  const Spec* spec = FindSpec(static_cast<uint8_t>(msg.type));
  if (spec == nullptr) return Status(Code::kInvalidArgument, "unknown message type");
  if (spec->body_index != msg.body.index())
    return Status(Code::kInvalidArgument, std::string("body does not match type ") + spec->name);
  if (const Echo* e = std::get_if<Echo>(&msg.body); e && e->payload.size() > kMaxEchoPayload)
    return Status(Code::kInvalidArgument, "echo payload too large");

  WireWriter w(out);
  w.U16(kControlMagic);
  w.U8(kControlVersion);
  w.U8(static_cast<uint8_t>(msg.type));
  w.U32(0);  // body length, patched below
  w.U64(msg.request_id);
  std::visit([&w](const auto& body) { Put(w, body); }, msg.body);
  if (!w.ok()) return Status(Code::kOutOfRange, "output buffer too small for message");
  w.PatchU32(4, static_cast<uint32_t>(w.size() - kHeaderSize));
  return w.size();
}

Result<Message> Decode(std::span<const uint8_t> in, size_t* consumed) {
  if (in.size() < kHeaderSize) return Bad("truncated header (" + std::to_string(in.size()) + " bytes)");
  WireReader h(in.first(kHeaderSize));
  uint16_t magic = h.U16();
  uint8_t version = h.U8();
  uint8_t type = h.U8();
  uint32_t body_len = h.U32();
  Message msg;
  msg.request_id = h.U64();
  if (magic != kControlMagic) return Bad("bad magic");
  if (version != kControlVersion) return Bad("unsupported version " + std::to_string(version));
  const Spec* spec = FindSpec(type);
  if (spec == nullptr) return Bad("unknown type " + std::to_string(type));
  msg.type = spec->type;
  if (spec->body_size == kVariable) {
    if (body_len < 8 || body_len > 8 + kMaxEchoPayload)
      return Bad(std::string(spec->name) + " body length " + std::to_string(body_len));
  } else if (body_len != spec->body_size) {
    return Bad(std::string(spec->name) + " body length " + std::to_string(body_len) + ", expected " +
               std::to_string(spec->body_size));
  }
  if (in.size() - kHeaderSize < body_len) return Bad("truncated body");
  std::span<const uint8_t> body = in.subspan(kHeaderSize, body_len);
  WireReader r(body);

  if (spec->body_index >= std::size(kDecoders))
    return Status(Code::kInternal, "control spec table names an unknown body");
  Status st = kDecoders[spec->body_index](r, body, &msg.body);
  if (!st.ok()) return st;
  // Fixed bodies are read exactly; a mismatch here is a table bug, not input.
  if (!r.ok() || r.remaining() != 0) return Status(Code::kInternal, "body size table mismatch");
  if (consumed != nullptr) *consumed = kHeaderSize + body_len;
  return msg;
}

namespace {

uint32_t Crc32cSoftware(const uint8_t* p, size_t n, uint32_t crc) {
  static const auto kTable = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  for (size_t i = 0; i < n; ++i) crc = kTable[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc;
}

__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(const uint8_t* p, size_t n, uint32_t crc) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n-- > 0) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}

}  // namespace

uint32_t Crc32c(std::span<const uint8_t> data, uint32_t seed) {
  static const bool kHasSse42 = __builtin_cpu_supports("sse4.2");
  uint32_t crc = ~seed;
  crc = kHasSse42 ? Crc32cHardware(data.data(), data.size(), crc) : Crc32cSoftware(data.data(), data.size(), crc);
  return ~crc;
}

void EncodeResync(uint64_t from, uint8_t out[kResyncHeaderSize]) {
  WireWriter w({out, kResyncHeaderSize});
  w.U32(kResyncMagic);
  w.U32(0);
  w.U64(from);
}

Result<uint64_t> DecodeResync(std::span<const uint8_t, kResyncHeaderSize> in) {
  WireReader r(in);
  if (r.U32() != kResyncMagic) return Bad("RESYNC header: bad magic");
  if (r.U32() != 0) return Bad("RESYNC header: reserved bits set");
  return r.U64();
}

}  // namespace vsocket::proto
