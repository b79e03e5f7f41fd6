#include "vhost/backend/socket_proof.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#ifndef SO_NETNS_COOKIE
#define SO_NETNS_COOKIE 71
#endif

namespace vsocket::vhost {
namespace {

bool Endpoint(const sockaddr_storage& ss, uint8_t family, std::array<uint8_t, 16>* addr, uint16_t* port) {
  if (family == 4 && ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    addr->fill(0);
    std::memcpy(addr->data(), &a->sin_addr, 4);
    *port = ntohs(a->sin_port);
    return true;
  }
  if (family == 6 && ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    std::memcpy(addr->data(), &a->sin6_addr, 16);
    *port = ntohs(a->sin6_port);
    return true;
  }
  return false;
}

bool IsV4Mapped(const std::array<uint8_t, 16>& a) {
  static constexpr uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::equal(std::begin(kPrefix), std::end(kPrefix), a.begin());
}

int IntOpt(int fd, int level, int name) {
  int v = -1;
  socklen_t len = sizeof(v);
  if (getsockopt(fd, level, name, &v, &len) != 0) return -1;
  return v;
}

}  // namespace

Result<SocketTuple> InspectTcpSocket(int fd) {
  struct stat st{};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return Status(Code::kInvalidArgument, "not a socket");
  int domain = IntOpt(fd, SOL_SOCKET, SO_DOMAIN);
  if (domain != AF_INET && domain != AF_INET6) return Status(Code::kInvalidArgument, "not an IP socket");
  if (IntOpt(fd, SOL_SOCKET, SO_TYPE) != SOCK_STREAM || IntOpt(fd, SOL_SOCKET, SO_PROTOCOL) != IPPROTO_TCP)
    return Status(Code::kInvalidArgument, "not a TCP socket");
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0)
    return Status(Code::kInvalidArgument, "no TCP state");
  // Connected, possibly shut down one way or both: the socket still holds
  // its 4-tuple (an application may shut its write side before its first
  // read registers the connection). Not a listener, not one being
  // connected, not one whose connection is over (CLOSE).
  switch (info.tcpi_state) {
    case TCP_ESTABLISHED:
    case TCP_FIN_WAIT1:
    case TCP_FIN_WAIT2:
    case TCP_CLOSE_WAIT:
    case TCP_CLOSING:
    case TCP_LAST_ACK: break;
    default:
      return Status(Code::kInvalidArgument,
                    "not a connected TCP socket (state " + std::to_string(info.tcpi_state) + ")");
  }
  SocketTuple t;
  t.family = domain == AF_INET ? 4 : 6;
  sockaddr_storage local{}, peer{};
  socklen_t ll = sizeof(local), pl = sizeof(peer);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0 ||
      !Endpoint(local, t.family, &t.local_addr, &t.local_port) || !Endpoint(peer, t.family, &t.peer_addr, &t.peer_port))
    return Status(Code::kInvalidArgument, "not a connected TCP socket");
  if (t.family == 6 && IsV4Mapped(t.local_addr) && IsV4Mapped(t.peer_addr)) {
    // A dual-stack socket's IPv4 connection (::ffff:a.b.c.d at both ends):
    // the IPv4 4-tuple its peer sees, as the library names it.
    t.family = 4;
    for (auto* a : {&t.local_addr, &t.peer_addr}) {
      std::memmove(a->data(), a->data() + 12, 4);
      std::fill(a->begin() + 4, a->end(), 0);
    }
  }
  t.netns_cookie = NetnsCookie(fd);
  return t;
}

uint64_t NetnsCookie(int fd) {
  uint64_t cookie = 0;
  socklen_t cl = sizeof(cookie);
  return getsockopt(fd, SOL_SOCKET, SO_NETNS_COOKIE, &cookie, &cl) == 0 ? cookie : 0;
}

Result<FileId> FileIdOf(int fd) {
  struct stat st{};
  if (fstat(fd, &st) != 0) return Status::FromErrno("fstat");
  return FileId{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

void ProvenSockets::Add(const SocketTuple& t) {
  MutexLock lock(mu_);
  if (proofs_.size() >= kMaxProofs) proofs_.pop_front();
  proofs_.push_back(t);
}

bool ProvenSockets::Take(const SocketTuple& t) {
  MutexLock lock(mu_);
  // Newest first: a connection registers right after its proof.
  for (auto it = proofs_.rbegin(); it != proofs_.rend(); ++it) {
    if (*it == t) {
      proofs_.erase(std::next(it).base());
      return true;
    }
  }
  return false;
}

size_t ProvenSockets::size() const {
  MutexLock lock(mu_);
  return proofs_.size();
}

}  // namespace vsocket::vhost
