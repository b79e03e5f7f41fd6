#include "host-backend/fabric/tcp_fabric.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/unique_fd.h"

namespace vsocket::fabric {

Status ConfigureLinkSocket(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return Status::FromErrno("link socket O_NONBLOCK");
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) return Status::FromErrno("TCP_NODELAY");
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)) != 0) return Status::FromErrno("SO_KEEPALIVE");
  // Notice a silently dead peer host within about 10 s.
  int idle = 5, intvl = 1, cnt = 5;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
  int timeout_ms = 10000;
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout_ms, sizeof(timeout_ms));
  return Status::Ok();
}

std::optional<std::pair<int, int>> ConnectedTcpPairForTest() {
  UniqueFd l(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (!l || bind(l.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(l.get(), 1) != 0 ||
      getsockname(l.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return std::nullopt;
  UniqueFd c(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!c || connect(c.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return std::nullopt;
  UniqueFd s(accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!s || !ConfigureLinkSocket(c.get()).ok() || !ConfigureLinkSocket(s.get()).ok()) return std::nullopt;
  return std::make_pair(c.release(), s.release());
}

}  // namespace vsocket::fabric
