// The rdma fabric: a Link over one libibverbs RC queue pair per peer host.
//
// Wire usage (both ends run this code):
//  - Every frame header travels as a SEND_WITH_IMM into one of the peer's
//    pre-posted receive buffers (header + a control payload of at most
//    proto::kMaxControlPayload bytes). The immediate says how to read the
//    message (plain frame, DATA placed one-sided, DATA staged, credit update,
//    close) and piggybacks the sender's credit returns.
//  - DATA with a RemoteBuffer: one RDMA_WRITE of the payload straight to
//    RemoteBuffer{addr, rkey}, then the header SEND on the same QP. RC
//    ordering makes the written bytes visible before the SEND completes at
//    the receiver, which then calls sink.OnFrame(h) only: OnHeader is *not*
//    called, the bytes are already in place.
//  - DATA without a RemoteBuffer, or with addr == 0 (the stream links'
//    semantics, used by the conformance suite and for peers that sent no
//    rkey): the payload is RDMA-written into a staging ring the receiver
//    registered and advertised in RdmaEndpointInfo, then the header SEND;
//    the receiver calls OnHeader and copies the bytes to the PayloadDest,
//    like a stream link.
//
// Flow control, so the receiver never runs out of receive buffers (no RNR
// retry is relied upon; tests run with rnr_retry = 0): the sender holds one
// credit per free peer receive buffer (RdmaEndpointInfo::recv_depth at
// start). Frames need two credits to be taken (the last one is reserved for
// a credit update, so two senders with exhausted credits cannot deadlock).
// The receiver reposts each buffer after processing it and returns the
// credits in the immediate of its next SEND, or in a credit-only SEND once
// half the ring (or a quarter of the staging ring) is owed. Staging space is
// returned the same way, as a count of staged frames consumed (both ends
// place staged payloads by the same rule, so no offsets travel).
//
// The RemoteBuffer contract: `addr` is the final remote address (the
// caller adds the ring offset), and the payload must fit there contiguously:
// when a receiver's ring wraps, the caller splits the payload into two
// Send() calls with two headers (each header's len and value describing its
// piece).
//
// Memory: payload pieces inside memory registered with
// RdmaDevice::RegisterMemory are read by the NIC directly (zero copy) *until
// the frame's work request completes*, i.e. possibly after Flush() returns:
// the owner of registered memory (the daemon's TX rings) keeps the bytes
// until the peer has acknowledged them, which implies completion. Payload
// outside registered memory is copied into a registered bounce ring at
// Send() time (counted in stats().backlog_bytes), so such memory is the
// caller's again right after Send(), as with the stream links.
//
// Wakeups: wake_fd() is an epoll fd over the CQ's completion channel (armed
// with ibv_req_notify_cq before the caller sleeps) and an eventfd that stays
// readable while completions wait to be dispatched. The CQ may be shared by
// the links of a host pair (RdmaCompletionQueue): a completion drained by
// one link's Poll() is handed to its own link, whose eventfd then wakes it. No busy polling:
// WantsWritable() is always false, completions (credits, finished sends)
// arrive through wake_fd().
//
// Errors: a failed completion or a QP in error state kills the link; Poll()
// and Flush() then return the first error. An orderly close (the destructor
// sends a close message, or the peer sends LINK_CLOSE) reads as
// Code::kUnavailable "fabric link closed by the peer" after every earlier
// frame was delivered.
//
// Not thread-safe: one thread drives a link (RdmaDevice is thread-safe).
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "host-backend/fabric/link.h"

namespace vsocket::fabric {

namespace rdma_internal {
// A send or receive slot: one frame header and a small control payload.
inline constexpr size_t kSlotSize = 320;  // >= 32 + kMaxControlPayload, 64-aligned
inline constexpr int kMaxSge = 4;         // payload pieces one RDMA WRITE gathers
inline constexpr uint32_t kMinRecvDepth = 4;
inline constexpr uint32_t kMaxRecvDepth = 16383;  // 14-bit credit field
inline constexpr uint32_t kMaxInFlight = 16383;
inline constexpr uint32_t kControlReserve = 8;  // credit/close messages
inline constexpr size_t kMinStaging = 4 * proto::kMaxDataFrame;
inline constexpr int64_t kCloseWaitMs = 500;  // destructor: close message on its way
// The immediate of every SEND: kind (4 bits), staged frames consumed
// (14 bits), receive buffers reposted (14 bits).
inline constexpr uint32_t MakeImm(uint8_t kind, uint32_t staged, uint32_t credits) {
  return (uint32_t{kind} << 28) | (staged << 14) | credits;
}
inline constexpr uint8_t ImmKind(uint32_t imm) { return static_cast<uint8_t>(imm >> 28); }
inline constexpr uint32_t ImmStaged(uint32_t imm) { return (imm >> 14) & 0x3fff; }
inline constexpr uint32_t ImmCredits(uint32_t imm) { return imm & 0x3fff; }

// unique_ptr deleters for verbs objects (each calls the matching destroy).
struct CloseDevice {
  void operator()(ibv_context* c) const;
};
struct DeallocPd {
  void operator()(ibv_pd* p) const;
};
struct DeregMr {
  void operator()(ibv_mr* m) const;
};
struct DestroyChannel {
  void operator()(ibv_comp_channel* c) const;
};
struct DestroyCq {
  void operator()(ibv_cq* c) const;
};
struct DestroyQp {
  void operator()(ibv_qp* q) const;
};
struct Unmap {
  size_t len = 0;
  void operator()(uint8_t* p) const;
};
}  // namespace rdma_internal

// What one end of a link tells the other (carried by the daemon over its
// TLS control channel). Encoded little-endian, kEncodedSize bytes.
struct RdmaEndpointInfo {
  uint32_t qpn = 0;  // 24 bits
  uint32_t psn = 0;  // 24 bits: first packet sequence number of our sends
  std::array<uint8_t, 16> gid = {};
  uint16_t lid = 0;       // InfiniBand link layer only
  uint8_t gid_index = 0;  // the sender's own index (informational)
  uint8_t port = 1;
  uint8_t mtu = IBV_MTU_1024;  // enum ibv_mtu, the port's active MTU
  uint8_t link_layer = IBV_LINK_LAYER_ETHERNET;
  uint32_t recv_depth = 0;    // receive buffers posted: the peer's credits
  uint64_t staging_addr = 0;  // staging ring for DATA without RemoteBuffer
  uint32_t staging_rkey = 0;
  uint32_t staging_size = 0;

  static constexpr size_t kEncodedSize = 56;
  std::array<uint8_t, kEncodedSize> Encode() const;
  // Strict: wrong magic/version/size or out-of-range fields are errors.
  static Result<RdmaEndpointInfo> Decode(std::span<const uint8_t> in);
};

// One opened RDMA device and port, and one protection domain on it with the
// registry of memory its links may read and its peers may write. Domain()
// makes another protection domain on the same opened device: vsocketd gives
// each peer host its own (its links' QPs and the rings registered for it),
// so a peer that learns or guesses an rkey handed to another host cannot
// write there (the NIC refuses a QP access to memory of another PD). Links
// hold a shared_ptr, so the PD outlives their QPs; the device closes with
// its last domain.
class RdmaDevice {
 public:
  struct Options {
    std::string name;  // empty: the first device
    uint8_t port = 1;
    int gid_index = -1;  // -1: the IPv4-mapped RoCEv2 GID (::ffff:a.b.c.d)
  };
  // Names of the RDMA devices present (empty when there is none).
  static std::vector<std::string> List();
  static Result<std::shared_ptr<RdmaDevice>> Open(const Options& opt);
  // Another protection domain on the same device and port (its own empty
  // registry; withdrawal tokens stay unique across all of them).
  Result<std::shared_ptr<RdmaDevice>> Domain() const;
  ~RdmaDevice();

  // What a registration is for. kRemoteWrite: peers write into it (their
  // RemoteBuffer; a guest RX ring). kLocalRead: our sends read from it
  // without a copy (FindLkey). The two never mix: a region peers may write
  // is never read for a send, so a stale one (kept registered until the
  // peer stops writing, e.g. across a guest memory remap that put other
  // memory at the same address) can never leak into a frame.
  enum class Use { kRemoteWrite, kLocalRead };
  // A registration of this domain's that is not in its registry: made by
  // Prepare (not in use yet: FindLkey does not see it, nobody has its
  // rkey), or taken out by Take/TakeWithdrawn (no longer in use).
  // Destroying it deregisters the memory (unpins it), which takes about as
  // long as registering: vsocketd does both on a thread of its own.
  struct Prepared {
    std::unique_ptr<ibv_mr, rdma_internal::DeregMr> mr;
    Use use = Use::kLocalRead;
    const RdmaDevice* domain = nullptr;  // whose protection domain it is in
  };
  // Registers [addr, addr+len) without putting it in use. Thread-safe (it
  // touches no registry): vsocketd calls it off the data-path worker.
  Result<Prepared> Prepare(void* addr, size_t len, Use use) const;
  // Puts a prepared registration of this domain in use (kAlreadyExists if
  // another is at its address; kInvalidArgument if of another domain: it
  // is handed back in *p either way). Returns the keys to hand out.
  Status Adopt(Prepared* p, uint32_t* lkey, uint32_t* rkey);
  // Registers [addr, addr+len) (Prepare and Adopt). Returns the keys to
  // hand out.
  Status RegisterMemory(void* addr, size_t len, Use use, uint32_t* lkey, uint32_t* rkey);
  Status UnregisterMemory(void* addr);
  // Takes the registration at `addr` out of the registry, alive (empty mr
  // if none): for the caller to destroy where it likes.
  Prepared Take(void* addr);
  // Takes the registration at `addr` out of use at once (FindLkey no longer
  // finds it; the address may be registered again) but keeps it alive, for
  // work requests posted before that may still read it: ReleaseWithdrawn()
  // drops it once they completed. Returns its token, 0 if none.
  uint64_t WithdrawMemory(void* addr);
  // False: no withdrawn registration of this domain has that token.
  bool ReleaseWithdrawn(uint64_t token);
  // The same, alive (empty mr if this domain has no such token).
  Prepared TakeWithdrawn(uint64_t token);
  // The lkey of the kLocalRead registration covering [p, p+len), if any.
  std::optional<uint32_t> FindLkey(const void* p, size_t len) const;

  ibv_context* context() const { return ctx_.get(); }
  ibv_pd* pd() const { return pd_.get(); }
  uint8_t port() const { return port_; }
  uint8_t gid_index() const { return gid_index_; }
  const ibv_gid& gid() const { return gid_; }
  const ibv_port_attr& port_attr() const { return port_attr_; }
  const std::string& name() const { return name_; }

 private:
  RdmaDevice() = default;

  // Member order is destruction order, reversed: MRs, then PD, then the
  // context (shared by the device's domains: closed with the last).
  std::shared_ptr<ibv_context> ctx_;
  std::unique_ptr<ibv_pd, rdma_internal::DeallocPd> pd_;
  std::shared_ptr<std::atomic<uint64_t>> next_token_;  // shared by the domains
  // The registry is thread-safe: lookups (FindLkey) share mu_, changes
  // take it alone.
  mutable SharedMutex mu_;
  struct Region {
    std::unique_ptr<ibv_mr, rdma_internal::DeregMr> mr;
    Use use;
  };
  std::map<uintptr_t, Region> regions_ GUARDED_BY(mu_);   // in use, keyed by start address
  std::map<uint64_t, Region> withdrawn_ GUARDED_BY(mu_);  // by token
  std::string name_;
  uint8_t port_ = 1;
  uint8_t gid_index_ = 0;
  ibv_gid gid_ = {};
  ibv_port_attr port_attr_ = {};
};

struct RdmaLinkOptions {
  uint32_t recv_depth = 512;       // receive buffers (peer's credits), 4..16383
  uint32_t max_in_flight = 512;    // frames queued or posted, not completed
  size_t staging_bytes = 2 << 20;  // inbound staging ring, >= 4 * kMaxDataFrame
  size_t bounce_bytes = 2 << 20;   // outbound bounce ring, >= kMaxDataFrame
  uint8_t rnr_retry = 7;           // never needed (credits); 0 in tests proves it
  uint8_t timeout = 14;            // local ACK timeout, 4.096 us * 2^timeout
  uint8_t retry_cnt = 7;
};

class RdmaLink;

// A completion queue and its completion channel, shared by several links
// (the QPs of one host pair): every completion is handed to the link whose
// QP it belongs to (by QP number), whichever link's Poll() drained it. One
// channel fd wakes them all. Not thread-safe: the links' thread drives it.
class RdmaCompletionQueue {
 public:
  // Room for `links` links made with `opt` (the CQ never overflows: each
  // link bounds its posted work requests).
  static Result<std::shared_ptr<RdmaCompletionQueue>> Create(std::shared_ptr<RdmaDevice> dev, int links,
                                                             const RdmaLinkOptions& opt = {});
  ~RdmaCompletionQueue();
  int fd() const { return channel_->fd; }
  int links() const { return static_cast<int>(links_.size()); }

 private:
  friend class RdmaLink;
  RdmaCompletionQueue() = default;
  // Takes the channel's events, polls the CQ dry and dispatches; then arms
  // it and looks once more (a completion before arming raised no event).
  // An error means the CQ itself failed (every link on it is dead).
  Status Drain();
  Status PollAll();

  std::shared_ptr<RdmaDevice> dev_;
  std::unique_ptr<ibv_comp_channel, rdma_internal::DestroyChannel> channel_;
  std::unique_ptr<ibv_cq, rdma_internal::DestroyCq> cq_;
  bool armed_ = false;
  int capacity_ = 0;                     // links it was sized for
  std::map<uint32_t, RdmaLink*> links_;  // by QP number
};

class RdmaLink : public Link {
 public:
  // Creates the QP (in RESET) and its buffers. Connect() makes it usable.
  // `cq`: the completion queue it shares with its host pair's other links
  // (null: one of its own).
  static Result<std::unique_ptr<RdmaLink>> Create(std::shared_ptr<RdmaDevice> dev, const RdmaLinkOptions& opt = {},
                                                  std::shared_ptr<RdmaCompletionQueue> cq = nullptr);
  // Sends a close message (bounded wait for it to go out) and tears down.
  ~RdmaLink() override;

  // What the peer needs for its Connect().
  const RdmaEndpointInfo& LocalInfo() const { return local_; }
  // INIT -> RTR -> RTS towards `remote`. Once.
  Status Connect(const RdmaEndpointInfo& remote);

  bool Send(const proto::FrameHeader& h, std::span<const iovec> payload, const RemoteBuffer* remote = nullptr) override;
  Status Flush() override;
  bool Writable() const override;
  // Frame numbers are send sequence numbers (control and credit messages
  // take some too); a frame is released when its SEND completed.
  uint64_t NextFrameNumber() const override { return next_seq_; }
  uint64_t ReleasedThrough() const override { return done_seq_; }
  Status Poll(FrameSink& sink, int max_frames) override;
  int wake_fd() const override { return wake_.get(); }
  bool WantsWritable() const override { return false; }

  // Moves the QP to the error state, as a fatal transport error would.
  Status ForceErrorForTest();

  // The immediate's message kinds (rdma_link_datapath.cc).
  enum class MsgKind : uint8_t { kFrame = 1, kPlaced = 2, kStaged = 3, kCredit = 4, kClose = 5 };

 private:
  RdmaLink() = default;

  // One posted-or-queued send message (a frame, a credit update or the
  // close), in sequence order; its header slot is slot_[seq % entries].
  struct InFlight {
    uint32_t bounce = 0;  // bounce-ring bytes (incl. wrap waste) to free
    uint8_t wrs = 0;      // work requests it posted (WRITE + SEND, or SEND)
  };
  // A receive completion not yet dispatched.
  struct RecvDone {
    uint32_t index;
    uint32_t byte_len;
    uint32_t imm;
    ibv_wc_status status;
    uint32_t vendor_err;
    bool has_imm;
  };

  friend class RdmaCompletionQueue;
  void CloseQuietly();  // the destructor's orderly close message
  Status Die(Status st);
  // The shared CQ's Drain(), kept as this link's error if it fails.
  Status DrainCq();
  // One completion of this link's QP (from whichever link drained the CQ).
  void OnCompletion(const ibv_wc& wc);
  Status OnSendDone(const ibv_wc& wc);
  // Dispatches one received message; *frames counts delivered frames.
  Status Dispatch(const RecvDone& r, FrameSink& sink, int* frames);
  Status Repost();
  Status MaybeSendCredits();
  bool QueueMessage(MsgKind kind, const uint8_t* header, const uint8_t* small, size_t small_len,
                    const ibv_sge* write_sge, int write_nsge, uint64_t write_addr, uint32_t write_rkey,
                    uint32_t bounce);
  Status PostQueued();
  uint32_t TakeCreditsImm();
  uint8_t* SendSlot(uint64_t seq) const;
  uint8_t* RecvSlot(uint32_t i) const;
  void SetPendingWake(bool on);

  RdmaLinkOptions opt_;
  RdmaEndpointInfo local_, remote_;
  bool connected_ = false;
  Status dead_;

  // Verbs objects; member order is destruction order reversed: QP, CQ
  // (shared: destroyed with its last link), MRs, memory, then the device
  // (PD) last.
  std::shared_ptr<RdmaDevice> dev_;
  std::unique_ptr<uint8_t, rdma_internal::Unmap> mem_;
  std::unique_ptr<ibv_mr, rdma_internal::DeregMr> local_mr_;    // slots + bounce
  std::unique_ptr<ibv_mr, rdma_internal::DeregMr> staging_mr_;  // remote-writable
  std::shared_ptr<RdmaCompletionQueue> cq_;
  std::unique_ptr<ibv_qp, rdma_internal::DestroyQp> qp_;
  uint32_t qpn_ = 0;  // qp_'s number, our key in cq_
  UniqueFd wake_;     // epoll over the CQ's channel fd and pending_event_
  UniqueFd pending_event_;
  bool pending_signaled_ = false;

  // Memory layout inside mem_.
  uint8_t* recv_base_ = nullptr;     // recv_depth slots of kSlotSize
  uint8_t* send_base_ = nullptr;     // entries_ slots of kSlotSize
  uint8_t* bounce_base_ = nullptr;   // bounce_bytes
  uint8_t* staging_base_ = nullptr;  // staging_bytes (staging_mr_)
  uint32_t entries_ = 0;             // max_in_flight + control reserve

  // Sending. Sequence numbers: [done_seq_, posted_seq_) posted,
  // [posted_seq_, next_seq_) queued for the next Flush().
  uint64_t done_seq_ = 0, posted_seq_ = 0, next_seq_ = 0;
  std::vector<InFlight> inflight_;  // indexed seq % entries_
  std::vector<ibv_send_wr> wrs_;    // the queued batch, chained at Flush()
  std::vector<ibv_sge> sges_;
  size_t nwr_ = 0, nsge_ = 0;
  uint32_t credits_ = 0;  // peer receive buffers we may fill
  size_t bounce_head_ = 0, bounce_used_ = 0;
  size_t tx_staging_head_ = 0, tx_staging_used_ = 0;
  std::deque<uint32_t> tx_staged_;  // peer staging bytes per staged frame, FIFO

  // Receiving.
  std::deque<RecvDone> pending_;
  std::vector<ibv_recv_wr> recv_wrs_;
  std::vector<ibv_sge> recv_sges_;
  std::vector<uint32_t> repost_;  // buffer indexes to post again
  uint32_t owed_credits_ = 0;     // reposted, not yet reported
  uint32_t owed_staged_ = 0;      // staged frames consumed, not reported
  size_t owed_staged_bytes_ = 0;
  size_t rx_staging_off_ = 0;
  bool sent_link_close_ = false;  // a LINK_CLOSE frame went out: no close message needed
};

}  // namespace vsocket::fabric
