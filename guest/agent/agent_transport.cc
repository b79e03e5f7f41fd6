#include "guest/agent/agent_transport.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "proto/virtio_ring.h"
#include "vhost/ring/split_ring.h"
#include "vhost/user/proof.h"

#include "base/unix_addr.h"

namespace vsocket::agent {
namespace {

// The grant is the agent's word, but checked like any shared input: a
// ring or the pool outside the memory, or across a page, is refused.
Status CheckGrant(const Grant& g, uint64_t memfd_bytes) {
  if (g.magic != kGrantMagic || g.version != kGrantVersion) return Status(Code::kDataLoss, "not a grant");
  if (g.status == GrantStatus::kBusy)
    return Status(Code::kUnavailable, "another process holds the VM's vSocket device");
  if (g.status == GrantStatus::kBackendAway)
    return Status(Code::kUnavailable, "vsocketd is not attached to the VM now (vsocket-guestd: link down)");
  if (g.status == GrantStatus::kDeviceFailed)
    return Status(Code::kUnavailable, "vsocket-guestd cannot set a free function up (its log says why: huge pages?)");
  if (g.status != GrantStatus::kOk) return Status(Code::kUnavailable, "the agent has no working device");
  if (g.num_pages == 0 || g.num_pages > kGrantMaxPages || g.memory_bytes != g.num_pages * kGrantPageBytes ||
      memfd_bytes < g.memory_bytes)
    return Status(Code::kDataLoss, "grant: memory and pages disagree");
  if (!proto::IsValidQueueSize(g.queue_size)) return Status(Code::kDataLoss, "grant: bad queue size");
  auto within_page = [&](uint64_t off, uint64_t len) {
    return len != 0 && off < g.memory_bytes && len <= g.memory_bytes - off &&
           off / kGrantPageBytes == (off + len - 1) / kGrantPageBytes;
  };
  for (uint64_t off : g.ring_offset)
    if (off % 64 != 0 || !within_page(off, vhost::SplitRing::BytesFor(g.queue_size)))
      return Status(Code::kDataLoss, "grant: a ring outside the memory or across a page");
  if (g.pool_offset % 4096 != 0)
    return Status(Code::kDataLoss, "grant: unaligned pool");
  if (g.pool_bytes == 0 || g.pool_offset > g.memory_bytes || g.pool_bytes > g.memory_bytes - g.pool_offset)
    return Status(Code::kDataLoss, "grant: pool outside the memory");
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<guest::Transport>> AgentTransport::Open(const std::string& path) {
  auto sock = Connect(path);
  if (!sock.ok()) return Status(Code::kUnavailable, sock.status().message());
  return OpenConnected(std::move(sock).value(), path);
}

Result<UniqueFd> AgentTransport::Connect(const std::string& path, int* err) {
  if (err != nullptr) *err = 0;
  UniqueFd sock(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (sock.get() < 0) return Status::FromErrno("socket");
  auto addr = UnixAddress(path, "agent socket");
  if (!addr.ok()) return addr.status();
  if (connect(sock.get(), AsSockaddr(*addr), sizeof(*addr)) != 0) {
    int e = errno;
    if (err != nullptr) *err = e;
    return Status(Code::kUnavailable, "no vsocket-guestd at " + path + ": " + strerror(e));
  }
  return sock;
}

Result<std::unique_ptr<guest::Transport>> AgentTransport::OpenConnected(UniqueFd sock, const std::string& path) {
  Grant g;
  // Bounded: an agent that accepted but never answers is not waited on.
  pollfd p{sock.get(), POLLIN, 0};
  if (poll(&p, 1, 5000) != 1) return Status(Code::kUnavailable, "vsocket-guestd did not answer");
  std::vector<UniqueFd> got;  // (every fd of a bad message is closed)
  int msg_flags = 0;
  ssize_t n = vhost::proof::RecvWithFds<kGrantFds>(sock.get(), &g, sizeof(g), 0, &got, &msg_flags);
  if (n != static_cast<ssize_t>(sizeof(g))) return Status(Code::kDataLoss, "short grant from vsocket-guestd");
  if (g.status == GrantStatus::kOk && (got.size() != kGrantFds || (msg_flags & MSG_CTRUNC)))
    return Status(Code::kDataLoss, "grant without its fds");
  UniqueFd fds[kGrantFds];
  for (size_t i = 0; i < kGrantFds && i < got.size(); ++i) fds[i] = std::move(got[i]);
  std::unique_ptr<AgentTransport> t(new AgentTransport());
  t->path_ = path;
  VS_RETURN_IF_ERROR(t->Take(std::move(sock), g, fds));
  return std::unique_ptr<guest::Transport>(std::move(t));
}

Status AgentTransport::Take(UniqueFd sock, const Grant& g, UniqueFd fds[kGrantFds]) {
  struct stat st{};
  uint64_t memfd_bytes = fds[0].get() >= 0 && fstat(fds[0].get(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  VS_RETURN_IF_ERROR(CheckGrant(g, memfd_bytes));
  void* p = mmap(nullptr, g.memory_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0].get(), 0);
  if (p == MAP_FAILED) return Status::FromErrno("map the agent's memory");
  grant_ = g;
  base_ = static_cast<uint8_t*>(p);
  sock_ = std::move(sock);
  memfd_ = std::move(fds[0]);
  for (int q = 0; q < 2; ++q) {
    kick_[q] = std::move(fds[1 + q]);
    call_[q] = std::move(fds[3 + q]);
    // The device has seen nothing on these rings yet (DRIVER_OK with empty
    // rings); the driver side starts here.
    queues_[q] = vhost::VirtqueueDriver(vhost::SplitRing::LayOut(base_ + g.ring_offset[q], g.queue_size),
                                        g.event_idx != 0);
  }
  // The allocator spans the whole memory so that its boundaries are the
  // pages' (a pool starting mid-page would shift them); what precedes the
  // pool (the rings) is taken first, page by page, and never handed out.
  allocator_ = std::make_unique<vhost::RegionAllocator>(base_, g.pool_offset + g.pool_bytes, kGrantPageBytes);
  for (uint64_t taken = 0; taken < g.pool_offset;) {
    uint64_t n = std::min<uint64_t>(kGrantPageBytes - taken % kGrantPageBytes, g.pool_offset - taken);
    if (allocator_->Allocate(n, 1) != base_ + taken) return Status(Code::kInternal, "cannot set the pool apart");
    taken += n;
  }
  return Status::Ok();
}

AgentTransport::~AgentTransport() {
  if (base_ != nullptr) munmap(base_, grant_.memory_bytes);
}

void AgentTransport::Kick(guest::QueueId q) {
  uint64_t one = 1;
  (void)!write(kick_[static_cast<size_t>(q)].get(), &one, sizeof(one));
}

bool AgentTransport::BackendGone() const {
  // The agent never writes after the grant: readable means it went away.
  pollfd p{sock_.get(), POLLIN | POLLRDHUP, 0};
  return poll(&p, 1, 0) == 1;
}

uint64_t AgentTransport::Gpa(const void* p) const {
  uint64_t off = static_cast<uint64_t>(static_cast<const uint8_t*>(p) - base_);
  return grant_.page_gpa[off / kGrantPageBytes] + off % kGrantPageBytes;
}

namespace {
constexpr int64_t kProofTimeoutMs = 5000;  // the agent asks vsocketd in turn (TCG guests are slow)
}  // namespace

Status AgentTransport::OpenProofs() {
  MutexLock lock(proof_mu_);
  return OpenProofsLocked();
}

Status AgentTransport::OpenProofsLocked() {
  const std::string p = vhost::proof::SocketPath(path_);
  auto addr = UnixAddress(p, "proof socket");
  if (!addr.ok()) return addr.status();
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return Status::FromErrno("socket");
  if (connect(fd.get(), AsSockaddr(*addr), sizeof(*addr)) != 0) {
    if (errno == ENOENT || errno == ECONNREFUSED)
      return Status(Code::kNotFound, "the agent proves no sockets (no " + p + ")");
    return Status::FromErrno("connect " + p);
  }
  // Bound by the memory only this process (and the agent) holds.
  Status st = vhost::proof::Ask(fd.get(), vhost::proof::Op::kBind, memfd_.get(), kProofTimeoutMs);
  if (!st.ok()) return Status(st.code() == Code::kNotFound ? Code::kFailedPrecondition : st.code(), st.message());
  proof_ = std::move(fd);
  proves_.store(true, std::memory_order_release);
  return Status::Ok();
}

Status AgentTransport::ProveSocket(int fd) {
  MutexLock lock(proof_mu_);
  if (proof_.get() < 0) VS_RETURN_IF_ERROR(OpenProofsLocked());  // (closed after a failure)
  Status st = vhost::proof::Ask(proof_.get(), vhost::proof::Op::kProve, fd, kProofTimeoutMs);
  if (!st.ok() && st.code() == Code::kUnavailable) proof_.reset();
  return st;
}

void AgentTransport::CloseFdsAfterFork() NO_THREAD_SAFETY_ANALYSIS {
  // Our copies of the fds only; the mapping stays (it is the parent's
  // rings too) and is never unmapped by us. (Not under proof_mu_: another
  // thread of the parent may have held it at the fork.)
  for (UniqueFd* f : {&sock_, &memfd_, &kick_[0], &kick_[1], &call_[0], &call_[1], &proof_}) f->reset();
  base_ = nullptr;
}

void AgentTransport::ReleaseMemory() {
  // The agent maps the same pages until it has reset the device behind
  // this grant (when we ask for another, or the link went down): what we
  // drop here goes back to the kernel only once no device can write it.
  if (base_ == nullptr || !memfd_) return;
  (void)vhost::ReplaceWithZeroPages(base_, grant_.memory_bytes);
  memfd_.reset();
}

}  // namespace vsocket::agent
