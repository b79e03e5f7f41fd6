#include "guest/agent/agent_server.h"

#include <linux/sockios.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "base/clock.h"
#include "base/log.h"
#include "base/unix_addr.h"
#include "guest/agent/grant.h"
#include "vhost/backend/socket_proof.h"
#include "vhost/user/proof.h"

namespace vsocket::agent {
namespace {

// epoll tags: the listening sockets, a proof channel (kProofChannel |
// index), or (slot << 3) | kind.
constexpr uint64_t kListen = ~uint64_t{0};
constexpr uint64_t kProofListen = ~uint64_t{1};
constexpr uint64_t kProofChannel = uint64_t{1} << 62;
enum Kind : uint64_t { kClient = 0, kUio = 1, kKick0 = 2, kKick1 = 3 };
uint64_t Tag(size_t slot, Kind k) { return (static_cast<uint64_t>(slot) << 3) | k; }

Status SendGrant(int fd, const agent::Grant& g, const int* fds, size_t nfds) {
  iovec iov{const_cast<agent::Grant*>(&g), sizeof(g)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * kGrantFds)] = {};
  if (nfds > 0) vhost::proof::AttachFds(&msg, ctl, sizeof(ctl), fds, nfds);
  if (sendmsg(fd, &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(g))) return Status::FromErrno("send grant");
  return Status::Ok();
}

// The network namespace of socket `fd`: its SO_NETNS_COOKIE (by_cookie)
// or the inode of its namespace file (SIOCGSKNS); 0 if unreadable.
uint64_t NetnsOf(int fd, bool by_cookie) {
  if (by_cookie) return vhost::NetnsCookie(fd);
  UniqueFd ns(ioctl(fd, SIOCGSKNS));
  struct stat st{};
  if (ns.get() < 0 || fstat(ns.get(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

}  // namespace

Result<std::unique_ptr<AgentServer>> AgentServer::Listen(const std::string& path, const VmDeviceOptions& options,
                                                         bool proofs, std::vector<std::string> bdfs) {
  std::unique_ptr<AgentServer> s(new AgentServer(path, options));
  s->options_.own_session = false;
  if (bdfs.empty() && !options.bdf.empty()) bdfs.push_back(options.bdf);
  if (bdfs.empty()) {
    auto found = PciFunction::VsocketFunctions(options.mac_prefix);
    if (!found.ok()) return found.status();
    bdfs = std::move(*found);
  }
  auto addr = UnixAddress(path);
  if (!addr.ok()) return addr.status();
  s->listen_ = UniqueFd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (s->listen_.get() < 0) return Status::FromErrno("socket");
  s->epoll_ = UniqueFd(epoll_create1(EPOLL_CLOEXEC));
  if (s->epoll_.get() < 0) return Status::FromErrno("epoll_create1");
  if (proofs) {
    // The last function (QEMU numbers them in command-line order): the
    // operator attaches the agent's own last, on PATH.agent.
    if (bdfs.size() < 2) return Status(Code::kNotFound, "--proofs needs two vSocket functions: the agent's and one for processes");
    std::sort(bdfs.begin(), bdfs.end());
    // The namespace the agent vouches for: its own (decision 127).
    UniqueFd own(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (own.get() < 0) return Status::FromErrno("socket");
    s->netns_by_cookie_ = true;
    s->netns_ = NetnsOf(own.get(), true);
    if (s->netns_ == 0) s->netns_by_cookie_ = false, s->netns_ = NetnsOf(own.get(), false);
    if (s->netns_ == 0)
      return Status(Code::kFailedPrecondition,
                    "cannot tell this network namespace (neither SO_NETNS_COOKIE nor SIOCGSKNS): socket proofs "
                    "could not refuse a look-alike socket of another namespace");
    VS_RETURN_IF_ERROR(s->OpenAuthority(bdfs.back()));
    bdfs.pop_back();
  }
  for (const std::string& bdf : bdfs) {
    s->slots_.push_back(Slot{bdf, nullptr, UniqueFd(), 0, {}, {}});
    VS_RETURN_IF_ERROR(s->OpenDevice(s->slots_.size() - 1));
  }
  // The socket appears only once every device is up: a process that finds
  // it can be served. Its directory (/run/vsocket by default, a tmpfs at
  // boot) is made if missing.
  if (size_t slash = path.rfind('/'); slash != std::string::npos && slash > 0) {
    const std::string dir = path.substr(0, slash);
    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return Status::FromErrno("mkdir " + dir);
  }
  unlink(path.c_str());
  // Any user's processes when the VM's authority limits each function to
  // its own memory and vouches for sockets (decision 130); root's only
  // otherwise: a function reaches all of the VM's memory then.
  const mode_t mask = s->authority_ ? 0 : 0077;
  mode_t old = umask(mask);
  int r = bind(s->listen_.get(), AsSockaddr(*addr), sizeof(*addr));
  umask(old);
  if (r != 0) return Status::FromErrno("bind " + path);
  if (listen(s->listen_.get(), 16) != 0) return Status::FromErrno("listen " + path);
  VS_RETURN_IF_ERROR(s->Watch(s->listen_.get(), kListen));
  if (s->authority_) {
    const std::string proof_path = vhost::proof::SocketPath(path);
    auto paddr = UnixAddress(proof_path, "proof socket");
    if (!paddr.ok()) return paddr.status();
    s->proof_listen_ = UniqueFd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (s->proof_listen_.get() < 0) return Status::FromErrno("socket");
    unlink(proof_path.c_str());
    old = umask(mask);
    r = bind(s->proof_listen_.get(), AsSockaddr(*paddr), sizeof(*paddr));
    umask(old);
    if (r != 0) return Status::FromErrno("bind " + proof_path);
    if (listen(s->proof_listen_.get(), 16) != 0) return Status::FromErrno("listen " + proof_path);
    VS_RETURN_IF_ERROR(s->Watch(s->proof_listen_.get(), kProofListen));
  }
  return s;
}

Status AgentServer::OpenAuthority(const std::string& bdf) {
  VmDeviceOptions o = options_;
  o.bdf = bdf;
  o.own_session = true;
  o.huge_pages = 1;  // two rings and a few buffers
  auto d = VmDevice::Open(o);
  if (!d.ok()) return Status(d.status().code(), bdf + ": " + d.status().message());
  auto ack = (*d)->Hello(proto::kFeatureProofAuthority);
  if (!ack.ok()) return Status(ack.status().code(), bdf + ": HELLO: " + ack.status().message());
  if (!(ack->features & proto::kFeatureProofAuthority))
    return Status(Code::kFailedPrecondition,
                  "vsocketd does not take " + bdf +
                      " for the VM's socket-proof authority: attach the agent's function last, on the port's agent "
                      "socket (PATH.agent, prove_sockets = agent; docs/vm-mode.md)");
  authority_ = std::move(d).value();
  authority_bdf_ = bdf;
  VS_LOG(kInfo, "vsocket-guestd: %s is the VM's socket-proof authority (vsocketd device %u)", bdf.c_str(),
         ack->device_id);
  return Status::Ok();
}

void AgentServer::AcceptProof() {
  int c = accept4(proof_listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (c < 0) return;
  size_t k = 0;
  while (k < proofs_.size() && proofs_[k].fd.get() >= 0) ++k;
  if (k == proofs_.size()) proofs_.emplace_back();
  proofs_[k] = ProofChannel{UniqueFd(c), SIZE_MAX, 0};
  if (Status st = Watch(c, kProofChannel | k); !st.ok()) proofs_[k].fd.reset();
}

// vhost/user/proof.h's protocol, as vsocketd serves it in process mode,
// with the grant's memfd for the region's: kBind ties the channel to the
// process's grant, kProve reads the socket's 4-tuple from this kernel and
// vouches for it to vsocketd for the device granted to that process.
bool AgentServer::ServeProof(ProofChannel& c) {
  vhost::proof::Request req;
  std::vector<UniqueFd> fds;  // (all closed on every path)
  int msg_flags = 0;
  ssize_t n = vhost::proof::RecvWithFds<2>(c.fd.get(), &req, sizeof(req), MSG_DONTWAIT, &fds, &msg_flags);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
  if (n != static_cast<ssize_t>(sizeof(req)) || req.magic != vhost::proof::kMagic || fds.size() != 1 ||
      (msg_flags & MSG_CTRUNC))
    return false;
  uint32_t err = 0;
  auto granted = [&](size_t k) { return k < slots_.size() && slots_[k].client.get() >= 0 && slots_[k].device; };
  if (req.op == vhost::proof::Op::kBind) {
    auto id = vhost::FileIdOf(fds[0].get());
    err = ENODEV;
    for (size_t k = 0; k < slots_.size() && id.ok(); ++k) {
      if (!granted(k)) continue;
      auto mine = vhost::FileIdOf(slots_[k].device->memory().fd());
      if (mine.ok() && *mine == *id) c.slot = k, c.grant_serial = slots_[k].grant_serial, err = 0;
    }
  } else if (req.op == vhost::proof::Op::kProve) {
    auto t = vhost::InspectTcpSocket(fds[0].get());
    if (!granted(c.slot) || slots_[c.slot].grant_serial != c.grant_serial) {
      err = EPERM;
    } else if (!t.ok()) {
      err = EINVAL;
    } else if (NetnsOf(fds[0].get(), netns_by_cookie_) != netns_) {
      // A connection with the same 4-tuple as one of the VM's can be built
      // in a network namespace of the process's own (unprivileged user
      // namespaces allow that): not the VM's socket, no proof.
      err = EXDEV;
      ++counters_.proofs_wrong_netns;
    } else {
      proto::Family f = t->family == 4 ? proto::Family::kIpv4 : proto::Family::kIpv6;
      proto::Endpoint local{f, t->local_addr, t->local_port}, peer{f, t->peer_addr, t->peer_port};
      Status st = authority_->Vouch(slots_[c.slot].device->ring_gpa(0), local, peer);
      if (!st.ok()) {
        VS_LOG(kWarn, "vsocket-guestd: %s: %s", slots_[c.slot].bdf.c_str(), st.ToString().c_str());
        err = EACCES;
      }
    }
  } else {
    err = EINVAL;
  }
  if (err != 0) ++counters_.proofs_refused;
  else if (req.op == vhost::proof::Op::kProve) ++counters_.proved;
  vhost::proof::Reply reply;
  reply.error = err;
  return send(c.fd.get(), &reply, sizeof(reply), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(reply));
}

AgentServer::~AgentServer() {
  if (listen_.get() >= 0) unlink(path_.c_str());
  if (proof_listen_.get() >= 0) unlink(vhost::proof::SocketPath(path_).c_str());
}

Status AgentServer::Watch(int fd, uint64_t tag) {
  epoll_event ev{};
  ev.events = EPOLLIN | (tag != kListen && (tag & 7) == kClient ? EPOLLRDHUP : 0);
  ev.data.u64 = tag;
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return Status::FromErrno("epoll_ctl add");
  return Status::Ok();
}

Status AgentServer::OpenDevice(size_t i) {
  VmDeviceOptions o = options_;
  o.bdf = slots_[i].bdf;
  auto d = VmDevice::Open(o);
  if (!d.ok()) return Status(d.status().code(), slots_[i].bdf + ": " + d.status().message());
  slots_[i].device = std::move(d).value();
  slots_[i].limited = false;
  slots_[i].link_up = slots_[i].device->device().LinkUp().value_or(true);
  return Watch(slots_[i].device->device().pci().uio_fd(), Tag(i, kUio));
}

Status AgentServer::Grant(UniqueFd client) {
  agent::Grant g;
  // A process that holds a device and asks again has lost its session on
  // it: the VM arrived at another host's vsocketd, which does not know the
  // session (decision 094), or its library gave up on the backend. It gets
  // that device afresh: reset (vsocketd: that device stops) and set up
  // again, its old grant's socket closed. Its old mapping of the memory is
  // its own until it exits (its connections may still resend from there).
  ucred cred{};
  socklen_t cred_len = sizeof(cred);
  pid_t pid = getsockopt(client.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) == 0 ? cred.pid : 0;
  for (size_t k = 0; k < slots_.size() && pid > 0; ++k) {
    if (slots_[k].client.get() < 0 || slots_[k].pid != pid) continue;
    VS_LOG(kInfo, "vsocket-guestd: process %d asks again for a device: %s reset and granted afresh",
           static_cast<int>(pid), slots_[k].bdf.c_str());
    Release(k);
    ++counters_.regrants;
  }
  // A function whose set-up failed when its last process went (its huge
  // pages: that process, or another that lost its session, may still map
  // its old ones until it exits) is tried again now; left without a
  // device it would be lost to every later process.
  size_t broken = 0;
  for (size_t k = 0; k < slots_.size(); ++k) {
    if (slots_[k].device || slots_[k].client.get() >= 0) continue;
    if (Status st = OpenDevice(k); !st.ok()) {
      ++broken;
      VS_LOG(kWarn, "vsocket-guestd: %s still cannot be set up: %s", slots_[k].bdf.c_str(), st.ToString().c_str());
    } else {
      VS_LOG(kInfo, "vsocket-guestd: %s set up again", slots_[k].bdf.c_str());
    }
  }
  size_t i = 0, away = 0;
  for (; i < slots_.size(); ++i) {
    if (slots_[i].client.get() >= 0 || !slots_[i].device) continue;
    if (slots_[i].link_up) break;
    ++away;
  }
  if (i == slots_.size() && away > 0) {
    // Free functions, but vsocketd is not behind them now: the library
    // stays on kernel TCP and asks again later (50 ms, up to 1 s).
    g.status = GrantStatus::kBackendAway;
    ++counters_.refused_away;
    (void)SendGrant(client.get(), g, nullptr, 0);
    return Status::Ok();
  }
  if (i == slots_.size() && broken > 0) {
    // Not busy: a function is free but cannot be set up (logged above).
    g.status = GrantStatus::kDeviceFailed;
    ++counters_.refused_failed;
    (void)SendGrant(client.get(), g, nullptr, 0);
    return Status::Ok();
  }
  if (i == slots_.size()) {
    // One session per device today: as many processes at once as the VM
    // has vSocket functions (queue pairs per process: issue 35).
    g.status = GrantStatus::kBusy;
    ++counters_.refused_busy;
    (void)SendGrant(client.get(), g, nullptr, 0);
    return Status::Ok();
  }
  Slot& s = slots_[i];
  if (Status st = Limit(s); !st.ok()) {
    // Never granted unlimited: vsocketd would serve that process nothing
    // (its device reaches no memory), and the library would wait.
    VS_LOG(kWarn, "vsocket-guestd: %s: %s", s.bdf.c_str(), st.ToString().c_str());
    g.status = GrantStatus::kDeviceFailed;
    ++counters_.refused_failed;
    (void)SendGrant(client.get(), g, nullptr, 0);
    return Status::Ok();
  }
  DmaMemory& mem = s.device->memory();
  g.queue_size = s.device->queue_size();
  g.event_idx = (s.device->features() & proto::kFeatureEventIdx) != 0;
  g.memory_bytes = mem.size();
  g.ring_offset[0] = s.device->ring_offset(0);
  g.ring_offset[1] = s.device->ring_offset(1);
  g.pool_offset = (mem.used() + 4095) & ~uint64_t{4095};
  g.pool_bytes = mem.size() > g.pool_offset ? mem.size() - g.pool_offset : 0;
  g.num_pages = static_cast<uint32_t>(mem.num_pages());
  if (g.num_pages > kGrantMaxPages) return Status(Code::kOutOfRange, "more DMA pages than a grant holds");
  for (size_t k = 0; k < mem.num_pages(); ++k) g.page_gpa[k] = mem.page_gpa(k);
  for (int q = 0; q < 2; ++q) {
    s.kick[q] = UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    s.call[q] = UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (s.kick[q].get() < 0 || s.call[q].get() < 0) return Status::FromErrno("eventfd");
  }
  int fds[kGrantFds] = {mem.fd(), s.kick[0].get(), s.kick[1].get(), s.call[0].get(), s.call[1].get()};
  if (Status st = SendGrant(client.get(), g, fds, kGrantFds); !st.ok()) {
    for (int q = 0; q < 2; ++q) s.kick[q] = UniqueFd(), s.call[q] = UniqueFd();
    VS_LOG(kWarn, "vsocket-guestd: %s", st.ToString().c_str());
    return Status::Ok();  // that process's problem, not the agent's
  }
  VS_RETURN_IF_ERROR(Watch(s.kick[0].get(), Tag(i, kKick0)));
  VS_RETURN_IF_ERROR(Watch(s.kick[1].get(), Tag(i, kKick1)));
  VS_RETURN_IF_ERROR(Watch(client.get(), Tag(i, kClient)));
  s.client = std::move(client);
  s.pid = pid;
  s.grant_serial = next_grant_serial_++;
  ++counters_.grants;
  VS_LOG(kInfo, "vsocket-guestd: device %s granted", s.bdf.c_str());
  return Status::Ok();
}

void AgentServer::Release(size_t i) {
  Slot& s = slots_[i];
  s.client = UniqueFd();  // (closing an fd takes it out of the epoll set)
  s.pid = 0;
  for (int q = 0; q < 2; ++q) s.kick[q] = UniqueFd(), s.call[q] = UniqueFd();
  // Reset before the memory goes (VmDevice's member order), then a fresh
  // device for the next process: vsocketd sees this one stop and a new one
  // start, as when a process-mode guest exits and another connects.
  s.device.reset();
  Status st = OpenDevice(i);
  if (!st.ok()) VS_LOG(kError, "vsocket-guestd: cannot set %s up again: %s", s.bdf.c_str(), st.ToString().c_str());
}

void AgentServer::CheckLink(size_t i) {
  Slot& s = slots_[i];
  if (!s.device) return;
  std::optional<bool> up = s.device->device().LinkUp();
  if (!up || *up == s.link_up) return;
  s.link_up = *up;
  if (*up) {
    VS_LOG(kInfo, "vsocket-guestd: %s: link up (vsocketd attached)", s.bdf.c_str());
    return;
  }
  if (s.client.get() < 0) {
    VS_LOG(kInfo, "vsocket-guestd: %s: link down (vsocketd gone)", s.bdf.c_str());
    return;
  }
  VS_LOG(kWarn, "vsocket-guestd: %s: link down (vsocketd gone): process %d's grant ends, its connections go on on "
                "kernel TCP",
         s.bdf.c_str(), static_cast<int>(s.pid));
  ++counters_.link_downs;
  Release(i);  // (the fresh device reads its link: still down until vsocketd is back)
}

Status AgentServer::Limit(Slot& s) {
  if (!authority_ || s.limited) return Status::Ok();
  DmaMemory& mem = s.device->memory();
  std::vector<proto::MemRange> ranges;
  for (size_t k = 0; k < mem.num_pages(); ++k) ranges.push_back({mem.page_gpa(k), DmaMemory::kHugePage});
  // vsocketd learns of the device a little after DRIVER_OK (rte_vhost's
  // new_device): a few tries.
  Status st;
  for (int attempt = 0; attempt < 40; ++attempt) {
    st = authority_->LimitMemory(s.device->ring_gpa(0), ranges);
    if (st.code() != Code::kNotFound) break;
    usleep(50'000);
  }
  if (!st.ok()) return Status(st.code(), "cannot limit the function's memory at vsocketd (decision 130): " + st.message());
  s.limited = true;
  ++counters_.memory_limits;
  return Status::Ok();
}

void AgentServer::LimitIfAsked(Slot& s) {
  if (!authority_ || !s.device->BackendNeedsLimit()) return;
  s.limited = false;  // (vsocketd's device is a new one: it knows no limit)
  if (Status st = Limit(s); !st.ok()) {
    VS_LOG(kWarn, "vsocket-guestd: %s: %s", s.bdf.c_str(), st.ToString().c_str());
    return;
  }
  // Whatever its process posted meanwhile waited unread: look now.
  s.device->KickQueues();
  WakeProcess(s.call);
}

void AgentServer::WakeProcess(UniqueFd* calls) {
  uint64_t v = 1;
  for (int q = 0; calls != nullptr && q < 2; ++q)
    if (calls[q].get() >= 0) (void)!write(calls[q].get(), &v, sizeof(v));
}

void AgentServer::RestartIfCannotCall(VmDevice& device, UniqueFd* calls) {
  if (!device.BackendCannotCall()) return;
  uint64_t n = ++counters_.queue_restarts;
  Status st = device.RestartQueues();
  if (!st.ok())
    VS_LOG(kError, "vsocket-guestd: %s: vsocketd cannot interrupt it and its queues could not be restarted: %s",
           device.bdf().c_str(), st.ToString().c_str());
  else if (n <= 3 || n == 10 || n == 100 || n == 1000)
    VS_LOG(kWarn,
           "vsocket-guestd: %s: vsocketd cannot interrupt it (QEMU started its device while INTx was disabled: "
           "decision 129); its queues restarted with INTx on (%llu restarts so far)",
           device.bdf().c_str(), static_cast<unsigned long long>(n));
  // Its process may sleep on an answer that came without a wake-up.
  WakeProcess(calls);
}

void AgentServer::OnEvent(uint64_t tag) {
  size_t i = tag >> 3;
  if (i >= slots_.size()) return;
  Slot& s = slots_[i];
  uint64_t v = 0;
  switch (static_cast<Kind>(tag & 7)) {
    case kClient:
      if (s.client.get() >= 0) Release(i);
      break;
    case kKick0:
    case kKick1: {
      int q = (tag & 7) == kKick0 ? 0 : 1;
      if (s.kick[q].get() >= 0 && read(s.kick[q].get(), &v, sizeof(v)) == sizeof(v) && s.device) {
        s.device->device().Notify(static_cast<uint16_t>(q));
        ++counters_.kicks;
      }
      break;
    }
    case kUio: {
      if (!s.device) break;
      uint32_t count;
      if (read(s.device->device().pci().uio_fd(), &count, sizeof(count)) != sizeof(count)) break;
      // Deassert (ISR read), let the next one through, wake the process:
      // INTx does not say which queue, so both wake-ups fire.
      uint8_t isr = s.device->device().ReadIsr();
      (void)s.device->device().pci().Unmask();
      ++counters_.interrupts;
      WakeProcess(s.call);
      if (isr & kIsrConfig) CheckLink(i);
      break;
    }
  }
}

Status AgentServer::Run(const volatile sig_atomic_t* stop) {
  while (!*stop) {
    epoll_event evs[16];
    int n = epoll_wait(epoll_.get(), evs, 16, 200);
    if (n < 0 && errno != EINTR) return Status::FromErrno("epoll_wait");
    // A look at every link at least every 200 ms, in case a configuration
    // interrupt was missed (INTx is shared, level-triggered, masked while
    // we handle another).
    // And at every device's used rings: vsocketd flags there a device it
    // cannot interrupt (decision 129).
    if (int64_t now = MonotonicNs(); now - last_link_look_ns_ >= 200'000'000) {
      last_link_look_ns_ = now;
      for (size_t k = 0; k < slots_.size(); ++k) CheckLink(k);
      for (Slot& s : slots_) {
        if (!s.device) continue;
        RestartIfCannotCall(*s.device, s.call);
        LimitIfAsked(s);
      }
      if (authority_) RestartIfCannotCall(*authority_, nullptr);
    }
    for (int i = 0; i < n; ++i) {
      uint64_t tag = evs[i].data.u64;
      if (tag == kListen) {
        int c = accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) VS_RETURN_IF_ERROR(Grant(UniqueFd(c)));
      } else if (tag == kProofListen) {
        AcceptProof();
      } else if (tag & kProofChannel) {
        size_t k = tag & ~kProofChannel;
        if (k < proofs_.size() && proofs_[k].fd.get() >= 0 && !ServeProof(proofs_[k])) proofs_[k].fd.reset();
      } else {
        OnEvent(evs[i].data.u64);
      }
    }
  }
  return Status::Ok();
}

}  // namespace vsocket::agent
