// The guest<->backend control protocol (proto/control.h) on the request
// queue: HELLO and ECHO here, connection messages in ConnManager.
#pragma once

#include <atomic>

#include "host-backend/conn/conn_manager.h"
#include "host-backend/peering/peers.h"
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
  void OnAttach(vhost::BackendDevice& device) override { conns_.OnAttach(device); }
  void OnDetach(vhost::BackendDevice& device) override { conns_.OnDetach(device); }
  uint32_t HandleRequest(vhost::BackendDevice& device, const vhost::DescChain& chain) override;
  bool Poll() override {
    bool worked = conns_.MoveData();
    worked |= peering_.Poll();
    return worked;
  }
  bool Pump(vhost::BackendDevice& device) override {
    bool worked = conns_.PollDoorbells(device);
    return conns_.EmitEvents(device) || worked;
  }
  bool BeforeSleep() override { return conns_.ArmDoorbells(); }
  bool NeedsKick(vhost::BackendDevice& device, size_t q) override {
    return q == 0 || conns_.HasEventsWaiting(device);
  }

  const ServiceCounters& counters() const { return counters_; }
  const ConnManager& conns() const { return conns_; }
  ConnManager& mutable_conns() { return conns_; }
  Peering& peering() { return peering_; }
  const Peering& peering() const { return peering_; }

 private:
  ServiceCounters counters_;
  ConnManager conns_;
  Peering peering_{&conns_};  // after conns_: uses it
};

}  // namespace vsocket::backend
