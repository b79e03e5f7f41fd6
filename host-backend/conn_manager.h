// Connection registry, pairing and the same-host data path.
//
// Guests register their established kernel connections; two registrations
// of one tenant with mirrored 4-tuples are paired and both guests are told
// to UPGRADE. From then on the backend moves bytes from each side's TX ring
// to the other side's RX ring (one memcpy), never more than the receiver
// has freed (credits), and reports progress with coalesced events on each
// guest's event queue. Runs on the worker thread; the registry is a libcuckoo
// map so the control socket can read it concurrently.
#pragma once

#include <libcuckoo/cuckoohash_map.hh>

#include <array>
#include <deque>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "host-backend/conn.h"
#include "proto/control.h"
#include "vhost/backend/backend_device.h"

namespace vsocket::backend {

struct ConnManagerCounters {
  std::atomic<uint64_t> registered{0};
  std::atomic<uint64_t> rejected_spoofed{0};
  std::atomic<uint64_t> rejected_other{0};
  std::atomic<uint64_t> upgrades{0};
  std::atomic<uint64_t> cross_tenant{0};
  std::atomic<uint64_t> accel_bytes{0};
  std::atomic<uint64_t> protocol_violations{0};
  std::atomic<uint64_t> events{0};
  std::atomic<uint64_t> event_stalls{0};  // events waiting for guest buffers
  std::atomic<uint64_t> active{0};
};

// Totals per VM (indexed by PortConfig::index), kept when connections close.
inline constexpr size_t kMaxVms = 1024;
struct VmTotals {
  std::atomic<uint64_t> accel_bytes_out{0};
  std::atomic<uint64_t> accel_bytes_in{0};
  std::atomic<uint64_t> upgrades{0};
  std::atomic<uint64_t> registrations{0};
};

// A read-only snapshot of one connection, for reporting.
struct ConnSnapshot {
  uint64_t handle;
  uint64_t device_id;
  std::string vm;
  uint32_t tenant;
  proto::Endpoint local, peer;
  ConnState state;
  proto::Reason reason;
  uint64_t accel_out, accel_in, kernel_out;
  uint64_t rx_queued;   // bytes landed in its RX ring, not yet consumed
  uint64_t tx_unacked;  // bytes it produced that its peer has not consumed (credit in use)
  uint32_t window;      // its TX credit window (peer's RX ring, bytes)
};

class ConnManager {
 public:
  static constexpr uint32_t kMaxConnsPerDevice = 4096;

  // Handles one connection message from `device`. Returns the response to
  // write back, if the message has one.
  std::optional<proto::Message> Handle(vhost::BackendDevice& device, const proto::Message& msg);

  void OnAttach(vhost::BackendDevice& device);
  void OnDetach(vhost::BackendDevice& device);
  // Moves data between paired rings. True if any byte moved.
  bool MoveData();
  // Writes owed events into the device's event queue. True if any written.
  bool EmitEvents(vhost::BackendDevice& device);
  // Events owed to the device that wait for it to post buffers.
  bool HasEventsWaiting(vhost::BackendDevice& device);

  std::vector<ConnSnapshot> Snapshot() const;
  const ConnManagerCounters& counters() const { return counters_; }
  const VmTotals& vm_totals(size_t vm_index) const { return vm_totals_[vm_index % kMaxVms]; }

 private:
  struct DeviceConns {
    vhost::BackendDevice* device = nullptr;
    std::unordered_map<uint64_t, BackendConn*> by_id;  // guest conn_id -> conn
    std::deque<BackendConn*> events;                   // conns with events owed
  };

  std::optional<proto::Message> Register(DeviceConns& dc, uint64_t request_id,
                                         const proto::RegisterConn& r);
  std::optional<proto::Message> Unregister(DeviceConns& dc, uint64_t request_id, uint64_t conn_id);
  void Violation(BackendConn& c, const char* what);
  void Pair(BackendConn& a, BackendConn& b);
  bool ResolveRings(BackendConn& c);
  // The guest is gone: keep its unsent TX bytes, tell the peer.
  void Orphan(BackendConn& c);
  void Raise(BackendConn& c, uint32_t bits);
  void MarkMovable(BackendConn& c);
  // Moves what it can from c to its peer; bytes moved.
  uint64_t Move(BackendConn& c);
  void MaybeAnnounceShutdown(BackendConn& c);
  void MaybeDestroy(BackendConn* c);
  DeviceConns* Find(vhost::BackendDevice& device);

  std::unordered_map<vhost::BackendDevice*, DeviceConns> devices_;
  std::unordered_map<uint64_t, std::unique_ptr<BackendConn>> conns_;  // by handle
  libcuckoo::cuckoohash_map<ConnKey, uint64_t, ConnKeyHash> registry_;   // key -> handle
  libcuckoo::cuckoohash_map<ConnKey, uint32_t, ConnKeyHash> by_tuple_;  // tenant 0 -> tenant
  std::vector<BackendConn*> movable_;
  uint64_t next_handle_ = 1;
  ConnManagerCounters counters_;
  std::array<VmTotals, kMaxVms> vm_totals_;
  mutable std::mutex snapshot_mu_;  // guards conns_ structure against Snapshot()
};

}  // namespace vsocket::backend
