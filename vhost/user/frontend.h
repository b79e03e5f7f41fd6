// vhost-user frontend for container/process guests: what QEMU does for a VM,
// done by the guest process itself (like DPDK's virtio-user), without DPDK.
//
// It owns a memfd region holding the virtqueues and the data area, connects
// to the backend's per-VM Unix socket, and negotiates: features, protocol
// features (REPLY_ACK, STATUS), memory table (SCM_RIGHTS), vrings, kick/call
// eventfds, DRIVER_OK. Guest-physical addresses are this process's virtual
// addresses (the region is registered with gpa == userspace_addr).
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "vhost/region/shm_region.h"
#include "vhost/ring/virtqueue_driver.h"
#include "vhost/user/protocol.h"

namespace vsocket::vhost {

struct FrontendOptions {
  std::string socket_path;
  uint16_t num_queues = 2;
  uint16_t queue_size = 256;
  size_t region_bytes = 4u << 20;  // rings + data area
  bool event_idx = true;
  int timeout_ms = 5000;  // per reply
  // How long connect() retries a socket that is missing or not listening
  // (a backend starting): -1 for timeout_ms, 0 to fail at once (the
  // library: it tries again later rather than stall the application).
  int connect_wait_ms = -1;
  ShmRegion::Pages pages = ShmRegion::Pages::kNormal;
  ShmRegion::Seal seal = ShmRegion::Seal::kSizeSealed;  // kUnsealed: hostile-frontend tests only
  // Device feature bits to request on top of VERSION_1 and EVENT_IDX.
  uint64_t device_features = 0;
};

class VhostUserFrontend {
 public:
  static Result<std::unique_ptr<VhostUserFrontend>> Create(const FrontendOptions& options);
  ~VhostUserFrontend();

  // (Re)establishes the session. Any previous session's queues are reset:
  // chains in flight are dropped (their cookies are returned by
  // TakeAbandoned()), and the rings restart at index 0.
  Status Connect();
  // Connects the socket without negotiating (tests that speak raw messages).
  Status OpenSocket();
  // Clean stop: GET_VRING_BASE on every queue (the backend stops using the
  // rings before replying), then closes the socket.
  Status Stop();
  bool connected() const { return sock_.valid(); }
  // In a forked child: close our copies of the session's fds (the parent
  // keeps the session; an open copy would keep its device alive).
  void CloseFdsAfterFork();
  // True if the backend closed the socket (crash or restart).
  bool BackendGone() const;

  // Process mode (vhost/user/proof.h): opens the port's proof socket and
  // ties it to this session's device by passing the memfd of its region.
  // kNotFound: the port has none (the backend does not ask for proofs).
  Status OpenProofChannel() EXCLUDES(proof_mu_);
  bool proves_sockets() const { return proof_wanted_.load(std::memory_order_relaxed); }
  // Proves that this process holds connected TCP socket `fd`: the backend
  // then accepts one registration of its 4-tuple. Thread-safe.
  Status ProveSocket(int fd) EXCLUDES(proof_mu_);
  // A direct pair's memory and its peer's wake eventfd, by the token of a
  // DIRECT event (proof::Op::kDirectFetch; decision 97).
  Status FetchDirect(uint64_t token, UniqueFd* memory, UniqueFd* wake, uint32_t* side) EXCLUDES(proof_mu_);

  VirtqueueDriver& queue(size_t i) { return queues_[i].driver; }
  size_t num_queues() const { return queues_.size(); }
  void Kick(size_t i);
  int call_fd(size_t i) const { return queues_[i].call.get(); }
  // Waits up to timeout_ms for a call on queue i; true if one arrived.
  bool WaitCall(size_t i, int timeout_ms);
  std::vector<uint64_t> TakeAbandoned();

  ShmRegion& region() { return *region_; }
  // A lost session's: the region's memory goes back (ShmRegion::Release).
  void ReleaseRegion() { region_->Release(); }
  RegionAllocator& allocator() { return allocator_; }
  uint64_t features() const { return features_; }
  uint64_t protocol_features() const { return protocol_features_; }

  // Raw protocol access, for tests that play a hostile frontend.
  Status SendMessage(const user::Message& msg, std::span<const int> fds = {});
  Result<user::Message> ReceiveReply(user::Request expected);
  int socket_fd() const { return sock_.get(); }

 private:
  struct Queue {
    SplitRing ring;
    VirtqueueDriver driver;
    UniqueFd kick;
    UniqueFd call;
  };

  explicit VhostUserFrontend(const FrontendOptions& options) : options_(options) {}
  Status Handshake();
  // Sends a SET_* message; waits for the ack when REPLY_ACK is negotiated.
  Status Set(user::Request req, const user::Payload& payload, uint32_t size, std::span<const int> fds = {});
  Result<uint64_t> GetU64(user::Request req);

  FrontendOptions options_;
  std::unique_ptr<ShmRegion> region_;
  RegionAllocator allocator_{nullptr, 0};
  std::vector<Queue> queues_;
  UniqueFd sock_;
  uint64_t features_ = 0;
  uint64_t protocol_features_ = 0;
  std::vector<uint64_t> abandoned_;
  Mutex proof_mu_;  // one request at a time on the proof channel
  UniqueFd proof_ GUARDED_BY(proof_mu_);
  Status ProofRequest(uint32_t op, int fd) REQUIRES(proof_mu_);
  Status AwaitProofAnswer() REQUIRES(proof_mu_);
  Status OpenProofChannelLocked() REQUIRES(proof_mu_);
  std::atomic<bool> proof_wanted_{false};  // the port has a proof socket (the last open found one)
};

}  // namespace vsocket::vhost
