// What vsocket-guestd hands an application process over its Unix socket
// (SOCK_SEQPACKET, one message, SCM_RIGHTS): the VM's vSocket device's two
// queues and the memory they and the session's buffers live in.
//
// fds, in order: the DMA memfd (hugetlb, sealed size), then a kick eventfd
// per queue (the process writes; the agent rings the device's doorbell),
// then a call eventfd per queue (the agent writes on the device's
// interrupt). The process owns the queues' driver side until it closes the
// socket; the agent then resets the device (vsocketd: device stopped, its
// connections closed as when a process exits) and sets up a fresh one for
// the next process.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vsocket::agent {

inline constexpr uint32_t kGrantMagic = 0x56534741;  // "AGSV"
inline constexpr uint32_t kGrantVersion = 1;
inline constexpr size_t kGrantMaxPages = 64;
inline constexpr size_t kGrantFds = 5;
inline constexpr uint64_t kGrantPageBytes = 2u << 20;

enum class GrantStatus : uint32_t {
  kOk = 0,
  kBusy = 1,  // another process holds the device (one session per device today)
  kDeviceFailed = 2,
  // vsocketd is not attached to the VM's free functions now (their link is
  // down: it died or is restarting); ask again later.
  kBackendAway = 3,
};

struct Grant {
  uint32_t magic = kGrantMagic;
  uint32_t version = kGrantVersion;
  GrantStatus status = GrantStatus::kOk;
  uint16_t queue_size = 0;
  uint16_t event_idx = 0;  // 1: VIRTIO_F_EVENT_IDX negotiated
  uint64_t memory_bytes = 0;  // the memfd's size, a multiple of kGrantPageBytes
  uint64_t ring_offset[2] = {};  // each queue's desc|avail|used (SplitRing::LayOut) in the memfd
  uint64_t pool_offset = 0;  // the session's to allocate from (never across a page)
  uint64_t pool_bytes = 0;
  uint32_t num_pages = 0;
  uint32_t reserved = 0;
  uint64_t page_gpa[kGrantMaxPages] = {};  // guest-physical address of each 2 MiB page
};

}  // namespace vsocket::agent
