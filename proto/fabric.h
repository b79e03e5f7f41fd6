// Backend-to-backend frames (the fabric link between two vsocketd hosts).
//
// Every frame is a fixed 32-byte little-endian header, optionally followed
// by `len` payload bytes (DATA, PAIR_*). A frame names the *receiver's*
// connection handle and the tenant the sender believes it belongs to; the
// receiver checks both against its own registry before touching anything.
// See docs/wire-protocol.md ("Fabric frames").
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>

#include "base/status.h"
#include "proto/control.h"

namespace vsocket::proto {

inline constexpr uint16_t kFabricMagic = 0x4656;  // "VF"
inline constexpr uint8_t kFabricVersion = 1;
inline constexpr size_t kFrameHeaderSize = 32;
// Largest payload of one DATA frame: a connection with more to send gets
// several frames, interleaved with other connections' (no head-of-line
// blocking behind one big writer).
inline constexpr uint32_t kMaxDataFrame = 64 * 1024;
inline constexpr uint32_t kMaxControlPayload = 256;
// RDMA_SETUP's payload (host-backend/fabric/rdma_link.h RdmaEndpointInfo).
inline constexpr uint32_t kRdmaSetupSize = 56;

enum class FrameType : uint8_t {
  // Link-level (handle 0).
  kLinkHello = 1,  // first frame on a data link: payload = 32-byte link token
  kLinkClose = 2,  // orderly teardown, no more frames follow
  kKeepalive = 3,
  kLinkReady = 4,  // on the TLS channel: the acceptor took the data link; pairing may start
  kRdmaSetup = 5,  // on the TLS channel (rdma fabric): payload = the sender's RdmaEndpointInfo
  // Pairing (on the TLS control channel).
  kPairRequest = 10,  // handle 0; value = sender's handle; aux = sender RX window; payload = PairInfo
  kPairAccept = 11,   // handle = requester's; value = acceptor's handle; aux = acceptor RX window
  kPairReject = 12,   // handle = requester's; aux = Reason
  kPairCancel = 13,   // handle = acceptor's (or 0 + value = requester's); the requester left
  // Handle 0; aux = Reason; payload = PairInfo (the connection as its sender
  // sees it; rx_addr/rx_rkey 0). The sender keeps that connection on kernel
  // TCP without asking (kernel-faster: decision 63): a registration of its
  // mirror at the receiver need not wait for a PAIR_REQUEST that never comes.
  kPairDecline = 14,
  // Per connection, after pairing (on the data link, ordered with DATA).
  kData = 20,         // value = receiver RX stream offset; len payload bytes follow
  kCredit = 21,       // value = receiver has consumed this many bytes (total)
  kFence = 22,        // value = sender's kernel-path byte count
  kShutWr = 23,       // sender sends no more; value = total bytes sent; aux = 0 or ShutRingEndAux

  kGone = 24,         // sender's guest closed: it reads no more (EPIPE on the peer's writes)
  kAbort = 25,        // abortive close (RST semantics)
  kRelease = 26,      // the sender forgot the connection; the handle is dead
  kDowngrade = 27,    // the sender's side left the accelerated path; aux = Reason
  kPairConfirm = 28,  // the requester took PAIR_ACCEPT: the acceptor upgrades its guest now
  kFenceAck = 29,     // the receiver's guest has the sender's FENCE: a RESYNC is safe (docs/fabric-design.md)
  // rdma fabric: where the sender's RX ring may be written one-sided from now
  // on; value = address (0: stop, use the staging ring), aux = rkey.
  kPlacement = 30,
  // The receiver of PLACEMENTs applies them: value = how many it has seen. Every
  // DATA it placed with an older rkey precedes this frame on the link.
  kPlacementAck = 31,
};
// SHUT_WR's aux: kShutRingEnd | reason << 8: the sender's accelerated
// stream ends here but the connection goes on on kernel TCP (a drain:
// ShutdownHow::kRingEnd), for that reason (operator, migration, ...).
inline constexpr uint32_t kShutRingEnd = 1;
inline constexpr uint32_t ShutRingEndAux(Reason why) { return kShutRingEnd | static_cast<uint32_t>(why) << 8; }
inline Reason ShutRingEndReason(uint32_t aux) { return static_cast<Reason>(aux >> 8); }

const char* ToString(FrameType t);
bool IsKnownFrameType(uint8_t t);

struct FrameHeader {
  FrameType type = FrameType::kKeepalive;
  uint32_t tenant = 0;
  uint64_t handle = 0;
  uint64_t value = 0;
  uint32_t len = 0;
  uint32_t aux = 0;
};

// Encodes into exactly kFrameHeaderSize bytes.
void EncodeFrameHeader(const FrameHeader& h, uint8_t* out);
// Strict: bad magic/version/type, payload length beyond what the type
// allows, or nonzero reserved bits are errors (the link is then torn down:
// a peer that sends garbage is not trusted with the next frame either).
Result<FrameHeader> DecodeFrameHeader(std::span<const uint8_t, kFrameHeaderSize> in);

// What a PAIR_REQUEST carries: the connection as the *requester* sees it.
struct PairInfo {
  Endpoint local;  // requester's guest address (must be located on the requester's host)
  Endpoint peer;   // the acceptor's guest address (must be one of the acceptor's VMs)
  Role role = Role::kClient;
  // RDMA fabric only: where the requester's RX ring is and how to write it.
  uint64_t rx_addr = 0;
  uint32_t rx_rkey = 0;
};
inline constexpr size_t kPairInfoSize = 2 * 20 + 4 + 8 + 4;
void EncodePairInfo(const PairInfo& p, uint8_t* out);
Result<PairInfo> DecodePairInfo(std::span<const uint8_t> in);

}  // namespace vsocket::proto
