// RdmaLink per-frame code: queuing work requests, posting a batch as one
// chained ibv_post_send, reaping the shared CQ, dispatching received
// messages and returning credits. Setup is in rdma_link.cc; the wire usage
// is described in rdma_link.h.
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "host-backend/fabric/rdma_link.h"

namespace vsocket::fabric {

using namespace rdma_internal;  // NOLINT: this component's own constants
using proto::FrameHeader;
using proto::FrameType;
using proto::kFrameHeaderSize;

namespace {

constexpr uint64_t kRecvTag = uint64_t{1} << 63;  // wr_id of receive buffers
constexpr int kCqBatch = 32;

Status Lost(const char* why) { return Status(Code::kDataLoss, std::string("rdma link: ") + why); }

Status WcError(const char* what, ibv_wc_status st, uint32_t vendor_err) {
  return Status(Code::kUnavailable, std::string("rdma link: ") + what + " failed: " + ibv_wc_status_str(st) +
                                        " (vendor error " + std::to_string(vendor_err) + ")");
}

// Where a ring of `size` bytes with `used` bytes held from `head` on can
// take `len` contiguous bytes: the offset, and the bytes it costs (the tail
// left unused when the piece does not fit before the end). Both ends of a
// staging ring apply this same rule, so no offset travels on the wire.
bool RingAlloc(size_t size, size_t head, size_t used, size_t len, size_t* off, size_t* cost) {
  size_t waste = head + len > size ? size - head : 0;
  if (used + waste + len > size) return false;
  *off = head + len > size ? 0 : head;
  *cost = waste + len;
  return true;
}

}  // namespace

uint8_t* RdmaLink::SendSlot(uint64_t seq) const { return send_base_ + (seq % entries_) * kSlotSize; }
uint8_t* RdmaLink::RecvSlot(uint32_t i) const { return recv_base_ + size_t{i} * kSlotSize; }

Status RdmaLink::Die(Status st) {
  if (dead_.ok()) dead_ = std::move(st);
  return dead_;
}

// ---- sending --------------------------------------------------------------------

bool RdmaLink::Writable() const {
  return connected_ && dead_.ok() && next_seq_ - done_seq_ < opt_.max_in_flight && credits_ >= 2;
}

bool RdmaLink::Send(const FrameHeader& h, std::span<const iovec> payload, const RemoteBuffer* remote) {
  auto busy = [this] {
    stats_.busy.fetch_add(1, std::memory_order_relaxed);
    return false;
  };
  // Frames leave one credit for a credit update (see rdma_link.h).
  if (!Writable()) return busy();
  size_t total = 0;
  for (const iovec& v : payload) total += v.iov_len;
  uint8_t hdr[kFrameHeaderSize];
  proto::EncodeFrameHeader(h, hdr);

  if (h.type != FrameType::kData) {
    if (total > proto::kMaxControlPayload) {
      (void)Die(Status(Code::kInvalidArgument, "rdma link: control payload too large"));
      return false;
    }
    uint8_t small[proto::kMaxControlPayload];
    size_t n = 0;
    for (const iovec& v : payload) {
      std::memcpy(small + n, v.iov_base, v.iov_len);
      n += v.iov_len;
    }
    (void)QueueMessage(MsgKind::kFrame, hdr, small, n, nullptr, 0, 0, 0, 0);
    if (h.type == FrameType::kLinkClose) sent_link_close_ = true;
    stats_.frames_out.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  // RemoteBuffer{0, ...}: the peer gave no address (yet); stage instead.
  if (remote != nullptr && remote->addr == 0) remote = nullptr;
  if (total != h.len || total == 0 || total > proto::kMaxDataFrame) {
    (void)Die(Status(Code::kInvalidArgument, "rdma link: DATA payload length differs from its header"));
    return false;
  }
  // Destination: the caller's remote address, or the peer's staging ring.
  uint64_t addr;
  uint32_t rkey;
  size_t stage_off = 0, stage_cost = 0;
  if (remote != nullptr) {
    addr = remote->addr;
    rkey = remote->rkey;
  } else {
    if (!RingAlloc(remote_.staging_size, tx_staging_head_, tx_staging_used_, total, &stage_off, &stage_cost))
      return busy();
    addr = remote_.staging_addr + stage_off;
    rkey = remote_.staging_rkey;
  }
  // Source: registered memory as is (zero copy), anything else bounced.
  ibv_sge sge[kMaxSge];
  int nsge = 0;
  bool direct = payload.size() <= static_cast<size_t>(kMaxSge);
  for (size_t i = 0; direct && i < payload.size(); ++i) {
    const iovec& v = payload[i];
    if (v.iov_len == 0) continue;
    std::optional<uint32_t> lkey = dev_->FindLkey(v.iov_base, v.iov_len);
    if (!lkey) direct = false;
    else sge[nsge++] = {reinterpret_cast<uintptr_t>(v.iov_base), static_cast<uint32_t>(v.iov_len), *lkey};
  }
  size_t bounce_cost = 0;
  if (!direct) {
    size_t off;
    if (!RingAlloc(opt_.bounce_bytes, bounce_head_, bounce_used_, total, &off, &bounce_cost)) return busy();
    uint8_t* dst = bounce_base_ + off;
    for (const iovec& v : payload) {
      std::memcpy(dst, v.iov_base, v.iov_len);
      dst += v.iov_len;
    }
    bounce_head_ = off + total;
    bounce_used_ += bounce_cost;
    sge[0] = {reinterpret_cast<uintptr_t>(bounce_base_ + off), static_cast<uint32_t>(total), local_mr_->lkey};
    nsge = 1;
    stats_.backlog_bytes.fetch_add(total, std::memory_order_relaxed);
  } else {
    stats_.inplace_bytes.fetch_add(total, std::memory_order_relaxed);
  }
  if (remote == nullptr) {
    tx_staging_head_ = stage_off + total;
    tx_staging_used_ += stage_cost;
    tx_staged_.push_back(static_cast<uint32_t>(stage_cost));
  }
  (void)QueueMessage(remote ? MsgKind::kPlaced : MsgKind::kStaged, hdr, nullptr, 0, sge, nsge, addr, rkey,
                     static_cast<uint32_t>(bounce_cost));
  stats_.frames_out.fetch_add(1, std::memory_order_relaxed);
  stats_.data_bytes_out.fetch_add(total, std::memory_order_relaxed);
  return true;
}

// Appends one message to the batch: an optional RDMA WRITE, then the
// signaled SEND_WITH_IMM (its completion frees the message's slot, bounce
// bytes and both work requests). The caller checked credits and room.
bool RdmaLink::QueueMessage(MsgKind kind, const uint8_t* header, const uint8_t* small, size_t small_len,
                            const ibv_sge* write_sge, int write_nsge, uint64_t write_addr, uint32_t write_rkey,
                            uint32_t bounce) {
  uint64_t seq = next_seq_++;
  InFlight& f = inflight_[seq % entries_];
  f.bounce = bounce;
  f.wrs = 0;
  if (write_nsge > 0) {
    ibv_send_wr& w = wrs_[nwr_++];
    w = {};
    w.wr_id = seq;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.sg_list = &sges_[nsge_];
    w.num_sge = write_nsge;
    w.wr.rdma.remote_addr = write_addr;
    w.wr.rdma.rkey = write_rkey;
    for (int i = 0; i < write_nsge; ++i) sges_[nsge_++] = write_sge[i];
    ++f.wrs;
  }
  ibv_send_wr& s = wrs_[nwr_++];
  s = {};
  s.wr_id = seq;
  s.opcode = IBV_WR_SEND_WITH_IMM;
  s.send_flags = IBV_SEND_SIGNALED;
  s.imm_data = MakeImm(static_cast<uint8_t>(kind), 0, 0);  // host order until PostQueued()
  if (header != nullptr) {
    uint8_t* slot = SendSlot(seq);
    std::memcpy(slot, header, kFrameHeaderSize);
    if (small_len > 0) std::memcpy(slot + kFrameHeaderSize, small, small_len);
    ibv_sge& g = sges_[nsge_++];
    g = {reinterpret_cast<uintptr_t>(slot), static_cast<uint32_t>(kFrameHeaderSize + small_len), local_mr_->lkey};
    s.sg_list = &g;
    s.num_sge = 1;
  }
  ++f.wrs;
  --credits_;
  return true;
}

uint32_t RdmaLink::TakeCreditsImm() {
  uint32_t imm = MakeImm(0, owed_staged_, owed_credits_);
  owed_staged_ = 0;
  owed_credits_ = 0;
  owed_staged_bytes_ = 0;
  return imm;
}

// One ibv_post_send for the whole batch; the first SEND carries the credits
// owed to the peer.
Status RdmaLink::PostQueued() {
  if (nwr_ == 0) return Status::Ok();
  bool credited = false;
  for (size_t i = 0; i < nwr_; ++i) {
    ibv_send_wr& w = wrs_[i];
    w.next = i + 1 < nwr_ ? &wrs_[i + 1] : nullptr;
    if (w.opcode != IBV_WR_SEND_WITH_IMM) continue;
    uint32_t imm = w.imm_data;
    if (!credited) {
      imm |= TakeCreditsImm();
      credited = true;
    }
    w.imm_data = htonl(imm);
  }
  ibv_send_wr* bad = nullptr;
  stats_.write_calls.fetch_add(1, std::memory_order_relaxed);
  int err = ibv_post_send(qp_.get(), wrs_.data(), &bad);
  nwr_ = 0;
  nsge_ = 0;
  if (err != 0) return Die(Status::FromErrno("rdma link: ibv_post_send", err));
  posted_seq_ = next_seq_;
  return Status::Ok();
}

Status RdmaLink::Flush() {
  if (!dead_.ok()) return dead_;
  return PostQueued();
}

// Returns credits with a credit-only message once half the receive ring (or
// a quarter of the staging ring) is owed and nothing else is going out to
// carry them. Deadlock-free: a peer stuck below two credits or without
// staging room means at least that much is owed here once everything that
// arrived was processed, and this message may use the reserved last credit.
Status RdmaLink::MaybeSendCredits() {
  bool due =
      owed_credits_ >= std::max<uint32_t>(1, opt_.recv_depth / 2) || owed_staged_bytes_ >= opt_.staging_bytes / 4;
  if (!due) return Status::Ok();
  if (nwr_ > 0) return PostQueued();
  if (credits_ < 1 || next_seq_ - done_seq_ >= entries_) return Status::Ok();  // after the next completion
  (void)QueueMessage(MsgKind::kCredit, nullptr, nullptr, 0, nullptr, 0, 0, 0, 0);
  return PostQueued();
}

// ---- completions -------------------------------------------------------------------

Status RdmaCompletionQueue::PollAll() {
  ibv_wc wc[kCqBatch];
  for (;;) {
    int n = ibv_poll_cq(cq_.get(), kCqBatch, wc);
    if (n < 0) return Status(Code::kUnavailable, "rdma link: ibv_poll_cq failed");
    for (int i = 0; i < n; ++i) {
      auto it = links_.find(wc[i].qp_num);
      // A link already gone (its QP destroyed): nothing waits for it.
      if (it != links_.end()) it->second->OnCompletion(wc[i]);
    }
    if (n < kCqBatch) return Status::Ok();
  }
}

Status RdmaCompletionQueue::Drain() {
  // Every completion event off the channel (acked), so its fd is quiet
  // until the CQ is armed again and a new completion arrives.
  ibv_cq* cq;
  void* ctx;
  unsigned events = 0;
  while (ibv_get_cq_event(channel_.get(), &cq, &ctx) == 0) ++events;
  if (events > 0) {
    ibv_ack_cq_events(cq_.get(), events);
    armed_ = false;
  }
  VS_RETURN_IF_ERROR(PollAll());
  if (!armed_) {
    if (int err = ibv_req_notify_cq(cq_.get(), 0)) return Status::FromErrno("rdma link: ibv_req_notify_cq", err);
    armed_ = true;
    VS_RETURN_IF_ERROR(PollAll());
  }
  return Status::Ok();
}

Status RdmaLink::DrainCq() {
  stats_.read_calls.fetch_add(1, std::memory_order_relaxed);
  Status st = cq_->Drain();
  if (!st.ok()) return Die(st);
  return dead_;  // a completion may have reported this link's failure
}

void RdmaLink::OnCompletion(const ibv_wc& c) {
  if (c.wr_id & kRecvTag) {
    // Status, then fields valid only on success.
    bool ok = c.status == IBV_WC_SUCCESS;
    pending_.push_back({static_cast<uint32_t>(c.wr_id & ~kRecvTag), ok ? c.byte_len : 0, ok ? ntohl(c.imm_data) : 0,
                        c.status, c.vendor_err, ok && c.opcode == IBV_WC_RECV && (c.wc_flags & IBV_WC_WITH_IMM)});
    SetPendingWake(true);  // dispatched by this link's next Poll()
  } else if (dead_.ok()) {
    (void)OnSendDone(c);  // a failure is kept in dead_
  }
}

Status RdmaLink::OnSendDone(const ibv_wc& wc) {
  if (wc.status != IBV_WC_SUCCESS) return Die(WcError("send", wc.status, wc.vendor_err));
  // Sends complete in order on one RC QP; only SENDs are signaled.
  if (wc.wr_id != done_seq_ || done_seq_ == posted_seq_)
    return Die(Status(Code::kInternal, "rdma link: send completion out of order"));
  bounce_used_ -= inflight_[done_seq_ % entries_].bounce;
  ++done_seq_;
  return Status::Ok();
}

void RdmaLink::SetPendingWake(bool on) {
  if (on == pending_signaled_) return;
  uint64_t v = 1;
  if (on) (void)!write(pending_event_.get(), &v, sizeof(v));
  else (void)!read(pending_event_.get(), &v, sizeof(v));
  pending_signaled_ = on;
}

// ---- receiving ---------------------------------------------------------------------

Status RdmaLink::Poll(FrameSink& sink, int max_frames) {
  if (!dead_.ok()) return dead_;
  if (!connected_) return Status::Ok();
  VS_RETURN_IF_ERROR(DrainCq());
  int frames = 0;
  while (frames < max_frames && !pending_.empty()) {
    RecvDone r = pending_.front();
    pending_.pop_front();
    VS_RETURN_IF_ERROR(Dispatch(r, sink, &frames));
  }
  VS_RETURN_IF_ERROR(Repost());
  VS_RETURN_IF_ERROR(MaybeSendCredits());
  SetPendingWake(!pending_.empty());
  return Status::Ok();
}

Status RdmaLink::Dispatch(const RecvDone& r, FrameSink& sink, int* frames) {
  if (r.status != IBV_WC_SUCCESS) return Die(WcError("receive", r.status, r.vendor_err));
  if (!r.has_imm) return Die(Lost("message without immediate"));
  repost_.push_back(r.index);  // posted again after this Poll's dispatching
  // What the peer returns: credits, and staged frames it has copied out.
  uint32_t c = ImmCredits(r.imm), staged = ImmStaged(r.imm);
  if (credits_ + c > remote_.recv_depth || staged > tx_staged_.size())
    return Die(Lost("peer returned more credits than it had"));
  credits_ += c;
  for (uint32_t i = 0; i < staged; ++i) {
    tx_staging_used_ -= tx_staged_.front();
    tx_staged_.pop_front();
  }
  auto kind = static_cast<MsgKind>(ImmKind(r.imm));
  if (kind == MsgKind::kCredit) return r.byte_len == 0 ? Status::Ok() : Die(Lost("credit update with bytes"));
  if (kind == MsgKind::kClose) return Die(Status(Code::kUnavailable, "fabric link closed by the peer"));
  if (kind != MsgKind::kFrame && kind != MsgKind::kPlaced && kind != MsgKind::kStaged)
    return Die(Lost("unknown message kind"));
  if (r.byte_len < kFrameHeaderSize) return Die(Lost("message shorter than a frame header"));
  const uint8_t* slot = RecvSlot(r.index);
  auto h = proto::DecodeFrameHeader(std::span<const uint8_t, kFrameHeaderSize>(slot, kFrameHeaderSize));
  if (!h.ok()) return Die(h.status());

  if (kind == MsgKind::kFrame) {
    if (h->type == FrameType::kData) return Die(Lost("DATA frame without placement"));
    if (r.byte_len != kFrameHeaderSize + h->len) return Die(Lost("frame length differs from its message"));
    ++*frames;
    stats_.frames_in.fetch_add(1, std::memory_order_relaxed);
    sink.OnFrame(*h, {slot + kFrameHeaderSize, h->len});
    if (h->type == FrameType::kLinkClose) return Die(Status(Code::kUnavailable, "fabric link closed by the peer"));
    return Status::Ok();
  }
  if (h->type != FrameType::kData || r.byte_len != kFrameHeaderSize) return Die(Lost("misplaced DATA message"));
  if (kind == MsgKind::kStaged) {
    // Same placement rule as the sender's RingAlloc (nothing else is held:
    // staged frames are consumed in order).
    size_t size = opt_.staging_bytes;
    size_t waste = rx_staging_off_ + h->len > size ? size - rx_staging_off_ : 0;
    if (rx_staging_off_ + h->len > size) rx_staging_off_ = 0;
    const uint8_t* src = staging_base_ + rx_staging_off_;
    rx_staging_off_ += h->len;
    ++owed_staged_;
    owed_staged_bytes_ += waste + h->len;
    PayloadDest d = sink.OnHeader(*h);
    size_t want = 0;
    for (int i = 0; i < d.n && i < 2; ++i) want += d.iov[i].iov_len;
    if (d.n > 0 && d.n <= 2 && want == h->len) {  // else misplaced: discarded
      for (int i = 0; i < d.n; ++i) {
        std::memcpy(d.iov[i].iov_base, src, d.iov[i].iov_len);
        src += d.iov[i].iov_len;
      }
    }
  }
  stats_.data_bytes_in.fetch_add(h->len, std::memory_order_relaxed);
  ++*frames;
  stats_.frames_in.fetch_add(1, std::memory_order_relaxed);
  sink.OnFrame(*h, {});
  return Status::Ok();
}

Status RdmaLink::Repost() {
  if (repost_.empty()) return Status::Ok();
  size_t n = repost_.size();
  for (size_t i = 0; i < n; ++i) {
    recv_sges_[i] = {reinterpret_cast<uintptr_t>(RecvSlot(repost_[i])), static_cast<uint32_t>(kSlotSize),
                     local_mr_->lkey};
    recv_wrs_[i] = {};
    recv_wrs_[i].wr_id = kRecvTag | repost_[i];
    recv_wrs_[i].sg_list = &recv_sges_[i];
    recv_wrs_[i].num_sge = 1;
    recv_wrs_[i].next = i + 1 < n ? &recv_wrs_[i + 1] : nullptr;
  }
  ibv_recv_wr* bad = nullptr;
  if (int err = ibv_post_recv(qp_.get(), recv_wrs_.data(), &bad))
    return Die(Status::FromErrno("rdma link: ibv_post_recv", err));
  owed_credits_ += static_cast<uint32_t>(n);
  repost_.clear();
  return Status::Ok();
}

}  // namespace vsocket::fabric
