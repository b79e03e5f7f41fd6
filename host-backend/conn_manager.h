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
#include "host-backend/fabric/link.h"
#include "proto/control.h"
#include "proto/fabric.h"
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
  // Doorbells (kFeatureDoorbell).
  std::atomic<uint64_t> doorbell_sessions{0};  // HELLOs that took the doorbell
  std::atomic<uint64_t> doorbell_counts{0};    // counts read from blocks (polled, or just before a message)
  std::atomic<uint64_t> doorbell_messages{0};  // TX_TAIL/CONSUMED of doorbell conns (backend had armed)
  std::atomic<uint64_t> doorbell_arms{0};      // blocks armed (then left the polled set)
  // Cross-host.
  std::atomic<uint64_t> pair_requests_sent{0};
  std::atomic<uint64_t> pair_requests_received{0};
  std::atomic<uint64_t> pair_refused{0};      // a peer host asked for what it does not run
  std::atomic<uint64_t> remote_upgrades{0};
  std::atomic<uint64_t> fabric_bytes_out{0};
  std::atomic<uint64_t> fabric_bytes_in{0};
  std::atomic<uint64_t> fabric_bytes_placed{0}; // of fabric_bytes_in: written one-sided into the RX ring (rdma)
  std::atomic<uint64_t> rdma_rx_regions{0};     // guest RX rings registered for peer hosts (total)
  std::atomic<uint64_t> rdma_rx_regions_dropped{0};  // ... and deregistered again (total)
  std::atomic<uint64_t> rdma_rx_withdrawn{0};  // of those: after the peer acknowledged a PLACEMENT
  std::atomic<uint64_t> rdma_tx_regions{0};    // guest TX rings registered for sends to read in place (total)
  std::atomic<uint64_t> rdma_tx_regions_dropped{0};  // ... and withdrawn again (total)
  std::atomic<uint64_t> rdma_reg_us{0};  // time spent registering guest rings (RX and TX, microseconds, total)
  std::atomic<uint64_t> credit_held{0};        // credits held back: the peer consumed bytes a send still read
  std::atomic<uint64_t> rings_held{0};         // UNREGISTERs answered rings-held (kFeatureRingHold)
  std::atomic<uint64_t> rings_released{0};     // ... and RINGS_RELEASED owed afterwards
  std::atomic<uint64_t> frames_dropped{0};    // unknown handle, wrong tenant or wrong host
  std::atomic<uint64_t> frames_cross_tenant{0};
  std::atomic<uint64_t> fabric_violations{0}; // a frame outside the window: that connection is reset
  std::atomic<uint64_t> fabric_downgrades{0}; // connections taken off the fabric (link lost)
};

// The other hosts, as the connection manager needs them (implemented by
// Peering on the worker thread; host ids are small integers, 0 = none).
class RemoteHosts {
 public:
  virtual ~RemoteHosts() = default;
  // The peer host that runs (tenant, addr) and is reachable now, or 0.
  virtual uint32_t Locate(uint32_t tenant, const proto::Endpoint& addr) = 0;
  // Whether (tenant, addr) is located on `host` (checks what a peer claims).
  virtual bool Runs(uint32_t host, uint32_t tenant, const proto::Endpoint& addr) = 0;
  // Sends a pairing frame on the authenticated control channel.
  virtual bool SendPairing(uint32_t host, const proto::FrameHeader& h, std::span<const uint8_t> payload) = 0;
  // The data link that carries connection `conn`'s frames to `host`, while
  // the host is up. A host pair may have several links (links_per_peer);
  // each connection sends on one of them, the same one for as long as the
  // host stays up, so its frames stay in order. Frames arrive on any.
  virtual fabric::Link* LinkTo(uint32_t host, uint64_t conn) = 0;
  // rdma fabric: registers [addr, addr+len) as its own memory region that
  // peer hosts may write one-sided (returns the rkey), and drops it again.
  // Other fabrics: kFailedPrecondition (the link then places the bytes).
  virtual Status RegisterRemoteWritable(void* /*addr*/, size_t /*len*/, uint32_t* /*rkey*/) {
    return Status(Code::kFailedPrecondition, "fabric has no one-sided writes");
  }
  virtual void UnregisterRemoteWritable(void* /*addr*/) {}
  // rdma fabric: registers [addr, addr+len) for sends to read in place (a
  // guest TX ring: no copy on the sending host). Withdraw takes it out of
  // use at once and returns a token; Release drops it once no posted send
  // can read it any more. Other fabrics: kFailedPrecondition (sends copy).
  virtual Status RegisterSendable(void* /*addr*/, size_t /*len*/) {
    return Status(Code::kFailedPrecondition, "fabric reads no memory in place");
  }
  virtual uint64_t WithdrawSendable(void* /*addr*/) { return 0; }
  virtual void ReleaseSendable(uint64_t /*token*/) {}
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
  uint32_t remote_host; // peer host id when the peer is on another host, else 0
};

class ConnManager {
 public:
  static constexpr uint32_t kMaxConnsPerDevice = 4096;
  // Bytes one MoveData() pass moves before it yields to the rest of the
  // worker's pass (at least one connection's worth).
  static constexpr uint64_t kMovePassBudget = 2u << 20;

  ConnManager();
  ~ConnManager();

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
  // The session on `device` said HELLO with these features; returns the
  // ones it gets (proto::kFeatureDoorbell or nothing).
  uint64_t OnHello(vhost::BackendDevice& device, uint64_t features);
  // Reads the doorbell blocks of the device's polled connections; a block
  // idle for a while is armed and leaves the set. True if any count moved.
  bool PollDoorbells(vhost::BackendDevice& device);
  // Before the worker sleeps: arms every polled block. True if one moved
  // meanwhile (then do not sleep).
  bool ArmDoorbells();

  // Cross-host. All on the worker thread.
  void SetRemoteHosts(RemoteHosts* hosts) { hosts_ = hosts; }
  // This host's VMs (for checking what a peer host asks for).
  void SetLocalPorts(const std::vector<vhost::PortConfig>* ports) { ports_ = ports; }
  void OnPairingFrame(uint32_t host, const proto::FrameHeader& h, std::span<const uint8_t> payload);
  // The sink for frames arriving on link number `link` from `host`.
  fabric::FrameSink& LinkSink(uint32_t host, uint32_t link);
  // The link to `host` is up (pending registrations may now pair) or gone
  // (its connections leave the fabric).
  void OnHostUp(uint32_t host);
  void OnHostDown(uint32_t host);
  // Sends owed frames and flushes links. True if anything was sent.
  bool PumpLinks();

  std::vector<ConnSnapshot> Snapshot() const;
  const ConnManagerCounters& counters() const { return counters_; }
  const VmTotals& vm_totals(size_t vm_index) const { return vm_totals_[vm_index % kMaxVms]; }

 private:
  struct DeviceConns {
    vhost::BackendDevice* device = nullptr;
    std::unordered_map<uint64_t, BackendConn*> by_id;  // guest conn_id -> conn
    std::deque<BackendConn*> events;                   // conns with events owed
    bool doorbell = false;                             // session took kFeatureDoorbell
    std::vector<BackendConn*> doorbells;               // conns whose blocks are polled
    bool ring_hold = false;                            // session took kFeatureRingHold
    std::deque<uint64_t> released;                     // conn ids owed RINGS_RELEASED
  };
  // Doorbells (kFeatureDoorbell). Polling a connection's block means the
  // guest posts nothing; arming it (want flags set, then a last look)
  // means the guest posts at its next count.
  proto::DoorbellBlock* DoorbellOf(BackendConn& c);
  void AddDoorbell(DeviceConns& dc, BackendConn& c);
  void RemoveDoorbell(BackendConn& c);
  // Reads c's block and applies new counts: 1 progress, 0 none, -1 the
  // connection was reset (a bad count).
  int ReadDoorbell(BackendConn& c);
  int ArmDoorbell(BackendConn& c);
  void DropDoorbellAt(DeviceConns& dc, size_t i);
  // A TX tail or consumed count from the guest (message or block), checked.
  bool ApplyTxTail(BackendConn& c, uint64_t tail);
  bool ApplyConsumed(BackendConn& c, uint64_t consumed);

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
  // Cross-host.
  class Sink;
  struct PendingRemote {
    uint32_t host;
    uint64_t handle;
    uint32_t window;
    uint64_t rdma_addr;
    uint32_t rdma_rkey;
    int64_t expires_ms;
  };
  void RequestRemotePair(BackendConn& c, uint32_t host);
  void AcceptRemote(BackendConn& c, const PendingRemote& r);
  void UpgradeRemote(BackendConn& c);
  void Owe(BackendConn& c, uint32_t bits);
  bool SendOwed(BackendConn& c);
  uint64_t MoveRemote(BackendConn& c);
  BackendConn* FrameTarget(uint32_t host, const proto::FrameHeader& h);
  void OnLinkFrame(uint32_t host, const proto::FrameHeader& h);
  fabric::PayloadDest OnLinkData(uint32_t host, const proto::FrameHeader& h);
  // DATA the link already placed in c's RX ring (rdma): checked like
  // OnLinkData, then handled like any frame.
  void OnPlacedData(uint32_t host, const proto::FrameHeader& h);
  // rdma: registers c's RX ring for the peer host (0 in *addr: not possible).
  void RegisterRx(BackendConn& c, uint64_t* addr, uint32_t* rkey);
  // rdma: withdraws c's RX ring registration; the peer learns it with a
  // PLACEMENT and the region is dropped once it acknowledged.
  void RetireRx(BackendConn& c);
  // Drops every registration of c now (nothing can write any more).
  void DropRx(BackendConn& c);
  void UnregisterRx(void* addr);
  // rdma, kFeatureRingHold: registers c's TX ring for sends to read in
  // place (else they copy), and withdraws it (dropped once no frame in
  // flight reads it). Registration pins memory and can take milliseconds
  // (tens under load): QueueTx defers it off the pairing path, and
  // RegisterQueuedTx makes some each pass (true if any was made or some
  // wait); until then c's sends are copied.
  bool TxRegistrable(const BackendConn& c) const;  // rdma, ring hold, mapped, not registered yet
  void QueueTx(BackendConn& c);
  bool RegisterQueuedTx();
  void RegisterTx(BackendConn& c);
  void WithdrawTx(BackendConn& c);
  void ReleaseTxToken(uint64_t token);
  // Whether the fabric may still read c's TX ring or a peer write its RX ring.
  bool HoldsRings(const BackendConn& c) const;
  // A closed connection answered rings-held that no longer holds them:
  // RINGS_RELEASED is owed to its guest.
  void MaybeReleaseRings(BackendConn& c);
  // The guest's credit: what the peer consumed, but not past the first byte
  // a send in flight still reads.
  void UpdateCredit(BackendConn& c);
  void AddReap(BackendConn& c);
  // Looks at connections waiting for sends to complete. True if a credit moved.
  bool ReapTx();
  void DetachRemote(BackendConn& c, proto::Reason why);
  const vhost::PortConfig* LocalPortFor(uint32_t tenant, const proto::Endpoint& addr) const;

  std::unordered_map<vhost::BackendDevice*, DeviceConns> devices_;
  std::unordered_map<uint64_t, std::unique_ptr<BackendConn>> conns_;  // by handle
  libcuckoo::cuckoohash_map<ConnKey, uint64_t, ConnKeyHash> registry_;   // key -> handle
  libcuckoo::cuckoohash_map<ConnKey, uint32_t, ConnKeyHash> by_tuple_;  // tenant 0 -> tenant
  std::vector<BackendConn*> movable_;
  RemoteHosts* hosts_ = nullptr;
  const std::vector<vhost::PortConfig>* ports_ = nullptr;
  std::unordered_map<uint64_t, std::unique_ptr<Sink>> sinks_;  // by host << 32 | link
  std::vector<BackendConn*> owed_;        // conns with link frames owed
  std::vector<BackendConn*> reap_;        // conns waiting for sends that read their TX ring
  std::deque<uint64_t> tx_queue_;         // handles of conns whose TX ring waits to be registered
  // PAIR_REQUESTs that arrived before our guest registered the connection,
  // keyed as our guest will register it.
  std::unordered_map<ConnKey, PendingRemote, ConnKeyHash> pending_remote_;
  uint64_t next_handle_ = 1;
  ConnManagerCounters counters_;
  std::array<VmTotals, kMaxVms> vm_totals_;
  mutable std::mutex snapshot_mu_;  // guards conns_ structure against Snapshot()
};

}  // namespace vsocket::backend
