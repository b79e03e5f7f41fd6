// The worker's service: the guest<->backend control protocol
// (proto/control.h) on each device's request queue, and the per-pass work
// of the connection manager and peering. HELLO and ECHO are answered here;
// connection messages go to ConnManager.
#pragma once

#include <atomic>
#include <string>
#include <utility>

#include "base/log.h"
#include "base/status.h"
#include "host-backend/conn/conn_manager.h"
#include "host-backend/conn/request_result.h"
#include "host-backend/migration.h"
#include "host-backend/peering/peers.h"
#include "host-backend/vms_dir.h"
#include "host-backend/worker.h"

namespace vsocket::backend {

struct ServiceCounters {
  std::atomic<uint64_t> hellos{0};
  std::atomic<uint64_t> echoes{0};
  std::atomic<uint64_t> echo_bytes{0};
  std::atomic<uint64_t> bad_messages{0};
  std::atomic<uint64_t> checksum_errors{0};
  std::atomic<uint64_t> vouches{0};          // sockets a VM's agent vouched for (decision 100)
  std::atomic<uint64_t> vouches_refused{0};  // not from the VM's authority, or for no device of it
  std::atomic<uint64_t> memory_limits{0};          // devices limited by their VM's agent (decision 130)
  std::atomic<uint64_t> memory_limits_refused{0};  // not from the authority, no such device, or bad ranges
  MigrationCounters migration;  // (migration.h)
};

class RequestService : public DeviceService {
 public:
  // vms_dir: where a VM that left by a switchover is marked so until it
  // runs here again (MarkVmLeft, decision 139); empty: not marked.
  RequestService(ConnManager* conns, Peering* peering, std::string vms_dir = {})
      : conns_(*conns),
        peering_(*peering),
        migrations_(conns, &counters_.migration,
                    [peering, dir = std::move(vms_dir)](const vhost::PortConfig& vm, bool here) {
                      peering->DirectoryVmPresence(vm, here);
                      // (A few hundred bytes' file, once per migration.)
                      if (dir.empty()) return;
                      if (Status st = MarkVmLeft(dir, vm.vm_name, !here); !st.ok())
                        VS_LOG(kWarn, "vm %s: %s (a vsocketd restarted before it runs here again would publish it "
                                      "from its configuration)",
                               vm.vm_name.c_str(), st.ToString().c_str());
                    }) {}

  void OnAttach(vhost::BackendDevice& device) override {
    conns_.OnAttach(device);
    migrations_.OnAttach(device);
  }
  void OnDetach(vhost::BackendDevice& device) override {
    conns_.OnDetach(device);
    migrations_.OnDetach(device);
  }
  void OnDirtyLog(vhost::BackendDevice& device, bool logging) override { migrations_.DirtyLogChanged(device, logging); }
  Status FetchDirect(const vhost::BackendDevice* device, uint64_t token, vhost::DirectGrant* out) override {
    return conns_.FetchDirect(device, token, out);
  }
  uint32_t HandleRequest(vhost::BackendDevice& device, const vhost::DescChain& chain, RequestTaker& taker) override;
  bool Poll() override {
    bool worked = conns_.ApplyDrainRequests();
    worked |= conns_.MoveData();
    worked |= conns_.ExpireTentative();
    worked |= conns_.ExpireLeftWithVm();
    worked |= peering_.Poll();
    conns_.ServeSnapshots();  // (a report is not work: it does not keep the worker polling)
    return worked;
  }
  bool Pump(vhost::BackendDevice& device) override {
    bool worked = conns_.PollDoorbells(device);
    worked |= migrations_.Pump(device);
    return conns_.EmitEvents(device) || worked;
  }
  bool BeforeSleep() override { return conns_.ArmDoorbells(); }
  int SleepTimeoutMs() override { return conns_.SleepTimeoutMs(); }
  uint64_t BytesMoved() const override { return conns_.counters().accel_bytes.load(std::memory_order_relaxed); }
  bool NeedsKick(vhost::BackendDevice& device, size_t q) override {
    return q == 0 || conns_.HasEventsWaiting(device) || migrations_.WaitsForBuffer(device);
  }

  const ServiceCounters& counters() const { return counters_; }

 private:
  // The requests answered here (request_service.cc); the rest go to
  // ConnManager if it serves them, else they are bad messages.
  struct RequestHandler {
    proto::MsgType type;
    RequestResult (RequestService::*handle)(vhost::BackendDevice& device, const proto::Message& req,
                                            proto::Message* reply);
  };
  static const RequestHandler kRequestHandlers[];
  RequestResult Dispatch(vhost::BackendDevice& device, const proto::Message& req, proto::Message* reply,
                         RequestTaker& taker);
  RequestResult OnHello(vhost::BackendDevice& device, const proto::Message& req, proto::Message* reply);
  RequestResult OnEcho(vhost::BackendDevice& device, const proto::Message& req, proto::Message* reply);
  RequestResult OnVouch(vhost::BackendDevice& device, const proto::Message& req, proto::Message* reply);
  RequestResult OnLimitMemory(vhost::BackendDevice& device, const proto::Message& req, proto::Message* reply);

  ServiceCounters counters_;
  ConnManager& conns_;
  Peering& peering_;
  Migrations migrations_;
};

}  // namespace vsocket::backend
