#include "guest/core/fake_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace vsocket::guest::testing {

FakeTransport::FakeTransport(size_t memory_bytes, uint16_t queue_size)
    : bytes_(memory_bytes), mem_(static_cast<uint8_t*>(std::aligned_alloc(4096, memory_bytes))) {
  std::memset(mem_, 0, bytes_);
  allocator_ = vhost::RegionAllocator(mem_, bytes_);
  guest_ = std::make_unique<vhost::GuestMemory>(
      std::move(vhost::GuestMemory::Create({{Gpa(mem_), bytes_, mem_}}).value()));
  for (Queue& q : queues_) {
    uint8_t* ring_mem = allocator_.Allocate(vhost::SplitRing::BytesFor(queue_size), 4096);
    vhost::SplitRing ring = vhost::SplitRing::LayOut(ring_mem, queue_size);
    q.driver = vhost::VirtqueueDriver(ring, /*event_idx=*/true);
    q.device = vhost::VirtqueueDevice(ring, guest_.get(), /*event_idx=*/true, 0, 0);
    q.wake = UniqueFd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  }
  int p[2];
  if (pipe2(p, O_CLOEXEC | O_NONBLOCK) == 0) {
    liveness_[0] = UniqueFd(p[0]);
    liveness_[1] = UniqueFd(p[1]);
  }
}

FakeTransport::~FakeTransport() {
  guest_.reset();
  std::free(mem_);
}

void FakeTransport::Kick(QueueId q) {
  if (q == QueueId::kRequests) ServeRequests();
}

void FakeTransport::ServeRequests() {
  if (wedged_) return;
  Queue& q = queues_[Index(QueueId::kRequests)];
  vhost::DescChain chain;
  bool any = false;
  // Asks for the next kick before the last look (EnableNotify: true if
  // requests came meanwhile), as a backend about to sleep does.
  for (;;) {
    if (q.device.Pop(&chain) != vhost::PopResult::kChain) {
      if (q.device.EnableNotify()) continue;
      break;
    }
    uint8_t buf[256];
    size_t n = chain.CopyOut({buf, sizeof(buf)});
    auto m = proto::Decode({buf, n});
    uint32_t written = 0;
    if (m.ok()) {
      requests_.push_back(*m);
      std::optional<proto::Message> answer = responder_ ? responder_(*m) : std::nullopt;
      if (answer && chain.writable_bytes > 0) {
        answer->request_id = m->request_id;
        uint8_t out[256];
        auto len = proto::Encode(*answer, {out, sizeof(out)});
        if (len.ok()) written = static_cast<uint32_t>(chain.CopyIn({out, *len}));
      }
    }
    q.device.Push(chain.head, written);
    any = true;
  }
  if (any && q.device.PublishUsed()) {
    uint64_t one = 1;
    (void)!write(q.wake.get(), &one, sizeof(one));
  }
}

bool FakeTransport::PostEvent(const proto::Message& m) {
  Queue& q = queues_[Index(QueueId::kEvents)];
  vhost::DescChain chain;
  if (q.device.Pop(&chain) != vhost::PopResult::kChain) return false;
  uint8_t out[256];
  auto len = proto::Encode(m, {out, sizeof(out)});
  uint32_t written = len.ok() ? static_cast<uint32_t>(chain.CopyIn({out, *len})) : 0;
  q.device.Push(chain.head, written);
  if (q.device.PublishUsed() && !calls_lost_) {
    uint64_t one = 1;
    (void)!write(q.wake.get(), &one, sizeof(one));
  }
  return true;
}

void FakeTransport::KillBackend() { liveness_[1].reset(); }

bool FakeTransport::BackendGone() const {
  pollfd p{liveness_[0].get(), POLLIN, 0};
  return poll(&p, 1, 0) != 0;
}

void FakeTransport::CloseFdsAfterFork() {
  for (Queue& q : queues_) q.wake.reset();
  liveness_[0].reset();
  liveness_[1].reset();
}

}  // namespace vsocket::guest::testing
