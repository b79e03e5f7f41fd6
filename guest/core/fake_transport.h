// A transport for unit tests: the session's queues and ring memory in this
// process's heap, and vsocketd's side of both queues in the test's hands.
// Requests are answered synchronously at the session's kick by the test's
// responder; events are posted with PostEvent; KillBackend makes the
// liveness fd readable, as a backend that died would.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "base/unique_fd.h"
#include "guest/core/transport.h"
#include "proto/control.h"
#include "vhost/region/guest_memory.h"
#include "vhost/ring/virtqueue_device.h"

namespace vsocket::guest::testing {

class FakeTransport final : public Transport {
 public:
  // Answers one request (nullopt: no answer, e.g. fire-and-forget posts).
  using Responder = std::function<std::optional<proto::Message>(const proto::Message&)>;

  explicit FakeTransport(size_t memory_bytes = 8 << 20, uint16_t queue_size = 256);
  ~FakeTransport() override;

  // The test's side.
  void set_responder(Responder r) { responder_ = std::move(r); }
  // Every request the session sent, in order.
  const std::vector<proto::Message>& requests() const { return requests_; }
  // Delivers an event into the next event buffer the session posted; false
  // if it has none.
  bool PostEvent(const proto::Message& m);
  void KillBackend();
  // Requests go unanswered (a wedged backend) until false again.
  void set_wedged(bool w) { wedged_ = w; }
  // Events are published without their call (a frontend that gave the
  // backend no call eventfd: decision 128) until false again.
  void set_calls_lost(bool l) { calls_lost_ = l; }

  // Transport.
  vhost::VirtqueueDriver& queue(QueueId q) override { return queues_[Index(q)].driver; }
  void Kick(QueueId q) override;
  int wake_fd(QueueId q) const override { return queues_[Index(q)].wake.get(); }
  int liveness_fd() const override { return liveness_[0].get(); }
  bool BackendGone() const override;
  vhost::RegionAllocator& allocator() override { return allocator_; }
  size_t memory_bytes() const override { return bytes_; }
  uint64_t Gpa(const void* p) const override { return reinterpret_cast<uint64_t>(p); }
  Status OpenProofs() override { return Status(Code::kNotFound, "the fake asks for no proofs"); }
  bool proves_sockets() const override { return static_cast<bool>(prover_); }
  Status ProveSocket(int fd) override { return prover_ ? prover_(fd) : Status::Ok(); }
  // Socket proofs answered by the test (none asked for while unset).
  void set_prover(std::function<Status(int)> p) { prover_ = std::move(p); }
  void CloseFdsAfterFork() override;
  void ReleaseMemory() override { ++releases_; }
  // How many times the session gave the memory back.
  int releases() const { return releases_; }
  CpuShare BackendCpus() const override { return cpus_; }
  // What BackendCpus answers (default: no CPU shared, nothing held).
  void set_backend_cpus(CpuShare c) { cpus_ = c; }
  // Direct pairs (decision 97): the next FetchDirect hands out these (any
  // token), or refuses once they are taken.
  void set_direct(UniqueFd memory, UniqueFd wake, uint32_t side) {
    direct_ = DirectFds{std::move(memory), std::move(wake), side};
  }
  Result<DirectFds> FetchDirect(uint64_t) override {
    if (!direct_.memory) return Status(Code::kNotFound, "the fake has no direct pair to give");
    return std::move(direct_);
  }

 private:
  static size_t Index(QueueId q) { return static_cast<size_t>(q); }
  struct Queue {
    vhost::VirtqueueDriver driver;
    vhost::VirtqueueDevice device;
    UniqueFd wake;
  };
  void ServeRequests();
  CpuShare cpus_{};

  size_t bytes_;
  uint8_t* mem_;
  vhost::RegionAllocator allocator_{nullptr, 0};
  std::unique_ptr<vhost::GuestMemory> guest_;
  Queue queues_[2];
  UniqueFd liveness_[2];  // a pipe: [0] becomes readable when the backend "dies"
  Responder responder_;
  std::function<Status(int)> prover_;
  std::vector<proto::Message> requests_;
  bool wedged_ = false;
  bool calls_lost_ = false;
  int releases_ = 0;
  DirectFds direct_;
};

}  // namespace vsocket::guest::testing
