// vhost-user protocol messages (vhost-user spec, "Message types"), the subset
// vSocket's process-mode frontend speaks. Layouts are the spec's; integers
// are in host (little-endian) order as the spec requires.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vsocket::vhost::user {

enum class Request : uint32_t {
  kGetFeatures = 1,
  kSetFeatures = 2,
  kSetOwner = 3,
  kResetOwner = 4,
  kSetMemTable = 5,
  kSetLogBase = 6,
  kSetLogFd = 7,
  kSetVringNum = 8,
  kSetVringAddr = 9,
  kSetVringBase = 10,
  kGetVringBase = 11,
  kSetVringKick = 12,
  kSetVringCall = 13,
  kSetVringErr = 14,
  kGetProtocolFeatures = 15,
  kSetProtocolFeatures = 16,
  kGetQueueNum = 17,
  kSetVringEnable = 18,
  kSetStatus = 39,
  kGetStatus = 40,
};
const char* ToString(Request r);

inline constexpr uint32_t kFlagVersion = 0x1;
inline constexpr uint32_t kFlagReply = 0x4;
inline constexpr uint32_t kFlagNeedReply = 0x8;
inline constexpr uint32_t kFlagVersionMask = 0x3;

// Protocol feature bits (GET/SET_PROTOCOL_FEATURES).
inline constexpr uint64_t kProtoMq = 1ull << 0;
inline constexpr uint64_t kProtoLogShmfd = 1ull << 1;  // SET_LOG_BASE passes the dirty log's fd
inline constexpr uint64_t kProtoReplyAck = 1ull << 3;
inline constexpr uint64_t kProtoConfig = 1ull << 9;
inline constexpr uint64_t kProtoStatus = 1ull << 16;

// Vring-fd messages (KICK/CALL/ERR): index in bits 0-7, bit 8 = no fd.
inline constexpr uint64_t kVringIndexMask = 0xff;
inline constexpr uint64_t kVringNoFd = 1ull << 8;

// virtio device status bits (virtio spec 2.1).
inline constexpr uint64_t kStatusAcknowledge = 1;
inline constexpr uint64_t kStatusDriver = 2;
inline constexpr uint64_t kStatusDriverOk = 4;
inline constexpr uint64_t kStatusFeaturesOk = 8;

inline constexpr size_t kMaxMemRegions = 8;
inline constexpr size_t kMaxFds = 8;

struct Header {
  uint32_t request;
  uint32_t flags;
  uint32_t size;  // payload bytes that follow
};
static_assert(sizeof(Header) == 12);

struct VringState {
  uint32_t index;
  uint32_t num;
};

struct VringAddr {
  uint32_t index;
  uint32_t flags;
  uint64_t desc_user_addr;
  uint64_t used_user_addr;
  uint64_t avail_user_addr;
  uint64_t log_guest_addr;
};
static_assert(sizeof(VringAddr) == 40);

struct MemoryRegionDesc {
  uint64_t guest_phys_addr;
  uint64_t memory_size;
  uint64_t userspace_addr;
  uint64_t mmap_offset;
};

struct Memory {
  uint32_t nregions;
  uint32_t padding;
  MemoryRegionDesc regions[kMaxMemRegions];
};

union Payload {
  uint64_t u64;
  VringState state;
  VringAddr addr;
  Memory memory;
};

// On the wire the payload follows the 12-byte header directly.
struct __attribute__((packed)) Message {
  Header hdr;
  Payload payload;
};
static_assert(offsetof(Message, payload) == 12);

}  // namespace vsocket::vhost::user
