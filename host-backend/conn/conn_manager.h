// Connection registry, pairing and the same-host data path.
//
// Guests register their established kernel connections; two registrations
// of one tenant with mirrored 4-tuples are paired and both guests are told
// to UPGRADE. From then on the backend moves bytes from each side's TX ring
// to the other side's RX ring (one memcpy), never more than the receiver
// has freed (credits), and reports progress with coalesced events on each
// guest's event queue. Runs on the worker thread, and the connections are
// the worker's alone: no other thread reads them, nor the registry (a
// libcuckoo map, but only the worker uses it). Other threads read atomics
// (counters, drain state) and ask for the rest: a report (Snapshot, which
// the worker makes between two passes) or a drain (RequestVmOp, applied at
// its next pass).
//
// One class, its member functions defined by job (like eRPC's rpc_impl/):
//   conn/requests.cc     the guest request table (Handle) and each request
//   conn/registry.cc     pairing on this host, devices attaching/detaching,
//                        closing and forgetting connections, snapshots
//   conn/doorbell.cc     doorbell blocks (kFeatureDoorbell)
//   conn/events.cc       events owed to guests, written to event queues
//   conn/mover.cc        the same-host data path
//   remote/pairing.cc    cross-host pairing, peer hosts coming and going
//   remote/frames_in.cc  fabric frames from peer hosts (with link_sink.h)
//   remote/frames_out.cc owed frames and DATA to peer hosts
//   remote/regions.cc    rdma memory regions of guest rings, held credits
#pragma once

#include <libcuckoo/cuckoohash_map.hh>

#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "base/unique_fd.h"
#include "host-backend/conn/conn.h"
#include "host-backend/conn/counters.h"
#include "host-backend/conn/request_result.h"
#include "host-backend/conn/snapshot.h"
#include "host-backend/fabric/link.h"
#include "host-backend/remote/remote_hosts.h"
#include "proto/control.h"
#include "proto/fabric.h"
#include "vhost/backend/backend_device.h"
#include "vhost/backend/proof_server.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {

class ConnManager {
 public:
  // Readable when registrations made off the worker are ready to apply
  // (the worker sleeps on it; rdma fabric).
  int registrations_fd() const { return registrar_.fd(); }
  static constexpr uint32_t kMaxConnsPerDevice = 4096;
  // Bytes one MoveData() pass moves before it yields to the rest of the
  // worker's pass (at least one connection's worth).
  static constexpr uint64_t kMovePassBudget = 2u << 20;

  ConnManager();
  ~ConnManager();

  // Whether Handle serves messages of this type.
  static bool Serves(proto::MsgType type);
  // Handles one connection message from `device` (see kRequestHandlers);
  // kReply: *reply is the response to write back. `taker`: told before a
  // request that must be seen taken first acts (RequestTaker).
  RequestResult Handle(vhost::BackendDevice& device, const proto::Message& msg, proto::Message* reply,
                       RequestTaker* taker = nullptr);

  void OnAttach(vhost::BackendDevice& device);
  void OnDetach(vhost::BackendDevice& device);
  // Moves data between paired rings. True if any byte moved.
  bool MoveData();
  // Writes owed events into the device's event queue. True if any written.
  bool EmitEvents(vhost::BackendDevice& device);
  // Events owed to the device that wait for it to post buffers.
  bool HasEventsWaiting(vhost::BackendDevice& device);
  // The session on `device` said HELLO offering `features`; returns the ones
  // it gets, which its connections then use: every offered bit of
  // proto::kKnownFeatures (doorbell, ring hold, fence delivered, clean
  // downgrade, bulk hint, naps, tentative), except kFeatureNaps unless the worker naps
  // (SetNaps). A HELLO again while the device has connections changes
  // nothing: it returns what the session has (its library sized rings by it).
  // 0 for a device not attached.
  uint64_t OnHello(vhost::BackendDevice& device, uint64_t features);
  // Reads the doorbell blocks of the device's polled connections; a block
  // idle for a while is armed and leaves the set. True if any count moved.
  bool PollDoorbells(vhost::BackendDevice& device);
  // Before the worker sleeps: arms every polled block. True if one moved
  // meanwhile (then do not sleep).
  bool ArmDoorbells();
  // Tentative registrations (kRegisterTentative) whose time is up and that
  // still wait for their peer are withdrawn: DOWNGRADE before any upgrade,
  // reason peer-not-registered (decision 83). True if any was.
  bool ExpireTentative();
  // Connections whose device stopped with its dirty log on while their
  // peer's did not within kLeftWithVmMs: their peer hears of the close now.
  // True if any did.
  bool ExpireLeftWithVm();
  // How long the worker may sleep before ExpireTentative (or
  // ExpireLeftWithVm) has work: -1 (forever) when nothing waits.
  int SleepTimeoutMs() const;

  // Cross-host. All on the worker thread.
  void SetRemoteHosts(RemoteHosts* hosts) { hosts_ = hosts; }
  // This host's VMs (for checking what a peer host asks for).
  void SetLocalPorts(const std::vector<vhost::PortConfig>* ports) { ports_ = ports; }
  void SetLocalPorts(std::shared_ptr<const std::vector<vhost::PortConfig>> ports) {
    ports_held_ = std::move(ports);
    ports_ = ports_held_.get();
  }
  // Any thread: this host's VMs from the worker's next pass on (vsocketctl
  // vm add/remove, decision 105): the worker swaps the list in as it
  // applies VM operations (kPorts), so its pairing reads it without a lock.
  // Applied once drains_applied() reaches the returned number.
  uint64_t RequestLocalPorts(std::shared_ptr<const std::vector<vhost::PortConfig>> ports) EXCLUDES(drain_mu_);
  // Registered connections not yet closed, at most, per VM
  // (DaemonConfig::max_conns_per_vm).
  void SetConnsPerVm(uint32_t n) { conns_per_vm_ = n; }
  // The worker naps between passes (proto::kFeatureNaps, decision 67):
  // sessions that can kick before they wait get the feature.
  void SetNaps(bool naps) { naps_ = naps; }
  // Bytes of closed connections' undelivered TX copied out of their rings,
  // at most, per VM and in all (DaemonConfig::orphan_mb_*).
  void SetOrphanBudgets(uint64_t per_vm, uint64_t total) {
    orphan_budget_vm_ = per_vm;
    orphan_budget_total_ = total;
  }
  void OnPairingFrame(uint32_t host, const proto::FrameHeader& h, std::span<const uint8_t> payload);
  // The sink for frames arriving on link number `link` from `host`.
  fabric::FrameSink& LinkSink(uint32_t host, uint32_t link);
  // The link to `host` is up (pending registrations may now pair) or gone
  // (its connections leave the fabric).
  void OnHostUp(uint32_t host);
  void OnHostDown(uint32_t host);
  // Sends owed frames and flushes links. True if anything was sent.
  bool PumpLinks();

  // Drains (conn/drain.cc; docs/connection-lifecycle.md §9). An operator's
  // request (any thread: vsocketctl drain/undrain, SIGTERM) is applied by
  // the worker at its next pass (the caller wakes it): a draining VM's
  // upgraded connections are asked to leave the rings with clean fences,
  // and none of its connections pairs until it is undrained (then the
  // pending ones pair at once).
  static constexpr uint32_t kAllVms = ~0u;
  // Moving a guest (docs/operator-guide.md "Moving guests"): a VM drains
  // for kMigration, then kLeave: it no longer runs here (its connections
  // still on the rings are reset, peer hosts' requests for its addresses
  // are refused as moved, its addresses are no longer local); kArrive: it
  // runs here from now on (as an undrain). kRelocate: the locator changed,
  // pending connections look again where their peers run. kRemove: the VM
  // is removed from this host (vsocketctl vm remove, decision 105): as
  // kLeave, its connections still on the rings reset for `why`, but it did
  // not move (vms_left is not counted). kPorts: RequestLocalPorts.
  enum class VmOp : uint8_t { kDrain, kUndrain, kLeave, kArrive, kRelocate, kRemove, kPorts };
  // Returns the request's number: applied once drains_applied() reaches it.
  uint64_t RequestVmOp(uint32_t vm_index, VmOp op, proto::Reason why = proto::Reason::kOperator) EXCLUDES(drain_mu_);
  uint64_t RequestDrain(uint32_t vm_index, bool drain, proto::Reason why) {
    return RequestVmOp(vm_index, drain ? VmOp::kDrain : VmOp::kUndrain, why);
  }
  uint64_t drains_applied() const { return drain_applied_.load(std::memory_order_acquire); }
  // Worker: applies the requests. True if there were any.
  bool ApplyDrainRequests() EXCLUDES(drain_mu_);
  // Any thread: why VM vm_index drains (kNone: it does not).
  proto::Reason draining(uint32_t vm_index) const {
    return static_cast<proto::Reason>(drain_[vm_index % kMaxVms].load(std::memory_order_acquire));
  }
  // Any thread: VM vm_index runs on another host (left, or configured away).
  bool away(uint32_t vm_index) const { return away_[vm_index % kMaxVms].load(std::memory_order_acquire); }
  // Before the worker starts: VM vm_index is configured away (PortConfig::away).
  void StartAway(uint32_t vm_index) {
    away_[vm_index % kMaxVms].store(true, std::memory_order_release);
    drain_[vm_index % kMaxVms].store(static_cast<uint16_t>(proto::Reason::kMigration), std::memory_order_release);
  }

  // Reporting (any thread but the worker): every connection not yet
  // closed, as one moment of the worker. While a worker runs the manager
  // (SetWorker), the caller asks it, wakes it and waits for the copy it
  // makes at its next pass (ServeSnapshots); if none comes within
  // kSnapshotWait (a wedged worker), the last one it made. Without a worker
  // (before it starts, after it stopped, tests) nothing else touches the
  // connections: the caller makes the copy itself.
  std::vector<ConnSnapshot> Snapshot() const EXCLUDES(snapshot_mu_);
  static constexpr std::chrono::seconds kSnapshotWait{5};
  // A worker runs the manager from now on and calls ServeSnapshots every
  // pass; `wake` gets it to make one soon (any thread; it must not call into
  // the manager). nullptr: no worker runs it any more (it stopped).
  void SetWorker(std::function<void()> wake) EXCLUDES(snapshot_mu_);
  // Worker, every pass: makes the copy Snapshot() waits for, if one was asked.
  void ServeSnapshots() EXCLUDES(snapshot_mu_);
  const ConnManagerCounters& counters() const { return counters_; }
  // The proof thread (decision 97): the memory and the peer's wake fd of a
  // direct pair, for the connection of `device` whose DIRECT event named
  // `token`; once. kNotFound: no such token for that device.
  Status FetchDirect(const vhost::BackendDevice* device, uint64_t token, vhost::DirectGrant* out)
      EXCLUDES(direct_mu_);
  const VmTotals& vm_totals(size_t vm_index) const { return vm_totals_[vm_index % kMaxVms]; }

 private:
  // Every connection not yet closed (on the worker, or with no worker).
  std::vector<ConnSnapshot> MakeSnapshot() const;
  struct DeviceConns {
    vhost::BackendDevice* device = nullptr;
    std::unordered_map<uint64_t, BackendConn*> by_id;  // guest conn_id -> conn
    std::map<uint64_t, uint64_t> rings;                // their rings' gpa ranges: start -> end
    std::deque<BackendConn*> events;                   // conns with events owed
    bool doorbell = false;                             // session took kFeatureDoorbell
    std::vector<BackendConn*> doorbells;               // conns whose blocks are polled
    bool ring_hold = false;                            // session took kFeatureRingHold
    bool fence_delivered = false;                      // session took kFeatureFenceDelivered
    bool clean_downgrade = false;                      // session took kFeatureCleanDowngrade
    bool bulk_hint = false;                            // session took kFeatureBulkHint
    bool naps = false;                                 // session took kFeatureNaps
    bool tentative = false;                            // session took kFeatureTentative
    bool fork_resync = false;                          // session took kFeatureForkResync
    bool move_back = false;                            // session took kFeatureMoveBack
    bool knows_directory = false;                      // session took kFeatureDirectoryUnavailable
    bool direct = false;                               // session took kFeatureDirect
    bool direct_resend = false;                        // session took kFeatureDirectResend (decision 135)
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

  // Guest requests (conn/requests.cc): one handler per message type, in
  // kRequestHandlers. `c` is the connection the message names (null for
  // those that name none).
  struct RequestHandler {
    proto::MsgType type;
    RequestResult (ConnManager::*handle)(DeviceConns& dc, BackendConn* c, const proto::Message& msg,
                                         proto::Message* reply);
    bool names_conn;
    // The guest waits for an answer (a call): one that names no
    // connection is answered unknown-connection, never left to the guest's
    // timeout.
    bool answers;
    // Returned and published before it acts (RequestTaker; decision 124).
    bool takes_first;
  };
  static const RequestHandler kRequestHandlers[];
  RequestResult OnRegister(DeviceConns& dc, BackendConn* c, const proto::Message& msg, proto::Message* reply);
  RequestResult OnUnregister(DeviceConns& dc, BackendConn* c, const proto::Message& msg, proto::Message* reply);
  RequestResult OnPairingQuery(DeviceConns& dc, BackendConn* c, const proto::Message& msg, proto::Message* reply);
  RequestResult OnFence(DeviceConns& dc, BackendConn* c, const proto::Message& msg, proto::Message* reply);
  RequestResult OnTxTail(DeviceConns& dc, BackendConn* c, const proto::Message& msg, proto::Message* reply);
  RequestResult OnConsumed(DeviceConns& dc, BackendConn* c, const proto::Message& msg, proto::Message* reply);
  RequestResult OnShutdown(DeviceConns& dc, BackendConn* c, const proto::Message& msg, proto::Message* reply);
  RequestResult OnDowngrade(DeviceConns& dc, BackendConn* c, const proto::Message& msg, proto::Message* reply);
  RequestResult MoveBack(BackendConn& c, const proto::Downgrade& d, uint64_t request_id, proto::Message* reply);
  RequestResult DirectUnmapped(BackendConn& c, const proto::Downgrade& d, uint64_t request_id, proto::Message* reply);
  RequestResult RepollDoorbell(DeviceConns& dc, BackendConn& c, bool allowed, const char* violation);
  proto::Message Register(DeviceConns& dc, uint64_t request_id, const proto::RegisterConn& r);
  proto::Message Unregister(DeviceConns& dc, uint64_t request_id, uint64_t conn_id);
  void Violation(BackendConn& c, const char* what);
  void AbortTx(BackendConn& c);
  void PeerViolation(BackendConn& c, const char* what);
  static bool RingsOverlap(const DeviceConns& dc, const BackendConn& c);
  void Pair(BackendConn& a, BackendConn& b);
  // Decision 97 (conn/direct.cc): a pair both of whose sessions and VMs
  // allow it gets a ring pair of its own; each side's DIRECT event names
  // the token its library fetches the memory with (FetchDirect).
  void MaybeGoDirect(BackendConn& a, BackendConn& b);
  bool DirectAllowed(const BackendConn& a, const BackendConn& b) const;
  // Decision 98: whether c's peer address is served here by a VM whose
  // processes c's may share a pair with (by both VMs' settings), and the
  // withdrawal of a direct-only registration that cannot be direct.
  bool DirectPossible(const BackendConn& c) const;
  void DeclineDirect(BackendConn& c);
  // Adds what c's library produced on its direct pair since the last look
  // to the byte counts (c's, its peer's, both VMs', direct_bytes): when a
  // snapshot is asked for and when c goes.
  void CountDirect(BackendConn& c);
  void CountAllDirect();
  void DropDirectOffers(uint64_t handle) EXCLUDES(direct_mu_);
  // Registration and undrain: pairs c with its mirror on this host, or with
  // a peer host (requests.cc).
  bool PairWithMirror(BackendConn& c);
  bool PairRemote(BackendConn& c);
  bool BulkBetterOnKernel(uint32_t tenant, const proto::RegisterConn& r);
  // Decision 63: a registration kept on kernel TCP for `why` tells its peer's
  // side (pairing.cc), which then does not wait for a pairing that never
  // comes; what a decline said, for a registration or request that comes
  // after it (nullopt: nothing).
  void DeclineRemote(uint32_t tenant, const proto::RegisterConn& r, proto::Reason why);
  std::optional<proto::Reason> TakeDecline(const ConnKey& key, bool from_peer);
  void RememberDecline(const ConnKey& key, uint32_t host, proto::Reason why);
  // Decision 95: a client registration whose peer no VM here has and the
  // directory cannot place now (etcd unreachable, not in its cache); its
  // peer's side, wherever it runs, is told by a PAIR_DECLINE to every host
  // up (at most kMaxDirectoryDeclinesPerSecond frames a second).
  bool DirectoryCannotPlace(uint32_t tenant, const proto::RegisterConn& r);
  void DeclineEverywhere(uint32_t tenant, const proto::RegisterConn& r, proto::Reason why);
  // A peer host asked to pair with our guest's registration, and the
  // directory cannot place the requester's address: our side (registered
  // or to come) is told why.
  void DeclineHere(uint32_t host, const ConnKey& key, proto::Role their_role, proto::Reason why);
  bool ResolveRings(BackendConn& c);
  // The guest is gone: keep its unsent TX bytes, tell the peer.
  void Orphan(BackendConn& c);
  // c's device is stopping with its dirty log on: its VM moved (a live
  // migration's switchover) or one of its processes went during the
  // pre-copy (decision 106). A connection paired with another of the same
  // VM keeps its news from its peer until the peer's device stops too
  // (then both go as if this vsocketd had died for them: nothing kept of
  // their TX rings, which the guest resends through RESYNC where it runs
  // now, and nothing said) or kLeftWithVmMs pass (then its peer hears of
  // the close as usual: ExpireLeftWithVm).
  void LeaveWithVm(BackendConn& c);
  // VM vm_index's last device stopped with its dirty log on (the
  // switchover): the connections LeaveWithVm kept whose peer is outside the
  // VM are let go, their peers told to finish on kernel TCP through RESYNC
  // (decision 110).
  void PeersOfMovedVm(uint32_t vm_index);
  // One connection of VM vm_index on kernel TCP for `why` (VmTotals::fallbacks).
  void CountFallback(uint32_t vm_index, proto::Reason why) {
    vm_totals_[vm_index % kMaxVms].fallbacks[FallbackSlot(why)].fetch_add(1, std::memory_order_relaxed);
  }
  void Raise(BackendConn& c, uint32_t bits);
  void MarkMovable(BackendConn& c);
  // Moves what it can from c to its peer; bytes moved.
  uint64_t Move(BackendConn& c);
  void MaybeAnnounceShutdown(BackendConn& c);
  // Drains: whether c's VM drains (it does not pair meanwhile); asks c's
  // guest to leave the rings, if it can; c's guest was told the peer's ring
  // end; pairs VM vm_index's pending connections (undrain).
  bool Draining(uint32_t vm_index) const { return drain_[vm_index % kMaxVms].load(std::memory_order_relaxed) != 0; }
  bool AskDrain(BackendConn& c, proto::Reason why);
  void TellPeerRingEnd(BackendConn& c, proto::Reason why);
  void NoteMoved(BackendConn& c);
  void MaybeLeft(BackendConn& c);
  void PairPending(uint32_t vm_index);
  // VM vm_index left this host (VmOp::kLeave).
  void Leave(uint32_t vm_index, proto::Reason why = proto::Reason::kMigration);
  // The locator changed (VmOp::kRelocate).
  void Relocate();
  // A peer host refused c's PAIR_REQUEST because the peer's VM moved: c
  // waits again, and asks where the locator now says, if elsewhere.
  void PeerMoved(BackendConn& c, uint32_t refused_by);
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
    // The directory did not place the requester's address on its host when
    // it came: accepted only once it does (decision 104; remote/pairing.cc).
    bool unconfirmed = false;
  };
  // PAIR_REQUESTs kept until our guest registers, bounded in all, per peer
  // host and per tenant (neither one host nor one tenant can crowd out the
  // others): every change goes through these, which keep the shares.
  bool KeepPendingRemote(const ConnKey& key, const PendingRemote& r);
  void ErasePendingRemote(std::unordered_map<ConnKey, PendingRemote, ConnKeyHash>::iterator it) {
    Unshare(*it);
    pending_remote_.erase(it);
  }
  void Unshare(const std::pair<const ConnKey, PendingRemote>& kv) {
    --pending_per_host_[kv.second.host];
    --pending_per_tenant_[kv.first.tenant];
  }
  template <typename Pred>
  void DropPendingRemote(Pred pred) {
    for (auto it = pending_remote_.begin(); it != pending_remote_.end();) {
      if (pred(*it)) {
        Unshare(*it);
        it = pending_remote_.erase(it);
      } else {
        ++it;
      }
    }
  }
  void RequestRemotePair(BackendConn& c, uint32_t host);
  // c's PAIR_REQUEST, unanswered (stage kRequested), withdrawn: the peer's
  // host forgets it (PAIR_CANCEL; an accept crossing it is cancelled back),
  // our RX registrations for it go (the peer never wrote), and c may ask
  // again.
  void WithdrawPairRequest(BackendConn& c);
  void AcceptRemote(BackendConn& c, const PendingRemote& r);
  void UpgradeRemote(BackendConn& c);
  void Owe(BackendConn& c, uint32_t bits);
  bool SendOwed(BackendConn& c);
  uint64_t MoveRemote(BackendConn& c);
  BackendConn* FrameTarget(uint32_t host, const proto::FrameHeader& h);
  // True (counted, logged) if c belongs to another tenant than the one the
  // peer host's frame h speaks for: the frame must be dropped.
  bool OtherTenants(uint32_t host, const proto::FrameHeader& h, const BackendConn* c);
  void OnLinkFrame(uint32_t host, const proto::FrameHeader& h);
  fabric::PayloadDest OnLinkData(uint32_t host, const proto::FrameHeader& h);
  // The rest of a DATA payload (after `landed` bytes) that spans link polls.
  fabric::PayloadDest OnLinkDataResume(uint32_t host, const proto::FrameHeader& h, uint32_t landed);
  // Where stream bytes [pos, pos + len) of c's RX direction land now: its
  // ring, or (device paused) its stash.
  static fabric::PayloadDest Landing(BackendConn& c, uint64_t pos, uint64_t len);
  // DATA the link already placed in c's RX ring (rdma): checked like
  // OnLinkData, then handled like any frame.
  void OnPlacedData(uint32_t host, const proto::FrameHeader& h);
  // rdma: c's RX ring's registration for peer `host` if it has one already
  // (re-paired with the same host), else 0 in *addr: the pairing carries
  // that and SubmitRx asks the registrar for one.
  void RegisterRx(BackendConn& c, uint32_t host, uint64_t* addr, uint32_t* rkey);
  // rdma, kFeatureRingHold: whether c's RX ring should be registered for
  // the host it is paired (or pairing) with, and asks the registrar for it
  // (once at a time). Registration pins memory and can take milliseconds
  // (tens under load): it is made on the registrar's thread, never on the
  // worker; until ApplyRegistrations puts it in use, the peer's bytes are
  // staged (RX) and c's sends are copied (TX).
  bool WantsRx(const BackendConn& c) const;
  void SubmitRx(BackendConn& c);
  // rdma: withdraws c's RX ring registration; the peer learns it with a
  // PLACEMENT and the region is dropped once it acknowledged.
  void RetireRx(BackendConn& c);
  // Drops every registration of c now (nothing can write any more).
  void DropRx(BackendConn& c);
  void UnregisterRx(const RxRegion& r);
  // rdma, kFeatureRingHold: c's TX ring registered for sends to read in
  // place (else they copy), asked of the registrar once paired, and
  // withdrawn (dropped once no frame in flight reads it).
  bool TxRegistrable(const BackendConn& c) const;  // rdma, ring hold, paired, mapped, not registered yet
  void SubmitTx(BackendConn& c);
  // Puts the registrations the registrar made in use (or gives back those
  // no longer wanted: closed, remapped, paired elsewhere). True if any.
  bool ApplyRegistrations();
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
  // The VM here that runs addr for tenant (away: also VMs that run
  // elsewhere now).
  const vhost::PortConfig* LocalPortFor(uint32_t tenant, const proto::Endpoint& addr, bool away = false) const;

  std::unordered_map<vhost::BackendDevice*, DeviceConns> devices_;
  std::unordered_map<uint64_t, std::unique_ptr<BackendConn>> conns_;    // by handle
  libcuckoo::cuckoohash_map<ConnKey, uint64_t, ConnKeyHash> registry_;  // key -> handle
  libcuckoo::cuckoohash_map<ConnKey, uint32_t, ConnKeyHash> by_tuple_;  // tenant 0 -> tenant
  std::vector<BackendConn*> movable_;
  RemoteHosts* hosts_ = nullptr;
  const std::vector<vhost::PortConfig>* ports_ = nullptr;
  std::shared_ptr<const std::vector<vhost::PortConfig>> ports_held_;  // what ports_ points into (RequestLocalPorts)
  uint64_t orphan_budget_vm_ = 256u << 20;
  uint64_t orphan_budget_total_ = 1024u << 20;
  uint32_t conns_per_vm_ = 65536;
  bool naps_ = false;
  std::unordered_map<uint32_t, uint32_t> vm_open_;  // per VM index: registered, not yet closed
  std::unordered_map<uint64_t, std::unique_ptr<Sink>> sinks_;  // by host << 32 | link
  std::vector<BackendConn*> owed_;                             // conns with link frames owed
  std::vector<BackendConn*> reap_;                             // conns waiting for sends that read their TX ring
  Registrar registrar_;                                        // rdma registrations, made off the worker
  // PAIR_REQUESTs that arrived before our guest registered the connection,
  // keyed as our guest will register it.
  std::unordered_map<ConnKey, PendingRemote, ConnKeyHash> pending_remote_;
  std::unordered_map<uint32_t, size_t> pending_per_host_;
  std::unordered_map<uint32_t, size_t> pending_per_tenant_;
  // Declines (decision 63), keyed as our guest registers (or registered) the
  // connection: host 0 = we kept it on kernel TCP (a PAIR_REQUEST for it is
  // answered PAIR_REJECT), else that peer host did (our registration of it
  // is answered at once). Expire with a request's life; bounded in all and
  // per peer host.
  struct Declined {
    uint32_t host;
    proto::Reason why;
    int64_t expires_ms;
  };
  std::unordered_map<ConnKey, Declined, ConnKeyHash> declined_;
  // Tentative registrations and when each is due, in registration (so
  // expiry) order; one closed or paired meanwhile is skipped when due.
  struct Tentative {
    uint64_t handle;
    int64_t due_ms;  // MonotonicMs
  };
  std::deque<Tentative> tentative_;
  // LeaveWithVm's connections waiting for their peer's device to stop, in
  // stop (so expiry) order; handles, as tentative_.
  std::deque<Tentative> left_with_vm_;
  // How long a VM's devices may take to stop at a switchover (QEMU stops
  // them one after the other, a fraction of a millisecond apart here).
  static constexpr int64_t kLeftWithVmMs = 2000;
  std::unordered_map<uint32_t, size_t> declined_per_host_;
  // How long a PAIR_REQUEST waits for its guest's registration, and a
  // decline for the registration or request it answers.
  static constexpr int64_t kPendingRemoteMs = 30000;
  // Decline frames broadcast in the current second (DeclineEverywhere).
  int64_t decline_second_ = 0;
  size_t decline_frames_ = 0;
  void UnshareDecline(const Declined& d) {
    if (d.host != 0) --declined_per_host_[d.host];
  }
  uint64_t next_handle_ = 1;
  ConnManagerCounters counters_;
  std::array<VmTotals, kMaxVms> vm_totals_;
  // Reports asked of the worker (Snapshot, ServeSnapshots).
  mutable Mutex snapshot_mu_;
  mutable CondVar snapshot_cv_;                                 // a copy was made, or the worker stopped
  std::function<void()> wake_worker_ GUARDED_BY(snapshot_mu_);  // set while a worker runs the manager
  mutable uint64_t snapshots_asked_ GUARDED_BY(snapshot_mu_) = 0;
  uint64_t snapshots_made_ GUARDED_BY(snapshot_mu_) = 0;  // requests snapshot_ answers (it was made after them)
  std::vector<ConnSnapshot> snapshot_ GUARDED_BY(snapshot_mu_);
  mutable std::atomic<bool> snapshot_wanted_{false};  // asked and not yet made: the worker looks every pass
  struct DrainRequest {
    uint32_t vm_index;
    VmOp op;
    proto::Reason why;
    uint64_t seq;
    std::shared_ptr<const std::vector<vhost::PortConfig>> ports = nullptr;  // kPorts
  };
  // Direct pairs' memory waiting for its libraries to fetch it, by token.
  struct DirectOffer {
    const vhost::BackendDevice* device = nullptr;
    uint64_t handle = 0;
    UniqueFd memory, wake;
    uint32_t side = 0;
  };
  Mutex direct_mu_;
  std::unordered_map<uint64_t, DirectOffer> direct_offers_ GUARDED_BY(direct_mu_);
  Mutex drain_mu_;
  std::vector<DrainRequest> drain_requests_ GUARDED_BY(drain_mu_);
  std::atomic<bool> drain_requested_{false};
  uint64_t drain_seq_ GUARDED_BY(drain_mu_) = 0;
  std::atomic<uint64_t> drain_applied_{0};
  // Per VM index: the reason it drains (0: it does not), whether it runs
  // on another host. Written by the worker.
  std::array<std::atomic<uint16_t>, kMaxVms> drain_{};
  std::array<std::atomic<bool>, kMaxVms> away_{};
};

}  // namespace vsocket::backend
