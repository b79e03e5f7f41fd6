// Process mode (containers and the test beds' "VMs"): the process is its own
// vhost-user frontend, as DPDK's virtio-user is. Its region is a sealed memfd
// shared with vsocketd, registered with guest-physical == virtual addresses;
// the backend's Unix socket hanging up is its liveness; socket proofs go
// over the port's proof socket, tied to the region's memfd.
#pragma once

#include <memory>

#include "guest/core/transport.h"
#include "vhost/user/frontend.h"

namespace vsocket::guest {

class ProcessTransport final : public Transport {
 public:
  // Connects to vsocketd at the configured socket (guest/core/config.h) and
  // negotiates the device; fails at once if nothing listens there (the
  // caller retries later). kPermissionDenied says what would let us in.
  static Result<std::unique_ptr<Transport>> Open();

  vhost::VirtqueueDriver& queue(QueueId q) override { return fe_->queue(static_cast<size_t>(q)); }
  void Kick(QueueId q) override { fe_->Kick(static_cast<size_t>(q)); }
  int wake_fd(QueueId q) const override { return fe_->call_fd(static_cast<size_t>(q)); }
  int liveness_fd() const override { return fe_->socket_fd(); }
  // The backend never writes to the socket unasked: readable means gone.
  bool BackendGone() const override { return fe_->BackendGone(); }
  vhost::RegionAllocator& allocator() override { return fe_->allocator(); }
  size_t memory_bytes() const override { return fe_->region().size(); }
  uint64_t Gpa(const void* p) const override { return reinterpret_cast<uint64_t>(p); }
  Status OpenProofs() override { return fe_->OpenProofChannel(); }
  bool proves_sockets() const override { return fe_->proves_sockets(); }
  Status ProveSocket(int fd) override { return fe_->ProveSocket(fd); }
  Result<DirectFds> FetchDirect(uint64_t token) override {
    DirectFds out;
    Status st = fe_->FetchDirect(token, &out.memory, &out.wake, &out.side);
    if (!st.ok()) return st;
    return out;
  }
  void CloseFdsAfterFork() override { fe_->CloseFdsAfterFork(); }
  void ReleaseMemory() override { fe_->ReleaseRegion(); }
  CpuShare BackendCpus() const override { return BackendCpuShare(fe_->socket_fd()); }

 private:
  explicit ProcessTransport(std::unique_ptr<vhost::VhostUserFrontend> fe) : fe_(std::move(fe)) {}
  std::unique_ptr<vhost::VhostUserFrontend> fe_;
};

}  // namespace vsocket::guest
