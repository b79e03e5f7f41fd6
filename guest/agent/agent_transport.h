// The guest session's transport inside a VM (guest/core/transport.h): the
// queues and memory vsocket-guestd grants this process (grant.h). Kicks are
// eventfd writes the agent turns into doorbell writes; wake-ups are the
// eventfds the agent signals on the device's interrupt; the agent's socket
// hanging up is the backend going away. Addresses are guest-physical, from
// the grant's page table; allocations never cross a 2 MiB page.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "base/mutex.h"
#include "base/unique_fd.h"
#include "guest/agent/grant.h"
#include "guest/core/config.h"
#include "guest/core/transport.h"

namespace vsocket::agent {

inline constexpr const char* kDefaultAgentSocket = guest::kDefaultAgentSocket;

class AgentTransport final : public guest::Transport {
 public:
  // Connects to the agent at `path` and takes its grant (kUnavailable if
  // no agent listens or another process holds the device).
  static Result<std::unique_ptr<guest::Transport>> Open(const std::string& path);
  // The same in two steps: a SOCK_SEQPACKET connection to `path` (*err:
  // connect's errno, EPROTOTYPE for a stream socket there such as
  // vsocketd's port), then the grant on it (transport_choice.h).
  static Result<UniqueFd> Connect(const std::string& path, int* err = nullptr);
  static Result<std::unique_ptr<guest::Transport>> OpenConnected(UniqueFd sock, const std::string& path);
  ~AgentTransport() override;

  vhost::VirtqueueDriver& queue(guest::QueueId q) override { return queues_[static_cast<size_t>(q)]; }
  void Kick(guest::QueueId q) override;
  int wake_fd(guest::QueueId q) const override { return call_[static_cast<size_t>(q)].get(); }
  int liveness_fd() const override { return sock_.get(); }
  bool BackendGone() const override;
  vhost::RegionAllocator& allocator() override { return *allocator_; }
  size_t memory_bytes() const override { return grant_.pool_bytes; }
  uint64_t Gpa(const void* p) const override;
  // Socket proofs go to the agent (decision 100): PATH.proof, bound by the
  // grant's memfd; kNotFound where the agent has none (the VM's port does
  // not ask for proofs).
  Status OpenProofs() override EXCLUDES(proof_mu_);
  bool proves_sockets() const override { return proves_.load(std::memory_order_acquire); }
  Status ProveSocket(int fd) override EXCLUDES(proof_mu_);
  void CloseFdsAfterFork() override;
  void ReleaseMemory() override;
  // vsocketd runs outside the VM: its CPUs are not ours to see.
  guest::CpuShare BackendCpus() const override { return guest::CpuShare{}; }

 private:
  AgentTransport() = default;
  Status Take(UniqueFd sock, const Grant& g, UniqueFd fds[kGrantFds]);

  Status OpenProofsLocked() REQUIRES(proof_mu_);

  std::string path_;
  Grant grant_;
  UniqueFd sock_;
  UniqueFd memfd_;
  UniqueFd kick_[2];
  UniqueFd call_[2];
  uint8_t* base_ = nullptr;
  vhost::VirtqueueDriver queues_[2];
  std::unique_ptr<vhost::RegionAllocator> allocator_;
  Mutex proof_mu_;
  UniqueFd proof_ GUARDED_BY(proof_mu_);
  std::atomic<bool> proves_{false};
};

}  // namespace vsocket::agent
