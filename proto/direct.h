// The memory of a direct pair (decision 97, issue 37): two processes of one
// host that vsocketd paired share a ring pair of their own, in a sealed
// memfd vsocketd made for that pair alone, and vsocketd leaves the data
// path. This is its layout; guest/core/direct_ring.h maps and checks it.
//
//   0      DirectHeader (64 bytes; vsocketd writes it, nobody changes it)
//   64     DirectSide[0] (64 bytes; side 0 writes its counts here)
//   128    DirectSide[1]
//   4096   side 0's ring (ring_bytes): side 0 writes, side 1 reads
//   4096 + ring_bytes   side 1's ring
//
// Every count is a total since the pair began (the ring stream's byte 0 is
// the byte after the fence, as on vsocketd's rings). Each side writes only
// its own DirectSide, except the other side's want_* flags (the doorbell
// pattern of proto/control.h, with the peer's library in vsocketd's role):
// the reader sets the writer's want_produced before it sleeps, the writer
// clears it and wakes the reader. Both order their store and their look
// at the other's word with a full fence, so one always sees the other's.
// Nothing here is trusted by the side that reads it (direct_ring.h checks).
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/status.h"
#include "base/unique_fd.h"

namespace vsocket::proto {

inline constexpr uint32_t kDirectMagic = 0x52445356;  // "VSDR" little-endian
inline constexpr uint16_t kDirectVersion = 1;
inline constexpr size_t kDirectRingsOffset = 4096;
// The end of a ring stream that has not ended (ring_end, decision 92's
// drain with the end in the shared page).
inline constexpr uint64_t kDirectOpen = ~uint64_t{0};

struct DirectHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved0;
  uint32_t ring_bytes;  // each ring; a power of two (IsValidRingSize)
  uint32_t reserved1;
  uint64_t conn_id[2];  // each side's connection id in its own session
  uint8_t reserved2[32];
};
static_assert(sizeof(DirectHeader) == 64);

struct DirectSide {
  uint64_t produced;        // bytes this side wrote into its ring (total)
  uint64_t consumed;        // bytes this side read from the other's ring (total)
  uint64_t ring_end;        // where this side's ring stream ends (kDirectOpen: not yet)
  uint32_t shut_wr;         // 1: this side shut down writing after `produced`
  uint32_t want_produced;   // the other side sleeps until produced grows (it sets, we clear)
  uint32_t want_consumed;   // the other side waits for room (it sets, we clear)
  // 0: open; 1: `fence` holds this side's FENCE (set once, before its
  // kernel FIN and its first ring byte); 2: closed by the other side, which
  // left the pair first: this side never switches onto it. Changed only by
  // compare-and-swap, by this side (0 -> 1) or the other (0 -> 2): the two
  // agree whether a RESYNC header follows this side's kernel bytes
  // (decision 134).
  uint32_t fence_set;
  uint64_t fence;           // bytes this side sent on the kernel path before its ring stream
  // 1: this side heeds the other's light_* words (decision 114): before it
  // sleeps it fences its asks with a heavy fence (membarrier,
  // base/asym_fence.h) whenever the word for what it asked is set. Set
  // once, before this side's first ask; 0 in memory vsocketd made.
  uint32_t heavy_asks;
  // 1 while this side publishes `produced` (`consumed`) without a full
  // fence: set only once the other side promised heavy_asks, with a full
  // fence after it; cleared when an ask of the other side is taken.
  uint32_t light_produced;
  uint32_t light_consumed;
  // 0: not yet; 1: this side mapped the pair (set by this side, once); 2:
  // the other side, leaving the pair before this one mapped it, decided it
  // never will. Changed only by compare-and-swap, by this side (0 -> 1) or
  // the other (0 -> 2): a side that switched onto the pair and then lost it
  // (vsocketd gone) thus agrees with a side that could not map it (its
  // fetch failed) that the ring stream is resent from byte 0 with no RESYNC
  // header (decision 135). 0 in memory vsocketd made.
  uint32_t attached;
};
static_assert(sizeof(DirectSide) == 64);

inline constexpr size_t kDirectSideOffset[2] = {64, 128};
inline constexpr size_t DirectBytes(uint32_t ring_bytes) { return kDirectRingsOffset + 2 * size_t{ring_bytes}; }
inline constexpr size_t DirectRingOffset(int side, uint32_t ring_bytes) {
  return kDirectRingsOffset + static_cast<size_t>(side) * ring_bytes;
}

// A pair's memory as vsocketd makes it: a memfd of DirectBytes(ring_bytes),
// its header written, every count zero and no ring end, sealed against
// shrinking, growing and further seals (the peer could otherwise truncate
// it under the other side, or seal it against writes).
Result<UniqueFd> MakeDirectMemory(uint32_t ring_bytes, uint64_t conn_id0, uint64_t conn_id1);

}  // namespace vsocket::proto
