// Guest <-> backend control messages, carried in virtqueue buffers.
//
// Every message is a 16-byte header followed by a body whose size is fixed by
// its type (kEcho alone has a bounded variable payload). All fields are
// little-endian; layouts are documented in docs/wire-protocol.md and never
// change within a major version. Decode() rejects anything malformed with a
// Status naming the reason; it never reads past its input.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <variant>

#include "base/status.h"

namespace vsocket::proto {

inline constexpr uint16_t kControlMagic = 0x5356;  // bytes "VS"
inline constexpr uint8_t kControlVersion = 1;
inline constexpr size_t kHeaderSize = 16;
inline constexpr size_t kMaxEchoPayload = 4096;
inline constexpr size_t kMaxMessageSize = kHeaderSize + 8 + kMaxEchoPayload;

enum class MsgType : uint8_t {
  kHello = 1,         // guest -> backend: open a session on this device
  kHelloAck = 2,      // backend -> guest
  kRegisterConn = 3,  // guest -> backend: an established kernel connection
  kRegisterAck = 4,   // backend -> guest
  kUpgrade = 5,       // backend -> guest: both ends paired; switch over
  kFence = 6,         // both ways: bytes the sender wrote on the kernel path
  kTxTail = 7,        // guest -> backend: total bytes produced into TX ring
  kRxTail = 8,        // backend -> guest: total bytes landed in RX ring
  kConsumed = 9,      // guest -> backend: total bytes consumed from RX ring
  kCredit = 10,       // backend -> guest: peer consumed total (TX space freed)
  kShutdown = 11,     // both ways: orderly shutdown of one or both directions
  kDowngrade = 12,    // both ways: leave the accelerated path
  kError = 13,        // backend -> guest
  kEcho = 14,         // both ways: liveness/latency probe with a checksum
  kUnregister = 15,   // guest -> backend: connection closed
  // guest -> backend: is this connection paired or being paired? Asked on
  // kernel EOF before the upgrade (the peer may already have switched and
  // shut down). Answered with REGISTER_ACK: reason kNone = wait for the
  // UPGRADE or DOWNGRADE event; anything else = the EOF is final.
  kPairingQuery = 16,
  // backend -> guest (kFeatureRingHold): the rings of a connection whose
  // UNREGISTER was answered with reason rings-held are free to reuse now.
  // Body ConnCounter{conn_id, 0}.
  kRingsReleased = 17,
  // backend -> guest (kFeatureFenceDelivered): the connection's FENCE has
  // reached its peer's library (the FENCE event is in the peer guest's
  // event queue). Body ConnCounter{conn_id, fence bytes}. From then on, if
  // the backend disappears, a RESYNC header on the kernel stream is safe:
  // the peer knows where our kernel bytes end.
  kFenceDelivered = 18,
  // backend -> guest (kFeatureDirect): the connection goes direct (decision
  // 97): before its UPGRADE, the token that fetches the pair's memory and
  // the peer's wake eventfd on the proof channel (vhost/user/proof.h).
  // Body ConnCounter{conn_id, token}.
  kDirect = 19,
  // guest -> backend, from a VM's socket-proof authority only (its agent,
  // decision 100; kFeatureProofAuthority): a process of the VM proved to
  // the agent that it holds the TCP socket `local`/`peer`; the device whose
  // request queue's descriptor table is at `device_ring_gpa` (the function
  // the agent granted that process) may register it, once. Answered with
  // REGISTER_ACK{conn_id 0}: status OK, UNKNOWN_CONNECTION (no running
  // device of this VM has its request ring there) or BAD_MESSAGE (the
  // sender is not the VM's authority). Body Vouch.
  kVouch = 20,
  // guest -> backend, from a VM's socket-proof authority only (decision
  // 130): the device whose request queue's descriptor table is at
  // `device_ring_gpa` may reach only these guest-physical ranges (the
  // memory the agent gave that function), set once. Until then a device of
  // a port with prove_sockets = agent reaches no memory at all. Answered with REGISTER_ACK{conn_id 0}: status OK,
  // UNKNOWN_CONNECTION (no running device there), BAD_RING (a range outside
  // the VM's memory, the device's request ring outside the ranges, or the
  // device already limited) or BAD_MESSAGE (not the authority). Body LimitMemory.
  kLimitMemory = 21,
};
const char* ToString(MsgType type);

// Error codes on the wire (kHelloAck/kRegisterAck status, kError code).
enum class WireError : uint16_t {
  kOk = 0,
  kBadMessage = 1,
  kUnsupportedVersion = 2,
  kSpoofedAddress = 3,
  kTooManyConnections = 4,
  kUnknownConnection = 5,
  kNotPaired = 6,
  kCreditViolation = 7,
  kBadRing = 8,
  kInternal = 9,
  kPeerGone = 10,
};
inline constexpr uint16_t kMaxWireError = 10;
const char* ToString(WireError error);

// Why a connection is (or went back) on kernel TCP. Reported by the library
// and by vsocketctl, in the spirit of SMC's fallback reason codes.
enum class Reason : uint16_t {
  kNone = 0,     // accelerated
  kPending = 1,  // registered, peer not (yet) seen
  kPeerNotRegistered = 2,
  kCrossTenant = 3,
  kBackendUnavailable = 4,
  kDisabledByRule = 5,
  kUnsupportedFamily = 6,
  kSpoofedAddress = 7,
  kMigration = 8,
  kFabricDown = 9,
  kOperator = 10,
  kPeerDowngraded = 11,
  kResourceLimit = 12,
  kProtocolError = 13,
  kInherited = 14,  // fd from before exec/unknown history: byte counts unknown
  kForked = 15,     // upgraded in a parent process that then forked
  // UNREGISTER's answer (kFeatureRingHold only): the connection is gone, but
  // the fabric still reads its TX ring or a peer host may still write into
  // its RX ring; reuse neither before RINGS_RELEASED names it.
  kRingsHeld = 16,
  // REGISTER_ACK (kFeatureBulkHint only): the registration said "bulk" and
  // the peer is on another host across the tcp fabric, where a bulk stream
  // is slower than kernel TCP (decision 62): it stays on kernel TCP.
  kKernelFaster = 17,
  // Library-only, never on the wire (IsLibraryOnly): the upgrade policy
  // keeps a request/response connection on kernel TCP where vsocketd shares
  // the process's few CPUs (decision 51).
  kRequestResponse = 18,
  // Library-only: the application sent urgent data (MSG_OOB) while the
  // connection was on kernel TCP; the ring has no urgent mark, and the
  // byte counts a registration fences on would miss the out-of-band byte
  // (decision 79).
  kUrgentData = 19,
  // On the wire, to a library only with kFeatureDirectoryUnavailable (an
  // older one is told peer-not-registered instead), between hosts always:
  // the cluster directory (etcd) could not be asked where the peer runs
  // and its cache does not name a host, so the connection stays on kernel
  // TCP (decision 95).
  kDirectoryUnavailable = 20,
  // Library-only: a direct pair's peer wrote a count that cannot be into
  // the pair's memory (decision 97): this connection alone is reset.
  kPeerCorruptedRing = 21,
  // Library-only: the TCP connection was over (shut both ways, its socket
  // no longer connected) before vsocketd could inspect the socket it was
  // to prove; nothing was registered and it ended on kernel TCP.
  kConnectionOver = 22,
  // On the wire (DOWNGRADE, kFeatureDirectResend, decision 135): a direct
  // pair's memory could not be fetched or mapped by one side (out of file
  // descriptors or address space, or the peer gave up on it first), so that
  // side stays on kernel TCP and the other resends its ring stream there.
  kDirectUnavailable = 23,
};
// Numbers are never reused. A new reason of either kind takes the next free
// number; a library-only one is also listed in IsLibraryOnly, so that the
// wire refuses it (the library-only 18, 19, 21 and 22 sit below kMaxReason).
inline constexpr uint16_t kMaxReason = 23;   // the largest reason the wire carries
inline constexpr uint16_t kLastReason = 23;  // the largest there is
constexpr bool IsLibraryOnly(Reason r) {
  return r == Reason::kRequestResponse || r == Reason::kUrgentData || r == Reason::kPeerCorruptedRing ||
         r == Reason::kConnectionOver;
}
// Whether a reason code read from the wire (control message or fabric
// frame) is one the wire may carry.
constexpr bool IsWireReason(uint32_t r) { return r <= kMaxReason && !IsLibraryOnly(static_cast<Reason>(r)); }
const char* ToString(Reason reason);

enum class Role : uint8_t { kClient = 1, kServer = 2 };
enum class Family : uint8_t { kIpv4 = 4, kIpv6 = 6 };
// kRingEnd (kFeatureCleanDowngrade): not a shutdown of the connection but of
// its ring: "my accelerated stream ends here; the rest follows on kernel
// TCP". Guest -> backend when a drain moves the connection off the rings;
// backend -> the peer's guest once every ring byte before it was delivered
// (docs/connection-lifecycle.md §9).
enum class ShutdownHow : uint8_t { kRead = 1, kWrite = 2, kBoth = 3, kRingEnd = 4 };

// An endpoint address. IPv4 occupies the first 4 bytes of `addr`; the rest
// must be zero (so equal endpoints have equal bytes).
struct Endpoint {
  Family family = Family::kIpv4;
  std::array<uint8_t, 16> addr{};
  uint16_t port = 0;  // host order in memory, little-endian on the wire
  bool operator==(const Endpoint&) const = default;
};

// HELLO/HELLO_ACK feature bits: the guest offers, the backend answers with
// the ones it takes (the session uses exactly those).
//
// kFeatureDoorbell: every connection's TX ring allocation is followed by a
// DoorbellBlock (the 64 bytes at tx_ring_gpa + tx_ring_bytes; tx_ring_gpa
// 64-byte aligned). The guest publishes its TX tail and RX consumed counts
// there and posts TX_TAIL / CONSUMED only when the backend asked for one
// (want_tx / want_consumed set): while the backend polls, a send() costs
// no request. The messages' counts are then hints; the block is read.
// Both sides order their store and the other's flag/count load with a full
// fence (docs/wire-protocol.md, "Doorbell").
inline constexpr uint64_t kFeatureDoorbell = 1ull << 0;
// kFeatureRingHold: the library keeps a closed connection's rings unused
// while UNREGISTER's answer says rings-held, until RINGS_RELEASED. Only
// such sessions get one-sided fabric access to their rings (an rdma peer
// writing straight into the RX ring, sends read straight from the TX ring):
// both can outlive the connection by a work request's flight, so without
// the feature the backend stages and copies instead.
inline constexpr uint64_t kFeatureRingHold = 1ull << 1;
// kFeatureFenceDelivered: the backend tells the library when its FENCE has
// reached the peer's library (FENCE_DELIVERED), so that the library can
// finish on kernel TCP without losing a byte if the backend itself goes
// away (docs/connection-lifecycle.md §8).
inline constexpr uint64_t kFeatureFenceDelivered = 1ull << 2;
// kFeatureCleanDowngrade: the library leaves the rings when asked
// (DOWNGRADE with kDowngradeDrain: an operator's drain, a guest being
// moved) with clean fences: SHUTDOWN(kRingEnd), then, once the peer
// consumed every ring byte, a RESYNC header with nothing to resend on the
// kernel socket (docs/connection-lifecycle.md §9). Without it, vsocketd
// leaves the session's connections where they are until it exits.
inline constexpr uint64_t kFeatureCleanDowngrade = 1ull << 3;
// kFeatureBulkHint: REGISTER_CONN may carry kRegisterBulk, and the backend
// may answer it kNotPaired with reason kKernelFaster (decision 62).
inline constexpr uint64_t kFeatureBulkHint = 1ull << 4;
// kFeatureNaps: the backend's worker, sharing its CPUs with the guests,
// sleeps a short while between passes instead of polling, with the
// guests' kicks off (decision 67). So a library that is about to wait
// (block, poll or sleep) while something it did since its last kick waits
// for a pass (bytes produced, room made, a message posted) kicks the
// request queue itself first.
inline constexpr uint64_t kFeatureNaps = 1ull << 5;
// kFeatureTentative: REGISTER_CONN may carry kRegisterTentative, and the
// backend withdraws such a registration (DOWNGRADE before any upgrade,
// reason peer-not-registered) if its peer has not registered within
// kTentativeWaitMs (decision 83).
inline constexpr uint64_t kFeatureTentative = 1ull << 6;
// kFeatureForkResync: the library takes a connection it shares with a
// forked child back to kernel TCP before the child exists (decision 85):
// it sends DOWNGRADE(reason forked, kDowngradeResendFrom, bytes_received =
// what its application consumed from the RX ring) and its peer's library,
// told by a DOWNGRADE with the same flag, resends its ring stream from
// that byte on the kernel socket with no RESYNC header. Both sessions of a
// same-host pair must have taken it.
inline constexpr uint64_t kFeatureForkResync = 1ull << 7;
// kFeatureMoveBack: the library may ask vsocketd to drain one of its
// connections (DOWNGRADE guest -> backend, kDowngradeDrain, reason
// kernel-faster): a connection its busy event loop registered (decision 83)
// whose loop has not been busy for a while goes back to kernel TCP with
// clean fences at both ends, and is held again (decision 92).
inline constexpr uint64_t kFeatureMoveBack = 1ull << 8;
// kFeatureDirectoryUnavailable: the library knows Reason::kDirectoryUnavailable
// (a REGISTER_ACK or DOWNGRADE may carry it); without it the backend says
// peer-not-registered there, which an older library reads the same way
// (kernel TCP for good), decision 95.
inline constexpr uint64_t kFeatureDirectoryUnavailable = 1ull << 9;
// kFeatureDirect: the library takes direct pairs (decision 97): a DIRECT
// event before a connection's UPGRADE names a token; the library fetches
// the pair's memory with it on its proof channel, keeps its ring stream
// and counts there (proto/direct.h) and wakes its peer through the peer's
// wake eventfd, and posts no TX_TAIL or CONSUMED for that connection.
// Its control messages (FENCE, SHUTDOWN, UNREGISTER) go as before.
inline constexpr uint64_t kFeatureDirect = 1ull << 10;
// kFeatureProofAuthority: offered by vsocket-guestd --proofs on the
// function it keeps for itself; answered only on the device attached to
// the port's agent socket (PATH.agent, a port with `prove_sockets = agent`): this device is
// the VM's socket-proof authority and may send VOUCH (decision 100). Not a
// session feature: never in kKnownFeatures.
inline constexpr uint64_t kFeatureProofAuthority = 1ull << 11;
// kFeatureDirectResend (with kFeatureDirect; decision 135): a library that
// cannot fetch or map a direct pair's memory posts DOWNGRADE(direct-
// unavailable, kDowngradeResendFrom, 0) and stays on kernel TCP; its peer's
// library, told so by the same DOWNGRADE, resends its ring stream from byte
// 0 with no RESYNC header. Both mark the pair's `attached` words
// (proto/direct.h), by which they agree on the same when vsocketd is gone.
inline constexpr uint64_t kFeatureDirectResend = 1ull << 12;
inline constexpr uint64_t kKnownFeatures = kFeatureDoorbell | kFeatureRingHold | kFeatureFenceDelivered |
                                           kFeatureCleanDowngrade | kFeatureBulkHint | kFeatureNaps |
                                           kFeatureTentative | kFeatureForkResync | kFeatureMoveBack |
                                           kFeatureDirectoryUnavailable | kFeatureDirect | kFeatureDirectResend;
inline constexpr int64_t kTentativeWaitMs = 500;
struct DoorbellBlock {
  uint64_t tx_tail;        // guest writes: bytes produced into the TX ring (total)
  uint64_t consumed;       // guest writes: bytes consumed from the RX ring (total)
  uint32_t want_tx;        // backend sets 1: post TX_TAIL after the next tail; guest clears
  uint32_t want_consumed;  // backend sets 1: post CONSUMED after the next count; guest clears
  uint8_t reserved[40];
};
static_assert(sizeof(DoorbellBlock) == 64);
inline constexpr uint32_t kDoorbellBytes = sizeof(DoorbellBlock);

struct Hello {
  uint16_t abi_major = kControlVersion;
  uint16_t abi_minor = 0;
  uint32_t pid = 0;
  uint64_t features = 0;
  bool operator==(const Hello&) const = default;
};

struct HelloAck {
  WireError status = WireError::kOk;
  uint32_t device_id = 0;
  uint32_t max_conns = 0;
  uint32_t max_outstanding = 0;  // descriptors per connection
  uint64_t features = 0;
  bool operator==(const HelloAck&) const = default;
};

// Byte rings live in the guest's shared region; addresses are guest-physical
// (the device side translates and bounds-checks them).
struct RegisterConn {
  uint64_t conn_id = 0;  // chosen by the guest, unique per device
  Role role = Role::kClient;
  Endpoint local;
  Endpoint peer;
  uint64_t tx_ring_gpa = 0;
  uint64_t rx_ring_gpa = 0;
  uint32_t tx_ring_bytes = 0;  // power of two
  uint32_t rx_ring_bytes = 0;  // power of two
  uint8_t flags = 0;           // kRegister* (each under its feature)
  bool operator==(const RegisterConn&) const = default;
};
// REGISTER_CONN flags. kRegisterBulk: the upgrade policy registered this
// connection because it streams, and it streams in large writes (at least
// kBulkWriteBytes per call on average, more bytes out than in): copy-bound,
// where a path that copies more than kernel TCP loses (decision 62).
inline constexpr uint8_t kRegisterBulk = 1u << 0;
// kRegisterTentative (kFeatureTentative only): the upgrade policy registered
// this connection because its process's event loop is busy, not because
// the connection streams; its peer's process may never be: the backend
// withdraws it if no peer registers within kTentativeWaitMs (decision 83).
inline constexpr uint8_t kRegisterTentative = 1u << 1;
// kRegisterDirect (with kRegisterTentative, kFeatureDirect only): the
// upgrade policy registered this request/response connection only because
// its peer may be a process this one shares a direct pair with (decision
// 98): through vsocketd it would be slower than kernel TCP. The backend
// withdraws it (DOWNGRADE before any upgrade, reason kernel-faster) unless
// the pair it makes is direct.
inline constexpr uint8_t kRegisterDirect = 1u << 2;
inline constexpr uint8_t kKnownRegisterFlags = kRegisterBulk | kRegisterTentative | kRegisterDirect;
inline constexpr uint64_t kBulkWriteBytes = 4096;
inline constexpr uint32_t kMinRingBytes = 4096;
inline constexpr uint32_t kMaxRingBytes = 64u << 20;
// A ring size: a power of two in [kMinRingBytes, kMaxRingBytes].
inline bool IsValidRingSize(uint64_t v) { return v >= kMinRingBytes && v <= kMaxRingBytes && (v & (v - 1)) == 0; }

struct RegisterAck {
  uint64_t conn_id = 0;
  WireError status = WireError::kOk;
  Reason reason = Reason::kNone;
  uint32_t window_bytes = 0;
  bool operator==(const RegisterAck&) const = default;
};

struct Upgrade {
  uint64_t conn_id = 0;
  uint32_t peer_rx_window = 0;  // bytes the peer's RX ring can hold
  uint32_t max_outstanding = 0;
  bool operator==(const Upgrade&) const = default;
};

// kFence, kTxTail, kRxTail, kConsumed, kCredit: a connection and a 64-bit
// monotonically increasing byte count. The type says which count.
struct ConnCounter {
  uint64_t conn_id = 0;
  uint64_t bytes = 0;
  bool operator==(const ConnCounter&) const = default;
};

struct Shutdown {
  uint64_t conn_id = 0;
  ShutdownHow how = ShutdownHow::kWrite;
  bool operator==(const Shutdown&) const = default;
};

// DOWNGRADE flags. FenceAcked: the peer's library has (or gets before its
// own DOWNGRADE) this side's FENCE, so it expects a RESYNC header after the
// fenced kernel bytes (docs/fabric-design.md "Link loss and RESYNC").
inline constexpr uint8_t kDowngradeFenceAcked = 1;
// Drain (kFeatureCleanDowngrade only): not a loss but a request. The
// connection stays accelerated until its library has moved it to kernel
// TCP with clean fences (SHUTDOWN kRingEnd); `reason` says why (operator,
// migration); bytes_received is not used.
inline constexpr uint8_t kDowngradeDrain = 2;
// ResendFrom (kFeatureForkResync only), reason forked. Guest -> backend: a
// request to leave the rings for good because the process forks;
// bytes_received = the bytes its application consumed from the RX ring
// (the rest of the ring is dropped). Backend -> the peer's guest: resend
// the ring stream from byte bytes_received on the kernel socket, right
// after the bytes sent there before the FENCE, with no RESYNC header; the
// landed count is the peer's own RX tail (every RX_TAIL came before).
inline constexpr uint8_t kDowngradeResendFrom = 4;

// The RESYNC header a library writes on the kernel socket after a link
// loss, right after the bytes it sent there before its FENCE: "the
// accelerated stream continues here on kernel TCP, from byte `from`".
// 16 bytes: magic "VSR1" 0:4, reserved 4:4 (zero), from 8:8.
inline constexpr size_t kResyncHeaderSize = 16;
inline constexpr uint32_t kResyncMagic = 0x31525356;  // "VSR1" little-endian
void EncodeResync(uint64_t from, uint8_t out[kResyncHeaderSize]);
Result<uint64_t> DecodeResync(std::span<const uint8_t, kResyncHeaderSize> in);

struct Downgrade {
  uint64_t conn_id = 0;
  Reason reason = Reason::kNone;
  uint64_t bytes_received = 0;  // accelerated bytes landed in the RX ring (RESYNC)
  uint8_t flags = 0;            // kDowngradeFenceAcked, kDowngradeDrain, kDowngradeResendFrom
  bool operator==(const Downgrade&) const = default;
};

struct Error {
  uint64_t conn_id = 0;  // 0: the device/session as a whole
  WireError code = WireError::kOk;
  Reason reason = Reason::kNone;
  bool operator==(const Error&) const = default;
};

// Payload is a view into the decoded buffer (or the caller's data on encode).
struct Echo {
  uint32_t checksum = 0;  // Crc32c(payload)
  std::span<const uint8_t> payload;
  bool operator==(const Echo& o) const;
};

struct Unregister {
  uint64_t conn_id = 0;
  bool operator==(const Unregister&) const = default;
};

struct Vouch {
  uint64_t device_ring_gpa = 0;  // the vouched-for device's request descriptor table
  Endpoint local;
  Endpoint peer;
  bool operator==(const Vouch&) const = default;
};

// LIMIT_MEMORY's ranges: the memory a VM's agent gave one function (its
// huge pages), [gpa, gpa + len) each.
inline constexpr size_t kLimitMaxRanges = 64;

struct MemRange {
  uint64_t gpa = 0;
  uint64_t len = 0;
  bool operator==(const MemRange&) const = default;
};

struct LimitMemory {
  uint64_t device_ring_gpa = 0;  // the limited device's request descriptor table
  uint32_t num_ranges = 0;       // 1..kLimitMaxRanges
  std::array<MemRange, kLimitMaxRanges> ranges{};  // past num_ranges: zero
  bool operator==(const LimitMemory&) const = default;
};

using Body = std::variant<Hello, HelloAck, RegisterConn, RegisterAck, Upgrade, ConnCounter, Shutdown, Downgrade, Error,
                          Echo, Unregister, Vouch, LimitMemory>;

struct Message {
  MsgType type = MsgType::kHello;
  uint64_t request_id = 0;  // echoed in responses; 0 for unsolicited events
  Body body;
  bool operator==(const Message&) const = default;
};

// Encodes into `out`. Returns bytes written, or a kOutOfRange/kInvalidArgument
// status if `out` is too small or the message is inconsistent (body kind does
// not match type, echo payload too large).
Result<size_t> Encode(const Message& msg, std::span<uint8_t> out);

// Decodes one message from the start of `in`; trailing bytes are ignored
// (virtqueue buffers may be larger than the message). `*consumed` receives
// the message size when non-null.
Result<Message> Decode(std::span<const uint8_t> in, size_t* consumed = nullptr);

// CRC-32C (Castagnoli), as used by echo and end-to-end checksums.
uint32_t Crc32c(std::span<const uint8_t> data, uint32_t seed = 0);

}  // namespace vsocket::proto
