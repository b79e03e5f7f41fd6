#include "guest/agent/agent_server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "base/log.h"
#include "guest/agent/grant.h"

namespace vsocket::agent {
namespace {

enum Tag : uint64_t { kListen = 1, kClient = 2, kUio = 3, kKick0 = 4, kKick1 = 5 };

Status SendGrant(int fd, const agent::Grant& g, const int* fds, size_t nfds) {
  iovec iov{const_cast<agent::Grant*>(&g), sizeof(g)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * kGrantFds)] = {};
  if (nfds > 0) {
    msg.msg_control = ctl;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  if (sendmsg(fd, &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(g))) return Status::FromErrno("send grant");
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<AgentServer>> AgentServer::Listen(const std::string& path, const VmDeviceOptions& options) {
  std::unique_ptr<AgentServer> s(new AgentServer(path, options));
  s->options_.own_session = false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return Status(Code::kInvalidArgument, "socket path too long: " + path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  s->listen_ = UniqueFd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (s->listen_.get() < 0) return Status::FromErrno("socket");
  unlink(path.c_str());
  mode_t old = umask(0077);
  int r = bind(s->listen_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(old);
  if (r != 0) return Status::FromErrno("bind " + path);
  if (listen(s->listen_.get(), 16) != 0) return Status::FromErrno("listen " + path);
  s->epoll_ = UniqueFd(epoll_create1(EPOLL_CLOEXEC));
  if (s->epoll_.get() < 0) return Status::FromErrno("epoll_create1");
  VS_RETURN_IF_ERROR(s->Watch(s->listen_.get(), kListen));
  VS_RETURN_IF_ERROR(s->OpenDevice());
  return s;
}

AgentServer::~AgentServer() {
  if (listen_.get() >= 0) unlink(path_.c_str());
}

Status AgentServer::Watch(int fd, uint64_t tag) {
  epoll_event ev{};
  ev.events = EPOLLIN | (tag == kClient ? EPOLLRDHUP : 0);
  ev.data.u64 = tag;
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return Status::FromErrno("epoll_ctl add");
  return Status::Ok();
}

Status AgentServer::OpenDevice() {
  auto d = VmDevice::Open(options_);
  if (!d.ok()) return d.status();
  device_ = std::move(d).value();
  return Watch(device_->device().pci().uio_fd(), kUio);
}

Status AgentServer::Grant(UniqueFd client) {
  agent::Grant g;
  if (client_.get() >= 0 || device_ == nullptr) {
    g.status = client_.get() >= 0 ? GrantStatus::kBusy : GrantStatus::kDeviceFailed;
    counters_.refused_busy += client_.get() >= 0;
    (void)SendGrant(client.get(), g, nullptr, 0);
    return Status::Ok();
  }
  DmaMemory& mem = device_->memory();
  g.queue_size = device_->queue_size();
  g.event_idx = (device_->features() & proto::kFeatureEventIdx) != 0;
  g.memory_bytes = mem.size();
  g.ring_offset[0] = device_->ring_offset(0);
  g.ring_offset[1] = device_->ring_offset(1);
  g.pool_offset = (mem.used() + 4095) & ~uint64_t{4095};
  g.pool_bytes = mem.size() > g.pool_offset ? mem.size() - g.pool_offset : 0;
  g.num_pages = static_cast<uint32_t>(mem.num_pages());
  if (g.num_pages > kGrantMaxPages) return Status(Code::kOutOfRange, "more DMA pages than a grant holds");
  for (size_t i = 0; i < mem.num_pages(); ++i) g.page_gpa[i] = mem.page_gpa(i);
  for (int q = 0; q < 2; ++q) {
    kick_[q] = UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    call_[q] = UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (kick_[q].get() < 0 || call_[q].get() < 0) return Status::FromErrno("eventfd");
  }
  int fds[kGrantFds] = {mem.fd(), kick_[0].get(), kick_[1].get(), call_[0].get(), call_[1].get()};
  VS_RETURN_IF_ERROR(SendGrant(client.get(), g, fds, kGrantFds));
  VS_RETURN_IF_ERROR(Watch(kick_[0].get(), kKick0));
  VS_RETURN_IF_ERROR(Watch(kick_[1].get(), kKick1));
  VS_RETURN_IF_ERROR(Watch(client.get(), kClient));
  client_ = std::move(client);
  ++counters_.grants;
  VS_LOG(kInfo, "vsocket-guestd: device %s granted (grant %llu)", device_->bdf().c_str(),
         static_cast<unsigned long long>(counters_.grants));
  return Status::Ok();
}

void AgentServer::Release() {
  client_ = UniqueFd();  // (closing an fd takes it out of the epoll set)
  for (int q = 0; q < 2; ++q) {
    kick_[q] = UniqueFd();
    call_[q] = UniqueFd();
  }
  // Reset before the memory goes (VmDevice's member order), then a fresh
  // device for the next process: vsocketd sees this one stop and a new one
  // start, as when a process-mode guest exits and another connects.
  device_.reset();
  Status st = OpenDevice();
  if (!st.ok()) VS_LOG(kError, "vsocket-guestd: cannot set the device up again: %s", st.ToString().c_str());
}

Status AgentServer::Run(const volatile sig_atomic_t* stop) {
  while (!*stop) {
    epoll_event evs[8];
    int n = epoll_wait(epoll_.get(), evs, 8, 200);
    if (n < 0 && errno != EINTR) return Status::FromErrno("epoll_wait");
    for (int i = 0; i < n; ++i) {
      uint64_t v = 0;
      switch (evs[i].data.u64) {
        case kListen: {
          int c = accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC);
          if (c >= 0) VS_RETURN_IF_ERROR(Grant(UniqueFd(c)));
          break;
        }
        case kClient:
          Release();
          break;
        case kKick0:
        case kKick1: {
          int q = evs[i].data.u64 == kKick0 ? 0 : 1;
          if (kick_[q].get() >= 0 && read(kick_[q].get(), &v, sizeof(v)) == sizeof(v) && device_) {
            device_->device().Notify(static_cast<uint16_t>(q));
            ++counters_.kicks;
          }
          break;
        }
        case kUio: {
          if (!device_) break;
          uint32_t count;
          if (read(device_->device().pci().uio_fd(), &count, sizeof(count)) != sizeof(count)) break;
          // Deassert (ISR read), let the next one through, wake the process:
          // INTx does not say which queue, so both wake-ups fire.
          device_->device().ReadIsr();
          (void)device_->device().pci().Unmask();
          ++counters_.interrupts;
          v = 1;
          for (auto& c : call_)
            if (c.get() >= 0) (void)!write(c.get(), &v, sizeof(v));
          break;
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace vsocket::agent
