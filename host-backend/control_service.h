// The guest<->backend control protocol (proto/control.h) on the request
// queue. This first version answers HELLO and ECHO; connection messages are
// refused with BAD_MESSAGE until the connection registry lands.
#pragma once

#include <atomic>

#include "host-backend/worker.h"

namespace vsocket::backend {

struct ServiceCounters {
  std::atomic<uint64_t> hellos{0};
  std::atomic<uint64_t> echoes{0};
  std::atomic<uint64_t> echo_bytes{0};
  std::atomic<uint64_t> bad_messages{0};
  std::atomic<uint64_t> checksum_errors{0};
};

class ControlService : public DeviceService {
 public:
  uint32_t HandleRequest(vhost::BackendDevice& device, const vhost::DescChain& chain) override;
  const ServiceCounters& counters() const { return counters_; }

 private:
  ServiceCounters counters_;
};

}  // namespace vsocket::backend
