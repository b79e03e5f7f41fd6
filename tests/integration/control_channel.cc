#include "tests/integration/control_channel.h"

#include <time.h>

#include <cstring>

#include "base/clock.h"

namespace vsocket::guest {
namespace {

constexpr uint32_t kSlotBytes = proto::kMaxMessageSize;
constexpr size_t kRequestQueue = 0;

}  // namespace

Result<std::unique_ptr<ControlChannel>> ControlChannel::Open(const ChannelOptions& options) {
  std::unique_ptr<ControlChannel> c(new ControlChannel(options));
  auto fe = vhost::VhostUserFrontend::Create(options.frontend);
  if (!fe.ok()) return fe.status();
  c->frontend_ = std::move(fe).value();
  // Each call uses two descriptors: at most queue_size / 2 in flight.
  size_t nslots = options.frontend.queue_size / 2;
  for (size_t i = 0; i < nslots; ++i) {
    uint8_t* mem = c->frontend_->allocator().Allocate(2 * kSlotBytes);
    if (mem == nullptr) return Status(Code::kResourceExhausted, "region too small for call slots");
    c->slots_.push_back({mem, mem + kSlotBytes, 0});
    c->free_slots_.push_back(static_cast<uint32_t>(nslots - 1 - i));
  }
  VS_RETURN_IF_ERROR(c->frontend_->Connect());
  if (options.wait == WaitMode::kPoll) c->frontend_->queue(kRequestQueue).DisableInterrupts();
  return c;
}

Result<std::vector<uint64_t>> ControlChannel::Reconnect() {
  pending_publish_ = false;
  VS_RETURN_IF_ERROR(frontend_->Connect());
  std::vector<uint64_t> failed;
  for (uint64_t slot : frontend_->TakeAbandoned()) {
    free_slots_.push_back(static_cast<uint32_t>(slot));
    failed.push_back(slots_[slot].cookie);
  }
  if (options_.wait == WaitMode::kPoll) frontend_->queue(kRequestQueue).DisableInterrupts();
  return failed;
}

Status ControlChannel::Submit(const proto::Message& request, uint64_t cookie) {
  if (free_slots_.empty()) return Status(Code::kResourceExhausted, "all call slots in flight");
  uint32_t s = free_slots_.back();
  Slot& slot = slots_[s];
  auto n = proto::Encode(request, {slot.req, kSlotBytes});
  if (!n.ok()) return n.status();
  vhost::VirtqueueDriver::Buf out{reinterpret_cast<uint64_t>(slot.req), static_cast<uint32_t>(*n)};
  vhost::VirtqueueDriver::Buf in{reinterpret_cast<uint64_t>(slot.resp), kSlotBytes};
  auto head = frontend_->queue(kRequestQueue).Add({&out, 1}, {&in, 1}, s);
  if (!head.ok()) return head.status();
  free_slots_.pop_back();
  slot.cookie = cookie;
  pending_publish_ = true;
  return Status::Ok();
}

void ControlChannel::Flush() {
  if (!pending_publish_) return;
  pending_publish_ = false;
  if (frontend_->queue(kRequestQueue).Publish()) frontend_->Kick(kRequestQueue);
}

bool ControlChannel::WaitForUsed(int64_t deadline_ns) {
  vhost::VirtqueueDriver& q = frontend_->queue(kRequestQueue);
  auto has_used = [&] { return q.ring().used_idx().load(std::memory_order_acquire) != q.last_used_idx(); };
  int64_t poll_until = options_.wait == WaitMode::kPoll    ? deadline_ns
                       : options_.wait == WaitMode::kEvent ? 0
                                                           : MonotonicNs() + int64_t{options_.poll_us} * 1000;
  for (;;) {
    if (has_used()) return true;
    int64_t now = MonotonicNs();
    if (now >= deadline_ns) return false;
    if (now < poll_until) {
      __builtin_ia32_pause();
      continue;
    }
    // Sleep: ask for a call, re-check, block on the call eventfd.
    if (q.EnableInterrupts()) {
      q.DisableInterrupts();
      return true;
    }
    int wait_ms = static_cast<int>((deadline_ns - now) / 1000000) + 1;
    bool signalled = frontend_->WaitCall(kRequestQueue, wait_ms);
    q.DisableInterrupts();
    if (!signalled && has_used()) ++uncalled_answers_;
    if (!signalled && !has_used()) {
      if (frontend_->BackendGone()) return false;
    }
  }
}

Status ControlChannel::Reap(std::vector<Completion>* out, int timeout_ms) {
  out->clear();
  vhost::VirtqueueDriver& q = frontend_->queue(kRequestQueue);
  int64_t deadline = MonotonicNs() + int64_t{timeout_ms} * 1000000;
  for (;;) {
    while (auto u = q.PopUsed()) {
      Slot& slot = slots_[u->cookie];
      free_slots_.push_back(static_cast<uint32_t>(u->cookie));
      out->push_back({slot.cookie, {slot.resp, u->len}});
    }
    if (q.broken()) return Status(Code::kDataLoss, std::string("request queue: ") + q.broken_reason());
    if (!out->empty()) return Status::Ok();
    if (!WaitForUsed(deadline)) {
      if (frontend_->BackendGone()) return Status(Code::kUnavailable, "backend closed the session");
      return Status(Code::kDeadlineExceeded, "no response from the backend");
    }
  }
}

Status ControlChannel::Call(const proto::Message& request, proto::Message* out, std::span<uint8_t> scratch,
                            int timeout_ms) {
  VS_RETURN_IF_ERROR(Submit(request, request.request_id));
  Flush();
  std::vector<Completion> done;
  VS_RETURN_IF_ERROR(Reap(&done, timeout_ms));
  // Single in-flight call: exactly one completion.
  const Completion& c = done.front();
  if (c.response.size() > scratch.size()) return Status(Code::kOutOfRange, "scratch buffer too small");
  std::memcpy(scratch.data(), c.response.data(), c.response.size());
  auto msg = proto::Decode(scratch.first(c.response.size()));
  if (!msg.ok()) return msg.status();
  *out = *msg;
  return Status::Ok();
}

}  // namespace vsocket::guest
