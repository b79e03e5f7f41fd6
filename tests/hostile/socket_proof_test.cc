// Processes inside one VM cannot register each other's connections (issue
// 17, finding 9). In process mode every process that may open a VM's port
// socket is that VM, with its addresses: the anti-spoofing check (the local
// address is the VM's) cannot tell them apart, so one could register
// another's 4-tuple, have its peer's bytes land in its own rings and the
// real owner's registration refused. Now a registration must name a socket
// the registering process proved it holds, by passing the socket itself on
// the port's proof socket (vhost/user/proof.h).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "proto/control.h"
#include "tests/hostile/raw_guest.h"
#include "tests/integration/daemon_fixture.h"
#include "vhost/user/proof.h"

namespace vsocket {
namespace {

using proto::Endpoint;
using proto::Role;
using testing::Daemon;
using testing::RawGuest;
using testing::RegistryState;

Endpoint Loopback(uint16_t port) {
  Endpoint e;
  e.addr = {127, 0, 0, 1};
  e.port = port;
  return e;
}

uint16_t PortOf(int fd, bool peer) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (peer) getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len);
  else getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

// A loopback TCP connection: *client and *server are its two ends.
void Connection(int* client, int* server) {
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(l, 1), 0);
  socklen_t len = sizeof(a);
  getsockname(l, reinterpret_cast<sockaddr*>(&a), &len);
  *client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(connect(*client, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  *server = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(*server, 0);
  close(l);
}

class SocketProofTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_.set_prove_sockets(true);  // the product's default
    ASSERT_TRUE(daemon_.Start());
  }
  void TearDown() override {
    EXPECT_TRUE(daemon_.Alive()) << "vsocketd survived";
    EXPECT_TRUE(daemon_.StopsCleanly()) << "vsocketd exits with status 0 on SIGTERM";
  }
  long long Counter(const std::string& name) { return Daemon::Number(daemon_.Stats(), name); }

  Daemon daemon_{{"vm:1"}};
};

// The victim, a process of the VM, holds the client end of a connection;
// the attacker, another process of the same VM, holds the server end. The
// attacker cannot register the victim's 4-tuple, neither without a proof
// nor with the proof of a socket of its own; the victim can, and the
// attacker can register its own end: they pair.
TEST_F(SocketProofTest, OnlyTheProcessThatHoldsTheSocketMayRegisterIt) {
  int cfd = -1, sfd = -1;
  Connection(&cfd, &sfd);
  Endpoint c = Loopback(PortOf(cfd, false)), s = Loopback(PortOf(cfd, true));
  int to_child[2], from_child[2];
  ASSERT_EQ(pipe2(to_child, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(from_child, O_CLOEXEC), 0);
  pid_t victim = fork();
  ASSERT_GE(victim, 0);
  if (victim == 0) {
    close(sfd);
    char go;
    // Registers once the attacker has tried (its attempts come first).
    if (read(to_child[0], &go, 1) != 1) _exit(2);
    RawGuest guest(daemon_.socket_path("vm"));
    std::string result = !guest.ok()                      ? "session: " + guest.error()
                         : !guest.OpenProofs().empty()    ? "proof channel: " + guest.OpenProofs()
                         : !guest.Prove(cfd).empty()      ? "prove: " + guest.Prove(cfd)
                                                          : guest.Register(1, Role::kClient, c, s);
    (void)!write(from_child[1], result.data(), result.size());
    close(from_child[1]);
    (void)!read(to_child[0], &go, 1);  // keeps its device until told
    _exit(0);
  }
  close(cfd);
  close(from_child[1]);
  RawGuest attacker(daemon_.socket_path("vm"));
  ASSERT_TRUE(attacker.ok()) << attacker.error();
  ASSERT_EQ(attacker.OpenProofs(), "");
  // Without any proof.
  EXPECT_EQ(attacker.Register(7, Role::kClient, c, s), "spoofed-address");
  // With the proof of its own socket (the other end: a different 4-tuple).
  ASSERT_EQ(attacker.Prove(sfd), "");
  EXPECT_EQ(attacker.Register(8, Role::kClient, c, s), "spoofed-address");
  EXPECT_EQ(Counter("rejected_unproven"), 2);
  // The victim registers its own connection.
  ASSERT_EQ(write(to_child[1], "g", 1), 1);
  char buf[256];
  ssize_t n = read(from_child[0], buf, sizeof(buf));
  EXPECT_EQ(std::string(buf, n > 0 ? static_cast<size_t>(n) : 0), "pending");
  // The attacker's own end, proved above: they pair.
  EXPECT_EQ(attacker.Register(9, Role::kServer, s, c), "pending");
  EXPECT_EQ(RegistryState(daemon_, "vm", c.port, s.port), "accelerated accelerated");
  EXPECT_EQ(Counter("sockets_proved"), 2);
  ASSERT_EQ(write(to_child[1], "x", 1), 1);
  int status = 0;
  waitpid(victim, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(sfd);
  close(to_child[0]);
  close(to_child[1]);
  close(from_child[0]);
}

// One request on a raw proof channel: the reply's error (0: accepted), -1
// if there was no reply.
int Ask(int ch, vhost::proof::Op op, int fd) {
  vhost::proof::Request req;
  req.op = op;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{&req, sizeof(req)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cm), &fd, sizeof(int));
  }
  if (sendmsg(ch, &msg, MSG_NOSIGNAL) != sizeof(req)) return -1;
  vhost::proof::Reply reply;
  if (recv(ch, &reply, sizeof(reply), 0) != sizeof(reply)) return -1;
  return static_cast<int>(reply.error);
}

// What a hostile process can send on the proof socket: memory of no device,
// proofs before a bind, sockets that are not connected TCP sockets, no
// descriptor at all. Each is refused with a reason; the daemon carries on
// and a well-behaved process still proves and registers.
TEST_F(SocketProofTest, ForgedProofsAreRefused) {
  int ch = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string path = vhost::proof::SocketPath(daemon_.socket_path("vm"));
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(connect(ch, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << path;
  int cfd = -1, sfd = -1;
  Connection(&cfd, &sfd);
  EXPECT_EQ(Ask(ch, vhost::proof::Op::kProve, cfd), EPERM) << "a proof before the bind";
  int memfd = memfd_create("not-a-device", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(memfd, 1 << 20), 0);
  EXPECT_EQ(Ask(ch, vhost::proof::Op::kBind, memfd), ENODEV) << "memory of no device";
  EXPECT_EQ(Ask(ch, vhost::proof::Op::kBind, -1), EINVAL) << "no descriptor";
  close(memfd);
  close(ch);
  // A real session's channel: only connected TCP sockets are proofs.
  RawGuest guest(daemon_.socket_path("vm"));
  ASSERT_TRUE(guest.ok()) << guest.error();
  ASSERT_EQ(guest.OpenProofs(), "");
  int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  int unconnected = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  for (int fd : {udp, unconnected, pair[0], memfd_create("x", MFD_CLOEXEC)})
    EXPECT_NE(guest.Prove(fd), "") << "fd " << fd << " accepted as a proof";
  EXPECT_EQ(guest.Prove(cfd), "");
  EXPECT_EQ(guest.Register(1, Role::kClient, Loopback(PortOf(cfd, false)), Loopback(PortOf(cfd, true))), "pending");
  // One proof, one registration: the same 4-tuple again is refused.
  EXPECT_EQ(guest.Register(2, Role::kClient, Loopback(PortOf(cfd, false)), Loopback(PortOf(cfd, true))),
            "spoofed-address");
  EXPECT_EQ(Counter("proofs_refused"), 6) << "a proof before the bind, a bind without a descriptor, four non-TCP sockets";
  EXPECT_GE(Counter("proof_binds_refused"), 1);  // (and any bind a session tried before its device was made)
  EXPECT_EQ(Counter("sockets_proved"), 1);
  for (int fd : {udp, unconnected, pair[0], pair[1], cfd, sfd}) close(fd);
}

// A connection one side already shut down for writing still holds its
// 4-tuple, and is proof of it: an application that sends, shuts down its
// write side and then reads the answer (its first read registering the
// connection) must not be refused as a spoofer. Both ends of one loopback
// connection: the one that shut down (FIN_WAIT2) and its peer (CLOSE_WAIT).
TEST_F(SocketProofTest, AHalfClosedConnectionIsStillAProof) {
  RawGuest guest(daemon_.socket_path("vm"));
  ASSERT_TRUE(guest.ok()) << guest.error();
  ASSERT_EQ(guest.OpenProofs(), "");
  int cfd = -1, sfd = -1;
  Connection(&cfd, &sfd);
  ASSERT_EQ(shutdown(cfd, SHUT_WR), 0);
  char b;
  ASSERT_EQ(recv(sfd, &b, 1, 0), 0) << "the FIN arrived";
  EXPECT_EQ(guest.Prove(cfd), "") << "shut down for writing (FIN_WAIT2)";
  EXPECT_EQ(guest.Prove(sfd), "") << "its peer shut down (CLOSE_WAIT)";
  EXPECT_EQ(guest.Register(1, Role::kClient, Loopback(PortOf(cfd, false)), Loopback(PortOf(cfd, true))), "pending");
  EXPECT_EQ(guest.Register(2, Role::kServer, Loopback(PortOf(sfd, false)), Loopback(PortOf(sfd, true))), "pending");
  EXPECT_EQ(Counter("proofs_refused"), 0);
  close(cfd);
  close(sfd);
}

#ifndef SO_NETNS_COOKIE
#define SO_NETNS_COOKIE 71
#endif

uint64_t NetnsCookie() {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  uint64_t cookie = 0;
  socklen_t len = sizeof(cookie);
  getsockopt(s, SOL_SOCKET, SO_NETNS_COOKIE, &cookie, &len);
  close(s);
  return cookie;
}

// A process that can make a network namespace of its own (unprivileged
// user namespaces allow that) can build a connection there with the very
// 4-tuple of another process's connection in the VM, and prove that one.
// Once the operator attested the VM's namespace (vsocketctl attest, run
// inside it), a socket from any other namespace is no proof.
TEST_F(SocketProofTest, ALookAlikeSocketOfAnotherNamespaceIsNoProofOnceTheVmsIsAttested) {
  int own_c = -1, own_s = -1;
  Connection(&own_c, &own_s);
  Endpoint c = Loopback(PortOf(own_c, false)), s = Loopback(PortOf(own_c, true));
  int sp[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(sp[0]);
    char status = 'u';
    int cl = -1;
    if (unshare(CLONE_NEWNET) == 0) {
      int io = socket(AF_INET, SOCK_DGRAM, 0);
      ifreq ifr{};
      std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
      ioctl(io, SIOCGIFFLAGS, &ifr);
      ifr.ifr_flags |= IFF_UP;
      ioctl(io, SIOCSIFFLAGS, &ifr);
      // The same 4-tuple as the connection in the VM's namespace.
      int l = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(s.port);
      cl = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in b = a;
      b.sin_port = htons(c.port);
      if (bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && listen(l, 1) == 0 &&
          bind(cl, reinterpret_cast<sockaddr*>(&b), sizeof(b)) == 0 &&
          connect(cl, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0)
        status = 'k';
    }
    char control[CMSG_SPACE(sizeof(int))] = {};
    iovec iov{&status, 1};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (status == 'k') {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* cm = CMSG_FIRSTHDR(&msg);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(cm), &cl, sizeof(int));
    }
    (void)!sendmsg(sp[1], &msg, 0);
    char done;
    (void)!read(sp[1], &done, 1);  // (keeps its namespace until told)
    _exit(0);
  }
  close(sp[1]);
  char status = 0;
  char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{&status, 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ASSERT_EQ(recvmsg(sp[0], &msg, MSG_CMSG_CLOEXEC), 1);
  int foreign = -1;
  if (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr) std::memcpy(&foreign, CMSG_DATA(cm), sizeof(int));
  auto finish = [&] {
    (void)!write(sp[0], "x", 1);
    waitpid(child, nullptr, 0);
    close(sp[0]);
    for (int fd : {own_c, own_s, foreign})
      if (fd >= 0) close(fd);
  };
  if (status != 'k' || foreign < 0) {
    finish();
    GTEST_SKIP() << "cannot make a network namespace here (needs CAP_SYS_ADMIN or user namespaces)";
  }
  RawGuest guest(daemon_.socket_path("vm"));
  ASSERT_TRUE(guest.ok()) << guest.error();
  ASSERT_EQ(guest.OpenProofs(), "");
  // Not attested: the look-alike passes (what attestation is for).
  EXPECT_EQ(guest.Prove(foreign), "");
  std::string out = daemon_.Command("attest vm " + std::to_string(NetnsCookie()));
  EXPECT_NE(out.find("attested"), std::string::npos) << out;
  EXPECT_NE(guest.Prove(foreign), "") << "a socket of another network namespace proved a registration";
  EXPECT_EQ(Counter("proofs_wrong_netns"), 1);
  // The real one still proves.
  EXPECT_EQ(guest.Prove(own_c), "");
  EXPECT_EQ(daemon_.Command("attest vm 0").rfind("error: usage", 0), 0u);
  EXPECT_EQ(daemon_.Command("attest nosuchvm 5").rfind("error: no VM", 0), 0u);
  finish();
}

}  // namespace
}  // namespace vsocket
