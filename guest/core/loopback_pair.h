// Unit tests of guest/core: a connected TCP pair on loopback, the kernel's
// own sockets (the library's tables know nothing of them until a test
// adopts one).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>

namespace vsocket::guest::testing {

// {connecting end, accepted end}; {-1, -1} if any step failed.
inline std::pair<int, int> LoopbackTcpPair() {
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l < 0) return {-1, -1};
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  int a = -1, b = -1;
  if (bind(l, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0 && listen(l, 1) == 0 &&
      getsockname(l, reinterpret_cast<sockaddr*>(&sa), &len) == 0) {
    a = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (a >= 0 && connect(a, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) b = accept(l, nullptr, nullptr);
  }
  close(l);
  if (b < 0) {
    if (a >= 0) close(a);
    return {-1, -1};
  }
  return {a, b};
}

}  // namespace vsocket::guest::testing
