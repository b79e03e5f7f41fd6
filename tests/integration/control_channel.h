// Guest side of the control protocol: request/response calls over the
// request virtqueue of a vhost-user session. One slot (request + response
// buffer) per in-flight call lives in the shared region.
//
// Waiting: kPoll spins on the used ring (lowest latency, burns a core while
// waiting — for benchmarks and the busy phase), kEvent sleeps on the call
// eventfd, kAdaptive polls for `poll_us` then sleeps (the default).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "base/status.h"
#include "proto/control.h"
#include "vhost/user/frontend.h"

namespace vsocket::guest {

enum class WaitMode { kPoll, kEvent, kAdaptive };

struct ChannelOptions {
  vhost::FrontendOptions frontend;
  WaitMode wait = WaitMode::kAdaptive;
  int poll_us = 20;
};

class ControlChannel {
 public:
  static Result<std::unique_ptr<ControlChannel>> Open(const ChannelOptions& options);

  // One synchronous call. The response is decoded into *out; its payload
  // (for ECHO) points into `scratch`, which must hold kMaxMessageSize bytes.
  Status Call(const proto::Message& request, proto::Message* out, std::span<uint8_t> scratch, int timeout_ms = 5000);

  // Pipelined use: queue requests (not yet visible), Flush() publishes and
  // kicks once, Reap() returns completions as (cookie, response bytes).
  Status Submit(const proto::Message& request, uint64_t cookie);
  void Flush();
  struct Completion {
    uint64_t cookie;
    std::span<const uint8_t> response;  // valid until the next Submit()
  };
  // Waits (per the wait mode) up to timeout_ms for at least one completion.
  Status Reap(std::vector<Completion>* out, int timeout_ms);
  size_t in_flight() const { return slots_.size() - free_slots_.size(); }
  size_t capacity() const { return slots_.size(); }

  // Re-establishes the session (e.g. after a backend restart). Calls that
  // were in flight are failed: their slots are reclaimed and their cookies
  // returned, so callers can retry them.
  Result<std::vector<uint64_t>> Reconnect();

  vhost::VhostUserFrontend& frontend() { return *frontend_; }
  // Waits that slept to their deadline with no call while the answer was
  // there all along: a call the backend owed and never made (a guest that
  // sleeps without a deadline would sleep for good).
  uint64_t uncalled_answers() const { return uncalled_answers_; }

 private:
  struct Slot {
    uint8_t* req;
    uint8_t* resp;
    uint64_t cookie;
  };
  explicit ControlChannel(const ChannelOptions& o) : options_(o) {}
  bool WaitForUsed(int64_t deadline_ns);

  ChannelOptions options_;
  std::unique_ptr<vhost::VhostUserFrontend> frontend_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  bool pending_publish_ = false;
  uint64_t uncalled_answers_ = 0;
};

}  // namespace vsocket::guest
