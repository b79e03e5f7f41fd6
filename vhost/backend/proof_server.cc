#include "vhost/backend/proof_server.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/log.h"
#include "base/unix_addr.h"
#include "vhost/backend/backend_device.h"
#include "vhost/user/proof.h"

namespace vsocket::vhost {

ProofServer::~ProofServer() {
  stop_ = true;
  if (wake_) {
    uint64_t one = 1;
    (void)!write(wake_.get(), &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
}

void ProofServer::Start() {
  if (thread_.joinable()) return;
  wake_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  thread_ = std::thread([this] { Run(); });
}

Status ProofServer::Listen(const std::string& port_path, size_t max_channels) {
  std::string path = proof::SocketPath(port_path);
  auto addr = UnixAddress(path, "proof socket");
  if (!addr.ok()) return addr.status();
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return Status::FromErrno("socket");
  unlink(path.c_str());  // a stale one from a previous run
  if (bind(fd.get(), AsSockaddr(*addr), sizeof(*addr)) != 0)
    return Status::FromErrno("bind " + path);
  // Whoever may open the port may open its proof socket: made before the
  // port, it gets the mode the umask gives (as the port does), and the
  // port's group with it (vhost_backend.cc). A proof only ever helps the
  // process that holds the socket.
  if (listen(fd.get(), 64) != 0) return Status::FromErrno("listen " + path);
  {
    MutexLock lock(mu_);
    auto l = std::make_shared<Listener>();
    l->port_path = port_path;
    l->fd = std::move(fd);
    l->max_channels = max_channels;
    listeners_.push_back(std::move(l));
  }
  Start();
  uint64_t one = 1;
  (void)!write(wake_.get(), &one, sizeof(one));
  return Status::Ok();
}

void ProofServer::Close(const std::string& port_path) {
  MutexLock lock(mu_);
  auto it = std::find_if(listeners_.begin(), listeners_.end(),
                         [&](const auto& l) { return l->port_path == port_path; });
  if (it == listeners_.end()) return;
  unlink(proof::SocketPath(port_path).c_str());
  listeners_.erase(it);  // (closed once the thread's poll set lets go of it too)
  closing_.push_back(port_path);
  // The thread drops the port's channels on its next pass, before it
  // accepts any on a listener opened again for the same port.
  if (wake_) {
    uint64_t one = 1;
    (void)!write(wake_.get(), &one, sizeof(one));
  }
}

void ProofServer::Accept(const Listener& l) {
  for (;;) {
    UniqueFd fd(accept4(l.fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) return;
    size_t open = std::count_if(channels_.begin(), channels_.end(),
                                [&](const Channel& c) { return c.port_path == l.port_path; });
    if (open >= l.max_channels) {
      counters_.channels_refused.fetch_add(1, std::memory_order_relaxed);
      continue;  // closed: the guest's registrations stay on kernel TCP
    }
    counters_.channels.fetch_add(1, std::memory_order_relaxed);
    channels_.push_back(Channel{l.port_path, std::move(fd), {}, false});
  }
}

bool ProofServer::Serve(Channel& c) {
  // At most a few requests per pass: one guest cannot keep the others waiting.
  for (int served = 0; served < 64; ++served) {
    // (Room for the largest request: a larger one is truncated, MSG_TRUNC.)
    alignas(8) uint8_t buf[sizeof(proof::DirectFetch) + 1];
    proof::Request req;
    // Every descriptor that came along is ours to close.
    std::vector<UniqueFd> fds;
    int msg_flags = 0;
    ssize_t n = proof::RecvWithFds<4>(c.fd.get(), buf, sizeof(buf), MSG_DONTWAIT, &fds, &msg_flags);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    if (n == 0) return false;
    if (n >= static_cast<ssize_t>(sizeof(req))) std::memcpy(&req, buf, sizeof(req));
    if (n == sizeof(proof::DirectFetch) && req.magic == proof::kMagic && req.op == proof::Op::kDirectFetch &&
        fds.empty() && !(msg_flags & (MSG_CTRUNC | MSG_TRUNC))) {
      proof::DirectFetch f;
      std::memcpy(&f, buf, sizeof(f));
      if (!ServeDirectFetch(c, f.token)) return false;
      continue;
    }
    proof::Reply reply;
    if (n != sizeof(req) || req.magic != proof::kMagic || fds.size() != 1 || (msg_flags & MSG_CTRUNC)) {
      reply.error = EINVAL;
      counters_.refused.fetch_add(1, std::memory_order_relaxed);
    } else if (req.op == proof::Op::kBind) {
      Result<FileId> f = FileIdOf(fds[0].get());
      std::shared_ptr<BackendDevice> d = f.ok() ? find_(c.port_path, f.value()) : nullptr;
      if (c.bound || d == nullptr) {
        reply.error = c.bound ? EINVAL : ENODEV;
        counters_.binds_refused.fetch_add(1, std::memory_order_relaxed);
      } else {
        c.device = d;
        c.bound = true;
      }
    } else if (req.op == proof::Op::kProve) {
      std::shared_ptr<BackendDevice> d = c.device.lock();
      Result<SocketTuple> t = d ? InspectTcpSocket(fds[0].get()) : Status(Code::kFailedPrecondition, "");
      uint64_t netns = t.ok() ? netns_(c.port_path) : 0;
      if (!c.bound || d == nullptr) {
        reply.error = EPERM;
      } else if (!t.ok()) {
        reply.error = EINVAL;
      } else if (netns != 0 && t.value().netns_cookie != netns) {
        // A look-alike 4-tuple built in a namespace of the process's own
        // (unprivileged user namespaces allow that): not the VM's socket.
        reply.error = EXDEV;
        counters_.wrong_netns.fetch_add(1, std::memory_order_relaxed);
      } else {
        d->proofs().Add(t.value());
        counters_.proved.fetch_add(1, std::memory_order_relaxed);
      }
      if (reply.error != 0) counters_.refused.fetch_add(1, std::memory_order_relaxed);
    } else {
      reply.error = EINVAL;
      counters_.refused.fetch_add(1, std::memory_order_relaxed);
    }
    fds.clear();  // (our copy of the guest's socket: closed before we answer)
    if (send(c.fd.get(), &reply, sizeof(reply), MSG_DONTWAIT | MSG_NOSIGNAL) != sizeof(reply)) return false;
  }
  return true;
}

bool ProofServer::ServeDirectFetch(Channel& c, uint64_t token) {
  proof::DirectReply reply;
  DirectGrant grant;
  std::shared_ptr<BackendDevice> d = c.device.lock();
  if (!c.bound || d == nullptr) {
    reply.error = EPERM;
  } else if (Status st = fetch_ ? fetch_(c.port_path, d.get(), token, &grant) : Status(Code::kNotFound, "");
             !st.ok()) {
    reply.error = ENOENT;
  }
  reply.side = grant.side;
  iovec iov{&reply, sizeof(reply)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 2)];
  if (reply.error == 0) {
    int fds[2] = {grant.memory.get(), grant.wake.get()};
    proof::AttachFds(&msg, control, sizeof(control), fds, 2);
    counters_.direct_fetched.fetch_add(1, std::memory_order_relaxed);
  } else {
    counters_.direct_refused.fetch_add(1, std::memory_order_relaxed);
  }
  // (Our copies of the fds close when grant goes: the process has its own.)
  return sendmsg(c.fd.get(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(reply));
}

void ProofServer::Run() {
  pthread_setname_np(pthread_self(), "vsocketd-proof");
  std::vector<pollfd> pfds;
  while (!stop_.load()) {
    {
      MutexLock lock(mu_);
      for (const std::string& p : closing_)
        std::erase_if(channels_, [&](const Channel& c) { return c.port_path == p; });
      closing_.clear();
      polled_ = listeners_;
    }
    pfds.clear();
    pfds.push_back({wake_.get(), POLLIN, 0});
    for (const auto& l : polled_) pfds.push_back({l->fd.get(), POLLIN, 0});
    size_t first_channel = pfds.size();
    for (const Channel& c : channels_) pfds.push_back({c.fd.get(), POLLIN, 0});
    if (poll(pfds.data(), pfds.size(), -1) < 0 && errno != EINTR) break;
    if (pfds[0].revents) {
      uint64_t v;
      (void)!read(wake_.get(), &v, sizeof(v));
    }
    for (size_t i = first_channel, j = 0; i < pfds.size(); ++i, ++j)
      if (pfds[i].revents && !Serve(channels_[j])) channels_[j].fd.reset();
    std::erase_if(channels_, [](const Channel& c) { return !c.fd; });
    MutexLock lock(mu_);
    for (size_t i = 1; i < first_channel; ++i) {
      const auto& l = polled_[i - 1];
      // (Not one closed meanwhile: its channels would outlive the port.)
      bool open = std::find(listeners_.begin(), listeners_.end(), l) != listeners_.end();
      if (pfds[i].revents && open) Accept(*l);
    }
  }
}

}  // namespace vsocket::vhost
