// What the guest session stands on: the device that carries its two
// virtqueues to vsocketd, and the memory its rings live in.
//
// The session (session.h) speaks vSocket's protocol — registration, events,
// credits, resync, drain, reports — over this interface and knows nothing of
// how the device is reached. Process mode (process_transport.h) is a
// vhost-user frontend of the process's own, with a memfd region whose
// guest-physical addresses are its virtual addresses; in a VM an in-guest
// agent owns the virtio device and hands the process its queues and memory;
// unit tests use a fake with the backend's side in the test
// (fake_transport.h).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "base/status.h"
#include "base/unique_fd.h"
#include "guest/core/cpu_share.h"
#include "vhost/region/shm_region.h"
#include "vhost/ring/virtqueue_driver.h"

namespace vsocket::guest {

// The session's queues.
enum class QueueId : size_t {
  kRequests = 0,  // requests, with in-chain responses where one is asked
  kEvents = 1,    // event buffers the backend fills
};

class Transport {
 public:
  virtual ~Transport() = default;

  // The driver side of a queue. Its rings are in memory the backend reads.
  virtual vhost::VirtqueueDriver& queue(QueueId q) = 0;
  // Tells the backend that queue q has new buffers.
  virtual void Kick(QueueId q) = 0;
  // Becomes readable (an eventfd: read it to re-arm) when the backend used a
  // buffer of queue q while the queue's interrupts were enabled.
  virtual int wake_fd(QueueId q) const = 0;

  // Becomes readable (or hangs up) when the backend went away: a crash, a
  // kill -9, a restart. Every sleeper watches it.
  virtual int liveness_fd() const = 0;
  // One look at liveness_fd(): true if the backend is gone.
  virtual bool BackendGone() const = 0;

  // Memory the backend can address: rings, request slots, event buffers.
  virtual vhost::RegionAllocator& allocator() = 0;
  virtual size_t memory_bytes() const = 0;
  // The address the backend knows p by (p inside allocator()'s memory).
  virtual uint64_t Gpa(const void* p) const = 0;

  // Socket proofs (decision 59): the backend accepts a registration only for
  // a TCP socket this process proved it holds. OpenProofs: kNotFound if the
  // backend does not ask for proofs.
  virtual Status OpenProofs() = 0;
  virtual bool proves_sockets() const = 0;
  virtual Status ProveSocket(int fd) = 0;

  // A direct pair's memory and its peer's wake eventfd (decision 97), by the
  // token of the connection's DIRECT event; which side of the memory is
  // ours. kNotFound where the transport cannot (no proof channel).
  struct DirectFds {
    UniqueFd memory, wake;
    uint32_t side = 0;
  };
  virtual Result<DirectFds> FetchDirect(uint64_t token) {
    (void)token;
    return Status(Code::kNotFound, "this transport has no direct pairs");
  }

  // In a fork child: close our copies of the device's fds, touching none of
  // its memory (the parent's session goes on using it).
  virtual void CloseFdsAfterFork() = 0;

  // The session was lost and nothing reads or writes its rings any more:
  // the memory goes back (a VM's huge pages, a process's region). Its
  // addresses stay reserved, as zero pages of our own, so that a stray
  // late look reads zeros instead of faulting or reading memory reused
  // for something else. The fds stay open (an epoll set may still name
  // them). Once; the transport is not used for I/O again.
  virtual void ReleaseMemory() = 0;

  // Where the backend runs relative to this process's CPUs (cpu_share.h).
  virtual CpuShare BackendCpus() const = 0;
};

// Makes and opens the process's transport; the session calls it when it
// connects. Tests install a fake; nullptr restores process mode.
using TransportFactory = Result<std::unique_ptr<Transport>> (*)();
void SetTransportFactory(TransportFactory f);
Result<std::unique_ptr<Transport>> OpenTransport();

}  // namespace vsocket::guest
