// What a proof says of a TCP socket: its 4-tuple as the peer sees it. A
// dual-stack IPv6 socket carrying an IPv4 connection (::ffff:a.b.c.d at
// both ends, as gRPC's servers and Node.js listen by default) is named as
// the IPv4 connection it is, as the guest library names it; before, every
// registration of one was refused as spoofed-address (issue 34).
#include "vhost/backend/socket_proof.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace vsocket::vhost {
namespace {

struct Accepted {
  int client = -1, server = -1;
  uint16_t port = 0;
  ~Accepted() {
    if (client >= 0) close(client);
    if (server >= 0) close(server);
  }
};

// A dual-stack IPv6 listener on the wildcard (or on ::1), reached from
// `client_family`'s loopback.
void Connect(int client_family, bool v6only, Accepted* out) {
  int l = socket(AF_INET6, SOCK_STREAM, 0);
  ASSERT_GE(l, 0);
  int off = v6only ? 1 : 0;
  ASSERT_EQ(setsockopt(l, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off)), 0);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = v6only ? in6addr_loopback : in6addr_any;
  ASSERT_EQ(bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(l, 1), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(getsockname(l, reinterpret_cast<sockaddr*>(&a), &len), 0);
  out->port = ntohs(a.sin6_port);
  out->client = socket(client_family, SOCK_STREAM, 0);
  if (client_family == AF_INET) {
    sockaddr_in c{};
    c.sin_family = AF_INET;
    c.sin_port = a.sin6_port;
    c.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(out->client, reinterpret_cast<sockaddr*>(&c), sizeof(c)), 0);
  } else {
    sockaddr_in6 c = a;
    c.sin6_addr = in6addr_loopback;
    ASSERT_EQ(connect(out->client, reinterpret_cast<sockaddr*>(&c), sizeof(c)), 0);
  }
  out->server = accept(l, nullptr, nullptr);
  close(l);
  ASSERT_GE(out->server, 0);
}

TEST(InspectTcpSocket, ADualStackSocketsIpv4ConnectionIsNamedAsIpv4) {
  Accepted s;
  Connect(AF_INET, /*v6only=*/false, &s);
  auto server = InspectTcpSocket(s.server);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_EQ(server->family, 4);
  std::array<uint8_t, 16> loopback{127, 0, 0, 1};
  EXPECT_EQ(server->local_addr, loopback);
  EXPECT_EQ(server->peer_addr, loopback);
  EXPECT_EQ(server->local_port, s.port);
  // The IPv4 client's own socket names the same connection, mirrored.
  auto client = InspectTcpSocket(s.client);
  ASSERT_TRUE(client.ok());
  EXPECT_EQ(client->family, 4);
  EXPECT_EQ(client->peer_port, s.port);
  EXPECT_EQ(client->local_port, server->peer_port);
}

TEST(InspectTcpSocket, ARealIpv6ConnectionStaysIpv6) {
  Accepted s;
  Connect(AF_INET6, /*v6only=*/true, &s);
  auto server = InspectTcpSocket(s.server);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_EQ(server->family, 6);
  std::array<uint8_t, 16> loopback{};
  loopback[15] = 1;
  EXPECT_EQ(server->local_addr, loopback);
}

}  // namespace
}  // namespace vsocket::vhost
