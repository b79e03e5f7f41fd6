// The connection manager's counters: daemon-wide totals and totals per VM.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>

#include "proto/control.h"

namespace vsocket::backend {

struct ConnManagerCounters {
  std::atomic<uint64_t> registered{0};
  std::atomic<uint64_t> rejected_spoofed{0};
  std::atomic<uint64_t> rejected_unproven{0};  // a socket its process did not prove it holds
  std::atomic<uint64_t> rejected_other{0};
  std::atomic<uint64_t> upgrades{0};
  std::atomic<uint64_t> cross_tenant{0};
  std::atomic<uint64_t> accel_bytes{0};
  std::atomic<uint64_t> protocol_violations{0};
  std::atomic<uint64_t> events{0};
  std::atomic<uint64_t> event_stalls{0};  // events waiting for guest buffers
  std::atomic<uint64_t> active{0};
  // Doorbells (kFeatureDoorbell).
  std::atomic<uint64_t> doorbell_sessions{0};  // HELLOs that took the doorbell
  std::atomic<uint64_t> doorbell_counts{0};    // counts read from blocks (polled, or just before a message)
  std::atomic<uint64_t> doorbell_messages{0};  // TX_TAIL/CONSUMED of doorbell conns (backend had armed)
  std::atomic<uint64_t> doorbell_arms{0};      // blocks armed (then left the polled set)
  // Cross-host.
  std::atomic<uint64_t> pair_requests_sent{0};
  std::atomic<uint64_t> pair_requests_received{0};
  std::atomic<uint64_t> pair_refused{0};  // a peer host asked for what it does not run
  // Pairing requests kept until the directory places their requester on
  // its host (decision 104).
  std::atomic<uint64_t> pair_unconfirmed{0};
  // Decision 63: registrations kept on kernel TCP (kernel-faster) told to the
  // peer's host (PAIR_DECLINE, or PAIR_REJECT of its kept request), and
  // declines heard from peer hosts.
  std::atomic<uint64_t> pair_declines_sent{0};
  std::atomic<uint64_t> pair_declines_received{0};
  // Registrations left on kernel TCP by an unreachable directory whose
  // decline went to no peer host (over kMaxDirectoryDeclinesPerSecond).
  std::atomic<uint64_t> pair_declines_unsent{0};
  std::atomic<uint64_t> remote_upgrades{0};
  std::atomic<uint64_t> fabric_bytes_out{0};
  std::atomic<uint64_t> fabric_bytes_in{0};
  std::atomic<uint64_t> fabric_bytes_placed{0};      // of fabric_bytes_in: written one-sided into the RX ring (rdma)
  std::atomic<uint64_t> rdma_rx_regions{0};          // guest RX rings registered for peer hosts (total)
  std::atomic<uint64_t> rdma_rx_regions_dropped{0};  // ... and deregistered again (total)
  std::atomic<uint64_t> rdma_rx_withdrawn{0};        // of those: after the peer acknowledged a PLACEMENT
  std::atomic<uint64_t> rdma_tx_regions{0};          // guest TX rings registered for sends to read in place (total)
  std::atomic<uint64_t> rdma_tx_regions_dropped{0};  // ... and withdrawn again (total)
  std::atomic<uint64_t> rdma_reg_us{0};     // time the registrar spent registering guest rings (RX and TX, microseconds, total; off the worker)
  std::atomic<uint64_t> rdma_reg_discarded{0};  // made (off the worker) but no longer wanted: dropped
  std::atomic<uint64_t> credit_held{0};     // credits held back: the peer consumed bytes a send still read
  std::atomic<uint64_t> rings_held{0};      // UNREGISTERs answered rings-held (kFeatureRingHold)
  std::atomic<uint64_t> rings_released{0};  // ... and RINGS_RELEASED owed afterwards
  std::atomic<uint64_t> frames_dropped{0};  // unknown handle, wrong tenant or wrong host
  std::atomic<uint64_t> frames_cross_tenant{0};
  std::atomic<uint64_t> fabric_violations{0};  // a frame outside the window: that connection is reset
  std::atomic<uint64_t> fabric_downgrades{0};  // connections taken off the fabric (link lost)
  std::atomic<uint64_t> orphan_bytes{0};       // gauge: closed connections' undelivered bytes, copied
  std::atomic<uint64_t> orphan_resets{0};      // closes reset for want of orphan budget
  std::atomic<uint64_t> migration_leaves{0};   // upgraded connections whose VM moved with them on the rings (decision 106)
  // Their peers outside the VM (another VM here, a peer host's guest) told
  // to finish on kernel TCP through RESYNC (decision 110).
  std::atomic<uint64_t> migration_peers_resynced{0};
  std::atomic<uint64_t> rejected_overlap{0};   // registrations whose rings overlap another's
  std::atomic<uint64_t> kept_kernel_faster{0};  // bulk registrations kept on kernel TCP (decision 62)
  std::atomic<uint64_t> tentative_registered{0};  // registrations of busy loops' connections (decision 83)
  std::atomic<uint64_t> tentative_expired{0};     // of those, withdrawn: no peer registered in time
  std::atomic<uint64_t> direct_declined{0};       // registrations for a direct pair that could not have one (decision 98)
  // Drains (docs/connection-lifecycle.md §9).
  std::atomic<uint64_t> drains_asked{0};  // connections asked to leave the rings
  std::atomic<uint64_t> ring_ends{0};     // SHUTDOWN(ring end)s from guests: directions that left the rings
  std::atomic<uint64_t> drains_done{0};   // connections both of whose directions left the rings
  // Moving guests (vsocketctl migrate).
  std::atomic<uint64_t> vms_left{0};          // VMs that left this host (migrate begin)
  std::atomic<uint64_t> vms_arrived{0};       // VMs that run here from then on (migrate end)
  std::atomic<uint64_t> migration_resets{0};  // connections a leaving VM still had on the rings: reset
  std::atomic<uint64_t> fork_resyncs{0};      // connections a forking process took back to kernel TCP
  std::atomic<uint64_t> fork_refused{0};      // ... that could not be (the child is told ECONNRESET)
  std::atomic<uint64_t> moved_back{0};        // busy-loop connections drained back to kernel TCP (decision 92)
  std::atomic<uint64_t> direct_pairs{0};      // pairs handed a ring pair of their own (decision 97)
  std::atomic<uint64_t> direct_failed{0};     // ... that could not be (memory, fds): through vsocketd instead
  std::atomic<uint64_t> direct_unmapped{0};   // ... one side of which could not map it: resent on kernel TCP (decision 135)
  std::atomic<uint64_t> direct_bytes{0};      // bytes direct pairs moved (their libraries' counts, never copied here)
  std::atomic<uint64_t> pair_moved{0};        // PAIR_REQUESTs answered or refused "the VM moved"
};

// Totals per VM (indexed by PortConfig::index), kept when connections close.
inline constexpr size_t kMaxVms = 1024;
// The reasons vsocketd gives a guest for kernel TCP, counted per VM
// (VmTotals::fallbacks) in this order; any other (a peer host's) last.
inline constexpr proto::Reason kCountedFallbacks[] = {
    proto::Reason::kPeerNotRegistered, proto::Reason::kCrossTenant,  proto::Reason::kSpoofedAddress,
    proto::Reason::kResourceLimit,      proto::Reason::kProtocolError, proto::Reason::kFabricDown,
    proto::Reason::kPeerDowngraded,     proto::Reason::kKernelFaster,  proto::Reason::kDirectoryUnavailable};
inline constexpr size_t kFallbackReasons = std::size(kCountedFallbacks) + 1;
constexpr size_t FallbackSlot(proto::Reason r) {
  for (size_t i = 0; i < std::size(kCountedFallbacks); ++i)
    if (kCountedFallbacks[i] == r) return i;
  return kFallbackReasons - 1;
}
struct VmTotals {
  std::atomic<uint64_t> accel_bytes_out{0};
  std::atomic<uint64_t> accel_bytes_in{0};
  std::atomic<uint64_t> upgrades{0};
  std::atomic<uint64_t> registrations{0};
  std::atomic<uint64_t> orphan_bytes{0};  // gauge, as ConnCounters::orphan_bytes
  // Connections that ended up on kernel TCP, by the reason the guest was
  // given (FallbackSlot): refused registrations, DOWNGRADEs, and
  // registrations that ended still waiting for a peer.
  std::array<std::atomic<uint64_t>, kFallbackReasons> fallbacks{};
};

}  // namespace vsocket::backend
