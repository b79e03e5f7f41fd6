#include "vhost/user/frontend.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "base/clock.h"
#include "base/log.h"
#include "base/own_fd.h"
#include "base/unix_addr.h"
#include "proto/virtio_ring.h"
#include "vhost/user/proof.h"

namespace vsocket::vhost {

using user::Message;
using user::Payload;
using user::Request;

const char* user::ToString(Request r) {
  switch (r) {
    case Request::kGetFeatures: return "GET_FEATURES";
    case Request::kSetFeatures: return "SET_FEATURES";
    case Request::kSetOwner: return "SET_OWNER";
    case Request::kResetOwner: return "RESET_OWNER";
    case Request::kSetMemTable: return "SET_MEM_TABLE";
    case Request::kSetLogBase: return "SET_LOG_BASE";
    case Request::kSetLogFd: return "SET_LOG_FD";
    case Request::kSetVringNum: return "SET_VRING_NUM";
    case Request::kSetVringAddr: return "SET_VRING_ADDR";
    case Request::kSetVringBase: return "SET_VRING_BASE";
    case Request::kGetVringBase: return "GET_VRING_BASE";
    case Request::kSetVringKick: return "SET_VRING_KICK";
    case Request::kSetVringCall: return "SET_VRING_CALL";
    case Request::kSetVringErr: return "SET_VRING_ERR";
    case Request::kGetProtocolFeatures: return "GET_PROTOCOL_FEATURES";
    case Request::kSetProtocolFeatures: return "SET_PROTOCOL_FEATURES";
    case Request::kGetQueueNum: return "GET_QUEUE_NUM";
    case Request::kSetVringEnable: return "SET_VRING_ENABLE";
    case Request::kSetStatus: return "SET_STATUS";
    case Request::kGetStatus: return "GET_STATUS";
  }
  return "UNKNOWN";
}

namespace {

constexpr uint64_t kWantedProtocol = user::kProtoReplyAck | user::kProtoStatus;

std::string ToHex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

Result<std::unique_ptr<VhostUserFrontend>> VhostUserFrontend::Create(const FrontendOptions& o) {
  if (o.num_queues == 0 || !proto::IsValidQueueSize(o.queue_size))
    return Status(Code::kInvalidArgument, "queue count must be > 0 and size a power of two");
  size_t ring_bytes = SplitRing::BytesFor(o.queue_size) * o.num_queues;
  if (o.region_bytes <= ring_bytes) return Status(Code::kInvalidArgument, "region too small for the rings");
  std::unique_ptr<VhostUserFrontend> f(new VhostUserFrontend(o));
  auto region = ShmRegion::Create("vsocket-guest", o.region_bytes, o.pages, o.seal);
  if (!region.ok()) return region.status();
  f->region_ = std::move(region).value();
  uint8_t* p = f->region_->base();
  f->queues_.resize(o.num_queues);
  for (Queue& q : f->queues_) {
    q.ring = SplitRing::LayOut(p, o.queue_size);
    p += SplitRing::BytesFor(o.queue_size);
    q.kick.reset(OwnFd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)));
    q.call.reset(OwnFd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)));
    if (!q.kick || !q.call) return Status::FromErrno("eventfd");
  }
  f->allocator_ = RegionAllocator(p, f->region_->size() - ring_bytes);
  return f;
}

VhostUserFrontend::~VhostUserFrontend() = default;

bool VhostUserFrontend::BackendGone() const {
  if (!sock_) return true;
  pollfd p{sock_.get(), POLLIN, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLIN));
}

Status VhostUserFrontend::Connect() {
  sock_.reset();
  for (Queue& q : queues_) {
    // Chains the old session never completed (or completed but were not yet
    // popped) are abandoned, not silently reissued: their owners decide what
    // to do (TakeAbandoned()).
    for (uint64_t cookie : q.driver.InFlightCookies()) abandoned_.push_back(cookie);
    q.driver = VirtqueueDriver(q.ring, options_.event_idx);
  }
  VS_RETURN_IF_ERROR(OpenSocket());
  Status st = Handshake();
  if (!st.ok()) sock_.reset();
  return st;
}

Status VhostUserFrontend::OpenSocket() {
  sock_.reset();
  int fd = OwnFd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd < 0) return Status::FromErrno("socket(AF_UNIX)");
  UniqueFd s(fd);
  auto addr = UnixAddress(options_.socket_path, "vhost-user socket");
  if (!addr.ok()) return addr.status();
  // The backend may be (re)starting: retry ENOENT/ECONNREFUSED a while.
  int64_t deadline =
      MonotonicMs() + (options_.connect_wait_ms < 0 ? options_.timeout_ms : options_.connect_wait_ms);
  while (::connect(fd, AsSockaddr(*addr), sizeof(*addr)) != 0) {
    if ((errno != ENOENT && errno != ECONNREFUSED) || MonotonicMs() >= deadline)
      return Status::FromErrno("connect " + options_.socket_path);
    usleep(20000);
  }
  sock_ = std::move(s);
  return Status::Ok();
}

Status VhostUserFrontend::Handshake() {
  auto features = GetU64(Request::kGetFeatures);
  if (!features.ok()) return features.status();
  uint64_t need = proto::kFeatureVersion1 | proto::kFeatureVhostUserProtocol;
  if ((*features & need) != need)
    return Status(Code::kFailedPrecondition,
                  "backend lacks VERSION_1 or PROTOCOL_FEATURES (offers 0x" + ToHex(*features) + ")");
  features_ = need | options_.device_features;
  if (options_.event_idx) {
    if (!(*features & proto::kFeatureEventIdx))
      return Status(Code::kFailedPrecondition, "backend does not offer EVENT_IDX");
    features_ |= proto::kFeatureEventIdx;
  }
  if ((*features & options_.device_features) != options_.device_features)
    return Status(Code::kFailedPrecondition, "backend lacks requested device features");

  auto proto_features = GetU64(Request::kGetProtocolFeatures);
  if (!proto_features.ok()) return proto_features.status();
  protocol_features_ = 0;
  Payload p{};
  p.u64 = *proto_features & kWantedProtocol;
  VS_RETURN_IF_ERROR(Set(Request::kSetProtocolFeatures, p, 8));
  protocol_features_ = p.u64;  // acks apply from the next message on

  VS_RETURN_IF_ERROR(Set(Request::kSetOwner, p, 0));
  p.u64 = features_;
  VS_RETURN_IF_ERROR(Set(Request::kSetFeatures, p, 8));

  p = Payload{};
  p.memory.nregions = 1;
  auto base = reinterpret_cast<uint64_t>(region_->base());
  p.memory.regions[0] = {base, region_->size(), base, 0};
  int mem_fd = region_->fd();
  VS_RETURN_IF_ERROR(Set(Request::kSetMemTable, p, 8 + sizeof(user::MemoryRegionDesc), {&mem_fd, 1}));

  for (uint32_t i = 0; i < queues_.size(); ++i) {
    Queue& q = queues_[i];
    p = Payload{};
    p.state = {i, q.ring.size()};
    VS_RETURN_IF_ERROR(Set(Request::kSetVringNum, p, sizeof(p.state)));
    p.state = {i, 0};
    VS_RETURN_IF_ERROR(Set(Request::kSetVringBase, p, sizeof(p.state)));
    p = Payload{};
    p.addr = {i,
              0,
              reinterpret_cast<uint64_t>(q.ring.desc()),
              reinterpret_cast<uint64_t>(q.ring.used_base()),
              reinterpret_cast<uint64_t>(q.ring.avail_base()),
              0};
    VS_RETURN_IF_ERROR(Set(Request::kSetVringAddr, p, sizeof(p.addr)));
    p.u64 = i;
    int kfd = q.kick.get(), cfd = q.call.get();
    VS_RETURN_IF_ERROR(Set(Request::kSetVringKick, p, 8, {&kfd, 1}));
    VS_RETURN_IF_ERROR(Set(Request::kSetVringCall, p, 8, {&cfd, 1}));
    p.state = {i, 1};
    VS_RETURN_IF_ERROR(Set(Request::kSetVringEnable, p, sizeof(p.state)));
  }
  if (protocol_features_ & user::kProtoStatus) {
    p.u64 = user::kStatusAcknowledge | user::kStatusDriver | user::kStatusFeaturesOk | user::kStatusDriverOk;
    VS_RETURN_IF_ERROR(Set(Request::kSetStatus, p, 8));
  }
  return Status::Ok();
}

Status VhostUserFrontend::Stop() {
  if (!sock_) return Status::Ok();
  Status result;
  for (uint32_t i = 0; i < queues_.size() && result.ok(); ++i) {
    Payload p{};
    p.state = {i, 0};
    Message m{{static_cast<uint32_t>(Request::kGetVringBase), user::kFlagVersion, sizeof(p.state)}, p};
    result = SendMessage(m);
    if (result.ok()) {
      auto reply = ReceiveReply(Request::kGetVringBase);
      if (!reply.ok()) result = reply.status();
    }
  }
  sock_.reset();
  return result;
}

namespace {

// A proof request is answered in microseconds by a running daemon: one
// that does not answer within this is stopped or wedged (the channel is
// then closed, and opened again for the next proof).
constexpr int kProofTimeoutMs = 1000;

// The port's proof socket lies next to the port itself: through a link to
// the port (a guest's view of a host directory), next to where it leads.
std::string ProofPath(const std::string& port) {
  char real[PATH_MAX];
  if (realpath(port.c_str(), real) != nullptr) return proof::SocketPath(real);
  return proof::SocketPath(port);
}

}  // namespace

Status VhostUserFrontend::OpenProofChannel() {
  MutexLock lock(proof_mu_);
  return OpenProofChannelLocked();
}

Status VhostUserFrontend::OpenProofChannelLocked() {
  proof_.reset();
  std::string path = ProofPath(options_.socket_path);
  auto addr = UnixAddress(path, "proof socket");
  if (!addr.ok()) return addr.status();
  UniqueFd fd;
  // No file: the port asks for no proofs. Refused: the daemon is between
  // its bind and listen (starting): tried again for a while.
  for (int64_t deadline = MonotonicMs() + kProofTimeoutMs;;) {
    fd.reset(OwnFd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)));
    if (!fd) return Status::FromErrno("socket");
    if (connect(fd.get(), AsSockaddr(*addr), sizeof(*addr)) == 0) break;
    int err = errno;
    if (err == ENOENT) {
      proof_wanted_ = false;
      return Status(Code::kNotFound, "no proof socket " + path);
    }
    if (err != ECONNREFUSED && err != EINTR) return Status::FromErrno("connect " + path, err);
    if (MonotonicMs() >= deadline) return Status::FromErrno("connect " + path, err);
    usleep(1000);
  }
  proof_ = std::move(fd);
  proof_wanted_ = true;
  // The backend makes the device once the last setup message is answered:
  // right after Connect() it may not be there yet (ENODEV for a while).
  Status st;
  for (int64_t deadline = MonotonicMs() + kProofTimeoutMs;;) {
    st = ProofRequest(static_cast<uint32_t>(proof::Op::kBind), region_->fd());
    if (st.ok() || st.code() != Code::kNotFound || MonotonicMs() >= deadline) break;
    usleep(1000);
  }
  if (!st.ok()) proof_.reset();
  if (st.code() == Code::kNotFound) return Status(Code::kFailedPrecondition, st.message());  // (kNotFound: no socket)
  return st;
}

Status VhostUserFrontend::ProveSocket(int fd) {
  MutexLock lock(proof_mu_);
  if (!proof_) {
    // Closed after an unanswered request (a stopped daemon): again.
    Status st = OpenProofChannelLocked();
    if (!st.ok()) return st;
  }
  Status st = ProofRequest(static_cast<uint32_t>(proof::Op::kProve), fd);
  // A channel that failed (not an answer) is not used again.
  if (!st.ok() && st.code() == Code::kUnavailable) proof_.reset();
  return st;
}

Status VhostUserFrontend::FetchDirect(uint64_t token, UniqueFd* memory, UniqueFd* wake, uint32_t* side) {
  MutexLock lock(proof_mu_);
  if (!proof_) {
    Status st = OpenProofChannelLocked();
    if (!st.ok()) return st;
  }
  proof::DirectFetch req;
  req.token = token;
  ssize_t n;
  do n = send(proof_.get(), &req, sizeof(req), MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof(req))) {
    proof_.reset();
    return Status(Code::kUnavailable, "proof channel: send failed");
  }
  if (Status st = AwaitProofAnswer(); !st.ok()) {
    proof_.reset();
    return st;
  }
  proof::DirectReply reply;
  std::vector<UniqueFd> fds;
  int msg_flags = 0;
  do n = proof::RecvWithFds<2>(proof_.get(), &reply, sizeof(reply), 0, &fds, &msg_flags);
  while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof(reply)) || reply.magic != proof::kMagic) {
    proof_.reset();
    return Status(Code::kUnavailable, "proof channel: closed");
  }
  if (reply.error != 0) return Status(Code::kNotFound, std::string("direct fetch refused: ") + strerror(static_cast<int>(reply.error)));
  if (fds.size() != 2 && (msg_flags & MSG_CTRUNC))
    return Status(Code::kResourceExhausted, "direct fetch: the pair's fds did not fit (this process is out of fds)");
  if (fds.size() != 2 || reply.side > 1) return Status(Code::kDataLoss, "direct fetch: a malformed answer");
  *memory = std::move(fds[0]);
  *wake = std::move(fds[1]);
  *side = reply.side;
  return Status::Ok();
}

// Waits up to kProofTimeoutMs for the answer to the request just sent.
Status VhostUserFrontend::AwaitProofAnswer() { return proof::AwaitAnswer(proof_.get(), kProofTimeoutMs); }

// One request with one fd, one reply.
Status VhostUserFrontend::ProofRequest(uint32_t op, int fd) {
  return proof::Ask(proof_.get(), static_cast<proof::Op>(op), fd, kProofTimeoutMs);
}

// Not under proof_mu_: in the child only this thread exists, and a copy of
// the lock held by another thread of the parent at the fork would never be
// released.
void VhostUserFrontend::CloseFdsAfterFork() NO_THREAD_SAFETY_ANALYSIS {
  proof_.reset();
  sock_.reset();
  for (Queue& q : queues_) {
    q.kick.reset();
    q.call.reset();
  }
}

void VhostUserFrontend::Kick(size_t i) {
  uint64_t one = 1;
  (void)!write(queues_[i].kick.get(), &one, sizeof(one));
}

bool VhostUserFrontend::WaitCall(size_t i, int timeout_ms) {
  pollfd p{queues_[i].call.get(), POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return false;
  uint64_t v;
  (void)!read(queues_[i].call.get(), &v, sizeof(v));
  return true;
}

std::vector<uint64_t> VhostUserFrontend::TakeAbandoned() { return std::move(abandoned_); }

Status VhostUserFrontend::SendMessage(const Message& msg, std::span<const int> fds) {
  if (!sock_) return Status(Code::kUnavailable, "not connected to the vhost-user backend");
  if (fds.size() > user::kMaxFds) return Status(Code::kInvalidArgument, "too many fds");
  iovec iov{const_cast<Message*>(&msg), sizeof(user::Header) + msg.hdr.size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * user::kMaxFds)] = {};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (!fds.empty()) {
    mh.msg_control = control;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = sendmsg(sock_.get(), &mh, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Status::FromErrno("vhost-user sendmsg");
  if (static_cast<size_t>(n) != iov.iov_len) return Status(Code::kUnavailable, "vhost-user short write");
  return Status::Ok();
}

Result<Message> VhostUserFrontend::ReceiveReply(Request expected) {
  if (!sock_) return Status(Code::kUnavailable, "not connected to the vhost-user backend");
  Message m{};
  size_t got = 0;
  size_t want = sizeof(user::Header);
  int64_t deadline = MonotonicMs() + options_.timeout_ms;
  while (got < want) {
    pollfd p{sock_.get(), POLLIN, 0};
    int left = static_cast<int>(deadline - MonotonicMs());
    if (left <= 0 || poll(&p, 1, left) <= 0)
      return Status(Code::kDeadlineExceeded, std::string("no vhost-user reply to ") + user::ToString(expected));
    ssize_t n = recv(sock_.get(), reinterpret_cast<char*>(&m) + got, want - got, 0);
    if (n == 0) return Status(Code::kUnavailable, "vhost-user backend closed the connection");
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("vhost-user recv");
    }
    got += static_cast<size_t>(n);
    if (got == sizeof(user::Header)) {
      // Validate before reading the payload: a reply is never larger than
      // our payload union.
      if (m.hdr.size > sizeof(Payload)) return Status(Code::kDataLoss, "vhost-user reply payload too large");
      want += m.hdr.size;
    }
  }
  if (m.hdr.request != static_cast<uint32_t>(expected) || !(m.hdr.flags & user::kFlagReply) ||
      (m.hdr.flags & user::kFlagVersionMask) != user::kFlagVersion)
    return Status(Code::kDataLoss, std::string("unexpected vhost-user reply to ") + user::ToString(expected));
  return m;
}

Status VhostUserFrontend::Set(Request req, const Payload& payload, uint32_t size, std::span<const int> fds) {
  bool ack = (protocol_features_ & user::kProtoReplyAck) != 0;
  Message m{{static_cast<uint32_t>(req), user::kFlagVersion | (ack ? user::kFlagNeedReply : 0u), size}, payload};
  VS_RETURN_IF_ERROR(SendMessage(m, fds));
  if (!ack) return Status::Ok();
  auto reply = ReceiveReply(req);
  if (!reply.ok()) return reply.status();
  if (reply->hdr.size != 8 || reply->payload.u64 != 0)
    return Status(Code::kFailedPrecondition, std::string("vhost-user backend rejected ") + user::ToString(req));
  return Status::Ok();
}

Result<uint64_t> VhostUserFrontend::GetU64(Request req) {
  Message m{{static_cast<uint32_t>(req), user::kFlagVersion, 0}, {}};
  VS_RETURN_IF_ERROR(SendMessage(m));
  auto reply = ReceiveReply(req);
  if (!reply.ok()) return reply.status();
  if (reply->hdr.size != 8) return Status(Code::kDataLoss, "vhost-user reply has wrong size");
  return reply->payload.u64;
}

}  // namespace vsocket::vhost
