// RdmaLink setup: the device and its memory registry, the endpoint info the
// peers exchange, QP creation and the INIT -> RTR -> RTS transitions. The
// per-frame code is in rdma_link_datapath.cc.
#include "host-backend/fabric/rdma_link.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "base/clock.h"
#include "proto/wire.h"

namespace vsocket::fabric {

namespace rdma_internal {
void CloseDevice::operator()(ibv_context* c) const { ibv_close_device(c); }
void DeallocPd::operator()(ibv_pd* p) const { ibv_dealloc_pd(p); }
void DeregMr::operator()(ibv_mr* m) const { ibv_dereg_mr(m); }
void DestroyChannel::operator()(ibv_comp_channel* c) const { ibv_destroy_comp_channel(c); }
void DestroyCq::operator()(ibv_cq* c) const { ibv_destroy_cq(c); }
void DestroyQp::operator()(ibv_qp* q) const { ibv_destroy_qp(q); }
void Unmap::operator()(uint8_t* p) const { munmap(p, len); }
}  // namespace rdma_internal

using namespace rdma_internal;  // NOLINT: this file's own helpers

namespace {

constexpr uint16_t kInfoMagic = 0x5256;  // "VR"
constexpr uint8_t kInfoVersion = 1;

Status Verbs(const char* what, int err) { return Status::FromErrno(std::string("rdma: ") + what, err); }

bool IsIpv4MappedGid(const ibv_gid& g) {
  static const uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, kPrefix, sizeof(kPrefix)) == 0;
}

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// As ints: ibv_reg_mr() is a macro that mixes them with another enum.
constexpr int kLocalAccess = IBV_ACCESS_LOCAL_WRITE;
constexpr int kRemoteAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

}  // namespace

// ---- endpoint info ------------------------------------------------------------

std::array<uint8_t, RdmaEndpointInfo::kEncodedSize> RdmaEndpointInfo::Encode() const {
  std::array<uint8_t, kEncodedSize> out{};
  proto::WireWriter w(out);
  w.U16(kInfoMagic);
  w.U8(kInfoVersion);
  w.U8(0);
  w.U32(qpn);
  w.U32(psn);
  w.Bytes(gid.data(), gid.size());
  w.U16(lid);
  w.U8(gid_index);
  w.U8(port);
  w.U8(mtu);
  w.U8(link_layer);
  w.U16(0);
  w.U32(recv_depth);
  w.U64(staging_addr);
  w.U32(staging_rkey);
  w.U32(staging_size);
  return out;
}

Result<RdmaEndpointInfo> RdmaEndpointInfo::Decode(std::span<const uint8_t> in) {
  auto bad = [](const char* why) { return Status(Code::kDataLoss, std::string("rdma endpoint info: ") + why); };
  if (in.size() != kEncodedSize) return bad("wrong size");
  proto::WireReader r(in);
  RdmaEndpointInfo e;
  if (r.U16() != kInfoMagic) return bad("bad magic");
  if (r.U8() != kInfoVersion) return bad("unsupported version");
  uint8_t reserved = r.U8();
  e.qpn = r.U32();
  e.psn = r.U32();
  r.Bytes(e.gid.data(), e.gid.size());
  e.lid = r.U16();
  e.gid_index = r.U8();
  e.port = r.U8();
  e.mtu = r.U8();
  e.link_layer = r.U8();
  uint16_t reserved2 = r.U16();
  e.recv_depth = r.U32();
  e.staging_addr = r.U64();
  e.staging_rkey = r.U32();
  e.staging_size = r.U32();
  if (!r.ok()) return bad("truncated");
  if (reserved != 0 || reserved2 != 0) return bad("reserved bits set");
  if (e.qpn == 0 || e.qpn > 0xffffff) return bad("qpn out of range");
  if (e.psn > 0xffffff) return bad("psn out of range");
  if (e.mtu < IBV_MTU_256 || e.mtu > IBV_MTU_4096) return bad("mtu out of range");
  if (e.link_layer != IBV_LINK_LAYER_ETHERNET && e.link_layer != IBV_LINK_LAYER_INFINIBAND)
    return bad("unknown link layer");
  if (e.recv_depth < kMinRecvDepth || e.recv_depth > kMaxRecvDepth) return bad("recv depth out of range");
  if (e.staging_size < kMinStaging) return bad("staging ring too small");
  return e;
}

// ---- device -------------------------------------------------------------------

std::vector<std::string> RdmaDevice::List() {
  std::vector<std::string> names;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) return names;
  for (int i = 0; i < n; ++i) names.emplace_back(ibv_get_device_name(list[i]));
  ibv_free_device_list(list);
  return names;
}

Result<std::shared_ptr<RdmaDevice>> RdmaDevice::Open(const Options& opt) {
  std::shared_ptr<RdmaDevice> d(new RdmaDevice());
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) return Verbs("ibv_get_device_list", errno);
  for (int i = 0; i < n && !d->ctx_; ++i) {
    if (!opt.name.empty() && opt.name != ibv_get_device_name(list[i])) continue;
    d->name_ = ibv_get_device_name(list[i]);
    if (ibv_context* c = ibv_open_device(list[i])) d->ctx_.reset(c, rdma_internal::CloseDevice());
    if (!d->ctx_) {
      int err = errno;
      ibv_free_device_list(list);
      return Verbs("ibv_open_device", err);
    }
  }
  ibv_free_device_list(list);
  if (!d->ctx_)
    return Status(Code::kNotFound, opt.name.empty() ? "rdma: no RDMA device" : "rdma: no device " + opt.name);
  d->pd_.reset(ibv_alloc_pd(d->ctx_.get()));
  if (!d->pd_) return Verbs("ibv_alloc_pd", errno);
  d->next_token_ = std::make_shared<std::atomic<uint64_t>>(1);
  d->port_ = opt.port;
  if (int err = ibv_query_port(d->ctx_.get(), d->port_, &d->port_attr_)) return Verbs("ibv_query_port", err);
  if (d->port_attr_.state != IBV_PORT_ACTIVE)
    return Status(Code::kUnavailable, "rdma: port " + std::to_string(d->port_) + " of " + d->name_ + " is not active");
  if (d->port_attr_.link_layer == IBV_LINK_LAYER_INFINIBAND && opt.gid_index < 0) {
    d->gid_index_ = 0;
  } else if (opt.gid_index >= 0) {
    d->gid_index_ = static_cast<uint8_t>(opt.gid_index);
  } else {
    // RoCE: the IPv4-mapped RoCEv2 GID (routable over the IPv4 underlay).
    bool found = false;
    for (int i = 0; i < d->port_attr_.gid_tbl_len && !found; ++i) {
      ibv_gid_entry e{};
      if (ibv_query_gid_ex(d->ctx_.get(), d->port_, static_cast<uint32_t>(i), &e, 0) != 0) continue;
      if (e.gid_type != IBV_GID_TYPE_ROCE_V2 || !IsIpv4MappedGid(e.gid)) continue;
      d->gid_index_ = static_cast<uint8_t>(i);
      found = true;
    }
    if (!found) return Status(Code::kNotFound, "rdma: " + d->name_ + " has no IPv4 RoCEv2 GID");
  }
  if (int err = ibv_query_gid(d->ctx_.get(), d->port_, d->gid_index_, &d->gid_)) return Verbs("ibv_query_gid", err);
  return d;
}

Result<std::shared_ptr<RdmaDevice>> RdmaDevice::Domain() const {
  std::shared_ptr<RdmaDevice> d(new RdmaDevice());
  d->ctx_ = ctx_;
  d->pd_.reset(ibv_alloc_pd(ctx_.get()));
  if (!d->pd_) return Verbs("ibv_alloc_pd", errno);
  d->next_token_ = next_token_;
  d->name_ = name_;
  d->port_ = port_;
  d->gid_index_ = gid_index_;
  d->gid_ = gid_;
  d->port_attr_ = port_attr_;
  return d;
}

RdmaDevice::~RdmaDevice() {
  WriterMutexLock lock(mu_);
  regions_.clear();
  withdrawn_.clear();
}

Result<RdmaDevice::Prepared> RdmaDevice::Prepare(void* addr, size_t len, Use use) const {
  if (addr == nullptr || len == 0) return Status(Code::kInvalidArgument, "rdma: empty memory region");
  // Sends only read: no write access at all for kLocalRead.
  Prepared p;
  p.mr.reset(ibv_reg_mr(pd_.get(), addr, len, use == Use::kRemoteWrite ? kRemoteAccess : 0));
  if (!p.mr) return Verbs("ibv_reg_mr", errno);
  p.use = use;
  p.domain = this;
  return p;
}

Status RdmaDevice::Adopt(Prepared* p, uint32_t* lkey, uint32_t* rkey) {
  if (!p->mr || p->domain != this) return Status(Code::kInvalidArgument, "rdma: registration of another domain");
  WriterMutexLock lock(mu_);
  auto [it, fresh] = regions_.try_emplace(reinterpret_cast<uintptr_t>(p->mr->addr), Region{nullptr, p->use});
  if (!fresh) return Status(Code::kAlreadyExists, "rdma: memory already registered at this address");
  *lkey = p->mr->lkey;
  *rkey = p->use == Use::kRemoteWrite ? p->mr->rkey : 0;
  it->second.mr = std::move(p->mr);
  return Status::Ok();
}

Status RdmaDevice::RegisterMemory(void* addr, size_t len, Use use, uint32_t* lkey, uint32_t* rkey) {
  Result<Prepared> p = Prepare(addr, len, use);
  if (!p.ok()) return p.status();
  return Adopt(&p.value(), lkey, rkey);
}

Status RdmaDevice::UnregisterMemory(void* addr) {
  if (!Take(addr).mr) return Status(Code::kNotFound, "rdma: no memory registered at this address");
  return Status::Ok();
}

RdmaDevice::Prepared RdmaDevice::Take(void* addr) {
  Prepared p;
  WriterMutexLock lock(mu_);
  auto it = regions_.find(reinterpret_cast<uintptr_t>(addr));
  if (it == regions_.end()) return p;
  p.mr = std::move(it->second.mr);
  p.use = it->second.use;
  p.domain = this;
  regions_.erase(it);
  return p;
}

uint64_t RdmaDevice::WithdrawMemory(void* addr) {
  WriterMutexLock lock(mu_);
  auto it = regions_.find(reinterpret_cast<uintptr_t>(addr));
  if (it == regions_.end()) return 0;
  uint64_t token = next_token_->fetch_add(1, std::memory_order_relaxed);
  withdrawn_.emplace(token, std::move(it->second));
  regions_.erase(it);
  return token;
}

bool RdmaDevice::ReleaseWithdrawn(uint64_t token) { return TakeWithdrawn(token).mr != nullptr; }

RdmaDevice::Prepared RdmaDevice::TakeWithdrawn(uint64_t token) {
  Prepared p;
  WriterMutexLock lock(mu_);
  auto it = withdrawn_.find(token);
  if (it == withdrawn_.end()) return p;
  p.mr = std::move(it->second.mr);
  p.use = it->second.use;
  p.domain = this;
  withdrawn_.erase(it);
  return p;
}

std::optional<uint32_t> RdmaDevice::FindLkey(const void* p, size_t len) const {
  auto a = reinterpret_cast<uintptr_t>(p);
  ReaderMutexLock lock(mu_);
  auto it = regions_.upper_bound(a);
  if (it == regions_.begin()) return std::nullopt;
  --it;
  if (it->second.use != Use::kLocalRead) return std::nullopt;
  const ibv_mr* mr = it->second.mr.get();
  if (a + len > it->first + mr->length) return std::nullopt;
  return mr->lkey;
}

// ---- link setup ---------------------------------------------------------------

namespace {
// Completion queue entries one link can need at once: signaled SENDs
// (WRITEs are unsignaled) of its in-flight entries, and its receives.
int CqEntriesPerLink(const RdmaLinkOptions& opt) {
  return static_cast<int>(2 * (opt.max_in_flight + kControlReserve) + opt.recv_depth + 16);
}
}  // namespace

Result<std::shared_ptr<RdmaCompletionQueue>> RdmaCompletionQueue::Create(std::shared_ptr<RdmaDevice> dev, int links,
                                                                         const RdmaLinkOptions& opt) {
  if (links < 1 || links > 64) return Status(Code::kInvalidArgument, "rdma cq: 1..64 links");
  std::shared_ptr<RdmaCompletionQueue> q(new RdmaCompletionQueue());
  q->dev_ = std::move(dev);
  q->capacity_ = links;
  q->channel_.reset(ibv_create_comp_channel(q->dev_->context()));
  if (!q->channel_) return Verbs("ibv_create_comp_channel", errno);
  int fl = fcntl(q->channel_->fd, F_GETFL);
  if (fl < 0 || fcntl(q->channel_->fd, F_SETFL, fl | O_NONBLOCK) != 0) return Status::FromErrno("rdma cq: fcntl");
  int cqe = links * CqEntriesPerLink(opt);
  q->cq_.reset(ibv_create_cq(q->dev_->context(), cqe, nullptr, q->channel_.get(), 0));
  if (!q->cq_) return Verbs("ibv_create_cq", errno);
  if (int err = ibv_req_notify_cq(q->cq_.get(), 0)) return Verbs("ibv_req_notify_cq", err);
  q->armed_ = true;
  return q;
}

RdmaCompletionQueue::~RdmaCompletionQueue() {
  // Events taken but not acknowledged would make ibv_destroy_cq wait.
  ibv_cq* cq;
  void* ctx;
  unsigned n = 0;
  while (channel_ && ibv_get_cq_event(channel_.get(), &cq, &ctx) == 0) ++n;
  if (n > 0) ibv_ack_cq_events(cq_.get(), n);
}

Result<std::unique_ptr<RdmaLink>> RdmaLink::Create(std::shared_ptr<RdmaDevice> dev, const RdmaLinkOptions& opt,
                                                   std::shared_ptr<RdmaCompletionQueue> cq) {
  if (opt.recv_depth < kMinRecvDepth || opt.recv_depth > kMaxRecvDepth || opt.max_in_flight == 0 ||
      opt.max_in_flight > kMaxInFlight || opt.staging_bytes < kMinStaging || opt.staging_bytes > UINT32_MAX ||
      opt.bounce_bytes < proto::kMaxDataFrame)
    return Status(Code::kInvalidArgument, "rdma link: options out of range");
  std::unique_ptr<RdmaLink> l(new RdmaLink());
  l->opt_ = opt;
  l->dev_ = std::move(dev);
  RdmaDevice& d = *l->dev_;
  l->entries_ = opt.max_in_flight + kControlReserve;

  // One mapping: receive slots, send slots, bounce ring | staging ring.
  size_t recv_len = size_t{opt.recv_depth} * kSlotSize;
  size_t send_len = size_t{l->entries_} * kSlotSize;
  size_t local_len = RoundUp(recv_len + send_len, 4096) + RoundUp(opt.bounce_bytes, 4096);
  size_t total = local_len + RoundUp(opt.staging_bytes, 4096);
  void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return Status::FromErrno("rdma link: mmap");
  l->mem_ = std::unique_ptr<uint8_t, Unmap>(static_cast<uint8_t*>(p), Unmap{total});
  uint8_t* base = l->mem_.get();
  l->recv_base_ = base;
  l->send_base_ = base + recv_len;
  l->bounce_base_ = base + RoundUp(recv_len + send_len, 4096);
  l->staging_base_ = base + local_len;
  l->local_mr_.reset(ibv_reg_mr(d.pd(), base, local_len, kLocalAccess));
  if (!l->local_mr_) return Verbs("ibv_reg_mr", errno);
  l->staging_mr_.reset(ibv_reg_mr(d.pd(), l->staging_base_, opt.staging_bytes, kRemoteAccess));
  if (!l->staging_mr_) return Verbs("ibv_reg_mr", errno);

  if (!cq) {
    auto own = RdmaCompletionQueue::Create(l->dev_, 1, opt);
    if (!own.ok()) return own.status();
    cq = std::move(own).value();
  }
  if (cq->links() >= cq->capacity_) return Status(Code::kResourceExhausted, "rdma link: its shared CQ is full");
  l->cq_ = std::move(cq);

  ibv_qp_init_attr qa{};
  qa.send_cq = l->cq_->cq_.get();
  qa.recv_cq = l->cq_->cq_.get();
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 0;
  qa.cap.max_send_wr = 2 * l->entries_;
  qa.cap.max_recv_wr = opt.recv_depth;
  qa.cap.max_send_sge = kMaxSge;
  qa.cap.max_recv_sge = 1;
  l->qp_.reset(ibv_create_qp(d.pd(), &qa));
  if (!l->qp_) return Verbs("ibv_create_qp", errno);
  l->qpn_ = l->qp_->qp_num;
  l->cq_->links_[l->qpn_] = l.get();

  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = d.port();
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  if (int err = ibv_modify_qp(l->qp_.get(), &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    return Verbs("modify QP to INIT", err);

  l->inflight_.resize(l->entries_);
  l->wrs_.resize(2 * l->entries_);
  l->sges_.resize(size_t{l->entries_} * (kMaxSge + 1));
  l->recv_wrs_.resize(opt.recv_depth);
  l->recv_sges_.resize(opt.recv_depth);
  // Receive buffers go up before the peer can send (RTR comes later).
  for (uint32_t i = 0; i < opt.recv_depth; ++i) l->repost_.push_back(i);
  VS_RETURN_IF_ERROR(l->Repost());
  l->owed_credits_ = 0;  // the initial ring is the peer's starting credit

  l->pending_event_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  l->wake_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (!l->pending_event_ || !l->wake_) return Status::FromErrno("rdma link: wake fd");
  for (int fd : {l->cq_->fd(), l->pending_event_.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(l->wake_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return Status::FromErrno("rdma link: epoll_ctl");
  }

  RdmaEndpointInfo& me = l->local_;
  me.qpn = l->qp_->qp_num;
  me.psn = std::random_device{}() & 0xffffff;
  std::memcpy(me.gid.data(), d.gid().raw, 16);
  me.lid = d.port_attr().lid;
  me.gid_index = d.gid_index();
  me.port = d.port();
  me.mtu = static_cast<uint8_t>(d.port_attr().active_mtu);
  me.link_layer = d.port_attr().link_layer;
  me.recv_depth = opt.recv_depth;
  me.staging_addr = reinterpret_cast<uintptr_t>(l->staging_base_);
  me.staging_rkey = l->staging_mr_->rkey;
  me.staging_size = static_cast<uint32_t>(opt.staging_bytes);
  return l;
}

Status RdmaLink::Connect(const RdmaEndpointInfo& remote) {
  if (connected_) return Status(Code::kFailedPrecondition, "rdma link: already connected");
  if (!dead_.ok()) return dead_;
  if (remote.staging_size < kMinStaging || remote.recv_depth < kMinRecvDepth || remote.recv_depth > kMaxRecvDepth)
    return Status(Code::kInvalidArgument, "rdma link: peer endpoint info out of range");
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(std::min(local_.mtu, remote.mtu));
  a.dest_qp_num = remote.qpn;
  a.rq_psn = remote.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = dev_->port();
  a.ah_attr.dlid = remote.lid;
  if (local_.link_layer == IBV_LINK_LAYER_ETHERNET) {
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, remote.gid.data(), 16);
    a.ah_attr.grh.sgid_index = dev_->gid_index();
    a.ah_attr.grh.hop_limit = 64;
  }
  if (int err = ibv_modify_qp(qp_.get(), &a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return Die(Verbs("modify QP to RTR", err));
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = local_.psn;
  a.timeout = opt_.timeout;
  a.retry_cnt = opt_.retry_cnt;
  a.rnr_retry = opt_.rnr_retry;
  a.max_rd_atomic = 1;
  if (int err = ibv_modify_qp(qp_.get(), &a,
                              IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                  IBV_QP_MAX_QP_RD_ATOMIC))
    return Die(Verbs("modify QP to RTS", err));
  remote_ = remote;
  credits_ = remote.recv_depth;
  connected_ = true;
  return Status::Ok();
}

RdmaLink::~RdmaLink() {
  CloseQuietly();
  if (!cq_) return;
  // The QP goes first; then its completions still in the shared CQ are
  // drained (ours are dropped, having no link any more) before another QP
  // can get its number.
  cq_->links_.erase(qpn_);
  qp_.reset();
  (void)cq_->PollAll();
}

void RdmaLink::CloseQuietly() {
  if (!connected_ || !dead_.ok()) return;
  // A peer that already closed (or a dead QP) needs no close message.
  if (!DrainCq().ok()) return;
  for (const RecvDone& r : pending_)
    if (r.status != IBV_WC_SUCCESS || (r.has_imm && ImmKind(r.imm) == static_cast<uint8_t>(MsgKind::kClose))) return;
  // Orderly close: what was queued, then the close message, and wait
  // (bounded) until the NIC has sent it all; then the QP may go.
  if (!Flush().ok()) return;
  if (!sent_link_close_ && credits_ >= 1 && next_seq_ - done_seq_ < entries_) {
    (void)QueueMessage(MsgKind::kClose, nullptr, nullptr, 0, nullptr, 0, 0, 0, 0);
    if (!PostQueued().ok()) return;
  }
  int64_t deadline = MonotonicMs() + kCloseWaitMs;
  while (done_seq_ != posted_seq_ && dead_.ok() && MonotonicMs() < deadline) {
    if (!DrainCq().ok()) break;
    if (done_seq_ == posted_seq_) break;
    pollfd p{cq_->fd(), POLLIN, 0};
    poll(&p, 1, 10);
  }
}

Status RdmaLink::ForceErrorForTest() {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  if (int err = ibv_modify_qp(qp_.get(), &a, IBV_QP_STATE)) return Verbs("modify QP to ERR", err);
  return Status::Ok();
}

}  // namespace vsocket::fabric
