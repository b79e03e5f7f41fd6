// Connection setup and per-descriptor semantics: socket, bind, listen,
// connect, accept/accept4, getsockname/getpeername, socket options, dup*,
// fcntl, ioctl, and the non-TCP sockets an LD_PRELOAD library must pass
// through untouched. Every call is checked for its return value and errno.
//
// The rest of the suite: io_test.cc (data path), lifecycle_test.cc
// (shutdown, close, reset, SIGPIPE), readiness_test.cc (poll, select,
// epoll), process_test.cc (fork, exec, threads), fortify_test.cc,
// stress_test.cc, peer_test.cc (against a remote socket_peer).
#include <fcntl.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/un.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <thread>

#include "tests/socket/test_util.h"

namespace vsocket::socktest {
namespace {

// Exchanges one message each way over a connected pair.
void ExpectRoundTrip(int a, int b, const std::string& msg = "ping") {
  ASSERT_TRUE(SendAll(a, msg));
  EXPECT_EQ(RecvExactly(b, msg.size()), msg);
  ASSERT_TRUE(SendAll(b, msg + "-reply"));
  EXPECT_EQ(RecvExactly(a, msg.size() + 6), msg + "-reply");
}

// ---------------------------------------------------------------------------
// socket, bind, listen

TEST(Socket, TypeFlagsSockNonblockAndSockCloexecAreHonored) {
  Fd plain = TcpSocket();
  ASSERT_TRUE(plain.valid());
  EXPECT_EQ(StatusFlags(plain.get()) & O_NONBLOCK, 0);
  EXPECT_EQ(FdFlags(plain.get()) & FD_CLOEXEC, 0);

  Fd flagged = TcpSocket(SOCK_NONBLOCK | SOCK_CLOEXEC);
  ASSERT_TRUE(flagged.valid());
  EXPECT_NE(StatusFlags(flagged.get()) & O_NONBLOCK, 0);
  EXPECT_NE(FdFlags(flagged.get()) & FD_CLOEXEC, 0);
}

TEST(Socket, UnknownDomainTypeOrProtocolFailsWithMatchingErrno) {
  VS_EXPECT_ERRNO(socket(AF_MAX + 1, SOCK_STREAM, 0), EAFNOSUPPORT);
  VS_EXPECT_ERRNO(socket(AF_INET, 0x7f, 0), EINVAL);
  VS_EXPECT_ERRNO(socket(AF_INET, SOCK_STREAM, IPPROTO_UDP), EPROTONOSUPPORT);
}

TEST(Bind, PortZeroAssignsEphemeralPortReportedByGetsockname) {
  Fd s = TcpSocket();
  sockaddr_in want = TestAddr();
  VS_ASSERT_OK(bind(s.get(), AsSockaddr(&want), sizeof want));
  sockaddr_in got = SockName(s.get());
  EXPECT_EQ(got.sin_family, AF_INET);
  EXPECT_EQ(got.sin_addr.s_addr, want.sin_addr.s_addr);
  EXPECT_NE(Port(got), 0);
}

TEST(Bind, SecondBindOfSameSocketFailsEinval) {
  Fd s = TcpSocket();
  sockaddr_in a = TestAddr();
  VS_ASSERT_OK(bind(s.get(), AsSockaddr(&a), sizeof a));
  VS_EXPECT_ERRNO(bind(s.get(), AsSockaddr(&a), sizeof a), EINVAL);
}

TEST(Bind, PortHeldByListenerFailsEaddrinuse) {
  Fd listener = Listener();
  sockaddr_in taken = SockName(listener.get());
  Fd s = TcpSocket();
  VS_EXPECT_ERRNO(bind(s.get(), AsSockaddr(&taken), sizeof taken), EADDRINUSE);
}

TEST(Bind, ShortAddressLengthFailsEinval) {
  Fd s = TcpSocket();
  sockaddr_in a = TestAddr();
  VS_EXPECT_ERRNO(bind(s.get(), AsSockaddr(&a), sizeof a - 1), EINVAL);
}

TEST(Listen, UnboundSocketListensOnEphemeralPortAndAcceptsConnections) {
  Fd listener = TcpSocket();
  VS_ASSERT_OK(listen(listener.get(), 4));
  sockaddr_in bound = SockName(listener.get());
  EXPECT_EQ(bound.sin_addr.s_addr, htonl(INADDR_ANY));
  ASSERT_NE(Port(bound), 0);
  sockaddr_in target = TestAddr();
  target.sin_port = bound.sin_port;
  Fd client = ConnectTo(target);
  Fd server = AcceptWithin(listener.get());
  ASSERT_TRUE(client.valid() && server.valid());
  ExpectRoundTrip(client.get(), server.get());
}

TEST(Listen, ListenOnConnectedSocketFailsEinval) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  VS_EXPECT_ERRNO(listen(c.client.get(), 4), EINVAL);
}

// ---------------------------------------------------------------------------
// connect

TEST(Connect, BlockingConnectEstablishesConnectionThatCarriesData) {
  Fd listener = Listener();
  sockaddr_in addr = SockName(listener.get());
  Fd client = TcpSocket();
  VS_ASSERT_OK(connect(client.get(), AsSockaddr(&addr), sizeof addr));
  EXPECT_EQ(GetIntOpt(client.get(), SOL_SOCKET, SO_ERROR), 0);
  Fd server = AcceptWithin(listener.get());
  ASSERT_TRUE(server.valid());
  ExpectRoundTrip(client.get(), server.get());
}

TEST(Connect, NonblockingConnectGivesEinprogressThenPolloutAndSoErrorZero) {
  Fd listener = Listener();
  sockaddr_in addr = SockName(listener.get());
  Fd client = TcpSocket(SOCK_NONBLOCK);
  VS_ASSERT_ERRNO(connect(client.get(), AsSockaddr(&addr), sizeof addr), EINPROGRESS);
  short ev = WaitFor(client.get(), POLLOUT);
  EXPECT_TRUE(ev & POLLOUT) << "revents " << ev;
  EXPECT_FALSE(ev & (POLLERR | POLLHUP)) << "revents " << ev;
  EXPECT_EQ(GetIntOpt(client.get(), SOL_SOCKET, SO_ERROR), 0);
  Fd server = AcceptWithin(listener.get());
  ASSERT_TRUE(server.valid());
  ExpectRoundTrip(client.get(), server.get());
}

// The old idiom of calling connect() again to learn the outcome: Linux
// answers 0 once after completion, EISCONN from then on.
TEST(Connect, RepeatedConnectAfterNonblockingCompletionReturnsZeroThenEisconn) {
  Fd listener = Listener();
  sockaddr_in addr = SockName(listener.get());
  Fd client = TcpSocket(SOCK_NONBLOCK);
  VS_ASSERT_ERRNO(connect(client.get(), AsSockaddr(&addr), sizeof addr), EINPROGRESS);
  ASSERT_TRUE(WaitFor(client.get(), POLLOUT) & POLLOUT);
  EXPECT_EQ(connect(client.get(), AsSockaddr(&addr), sizeof addr), 0) << ErrnoName(errno);
  VS_EXPECT_ERRNO(connect(client.get(), AsSockaddr(&addr), sizeof addr), EISCONN);
}

TEST(Connect, BlockingConnectToClosedPortFailsEconnrefused) {
  ClosedPort closed = ReserveClosedPort();
  Fd client = TcpSocket();
  VS_EXPECT_ERRNO(connect(client.get(), AsSockaddr(&closed.addr), sizeof closed.addr), ECONNREFUSED);
}

TEST(Connect, NonblockingConnectToClosedPortReportsEconnrefusedViaSoErrorOnce) {
  ClosedPort closed = ReserveClosedPort();
  Fd client = TcpSocket(SOCK_NONBLOCK);
  VS_ASSERT_ERRNO(connect(client.get(), AsSockaddr(&closed.addr), sizeof closed.addr), EINPROGRESS);
  short ev = WaitFor(client.get(), POLLOUT);
  EXPECT_TRUE(ev & POLLERR) << "revents " << ev;
  EXPECT_EQ(GetIntOpt(client.get(), SOL_SOCKET, SO_ERROR), ECONNREFUSED);
  EXPECT_EQ(GetIntOpt(client.get(), SOL_SOCKET, SO_ERROR), 0) << "SO_ERROR is cleared by reading";
}

TEST(Connect, ConnectOnConnectedSocketFailsEisconn) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  sockaddr_in peer = PeerName(c.client.get());
  VS_EXPECT_ERRNO(connect(c.client.get(), AsSockaddr(&peer), sizeof peer), EISCONN);
}

TEST(Connect, AddressOfWrongFamilyFailsEafnosupport) {
  Fd client = TcpSocket();
  sockaddr_in6 a6{};
  a6.sin6_family = AF_INET6;
  a6.sin6_addr = in6addr_loopback;
  a6.sin6_port = htons(1);
  VS_EXPECT_ERRNO(connect(client.get(), reinterpret_cast<sockaddr*>(&a6), sizeof a6), EAFNOSUPPORT);
}

// ---------------------------------------------------------------------------
// accept, accept4

TEST(Accept, FillsClientAddressAndLength) {
  Fd listener = Listener();
  Fd client = ConnectTo(SockName(listener.get()));
  ASSERT_TRUE(client.valid());
  ASSERT_TRUE(WaitFor(listener.get(), POLLIN) & POLLIN);
  sockaddr_in from{};
  socklen_t len = sizeof from;
  int fd;
  VS_ASSERT_OK(fd = accept(listener.get(), AsSockaddr(&from), &len));
  Fd server(fd);
  EXPECT_EQ(len, sizeof from);
  EXPECT_TRUE(SameEndpoint(from, SockName(client.get())))
      << ToString(from) << " vs " << ToString(SockName(client.get()));
}

TEST(Accept, NonblockingListenerWithNothingPendingFailsEagain) {
  Fd listener = Listener(4, SOCK_NONBLOCK);
  VS_EXPECT_ERRNO(accept(listener.get(), nullptr, nullptr), EAGAIN);
  VS_EXPECT_ERRNO(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC), EAGAIN);
}

TEST(Accept, BlockingAcceptWaitsForConnectionMadeLater) {
  Fd listener = Listener();
  sockaddr_in addr = SockName(listener.get());
  Fd client;
  std::thread connector([&] {
    SleepMs(100);
    client = ConnectTo(addr);
  });
  int fd;
  {
    // shutdown() of a listener wakes a blocked accept (EINVAL).
    Backstop backstop(kIoTimeoutMs, [&] { shutdown(listener.get(), SHUT_RDWR); });
    VS_EXPECT_OK(fd = accept(listener.get(), nullptr, nullptr));
  }
  Fd server(fd);
  connector.join();
  ASSERT_TRUE(client.valid() && server.valid());
  ExpectRoundTrip(client.get(), server.get());
}

TEST(Accept, Accept4HonorsSockNonblockAndSockCloexec) {
  Fd listener = Listener();
  Fd client = ConnectTo(SockName(listener.get()));
  Fd server = AcceptWithin(listener.get(), kIoTimeoutMs, SOCK_NONBLOCK | SOCK_CLOEXEC);
  ASSERT_TRUE(client.valid() && server.valid());
  EXPECT_NE(StatusFlags(server.get()) & O_NONBLOCK, 0);
  EXPECT_NE(FdFlags(server.get()) & FD_CLOEXEC, 0);
  char b;
  VS_EXPECT_ERRNO(read(server.get(), &b, 1), EAGAIN);
  ExpectRoundTrip(client.get(), server.get());
}

// Linux: the accepted socket never inherits O_NONBLOCK (or FD_CLOEXEC) from
// the listener; only accept4 flags set them.
TEST(Accept, AcceptedSocketDoesNotInheritListenerNonblockOrCloexec) {
  Fd listener = Listener(4, SOCK_NONBLOCK | SOCK_CLOEXEC);
  Fd client = ConnectTo(SockName(listener.get()));
  Fd server = AcceptWithin(listener.get(), kIoTimeoutMs, 0);
  ASSERT_TRUE(client.valid() && server.valid());
  EXPECT_EQ(StatusFlags(server.get()) & O_NONBLOCK, 0);
  EXPECT_EQ(FdFlags(server.get()) & FD_CLOEXEC, 0);
}

TEST(Accept, Accept4WithUnknownFlagFailsEinval) {
  Fd listener = Listener();
  VS_EXPECT_ERRNO(accept4(listener.get(), nullptr, nullptr, 0x1), EINVAL);
}

TEST(Accept, OnNonListeningSocketFailsEinval) {
  Fd s = TcpSocket();
  VS_EXPECT_ERRNO(accept(s.get(), nullptr, nullptr), EINVAL);
}

TEST(Accept, OnNonSocketFailsEnotsockAndOnClosedFdFailsEbadf) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  Fd r(p[0]), w(p[1]);
  VS_EXPECT_ERRNO(accept(r.get(), nullptr, nullptr), ENOTSOCK);
  int closed = w.release();
  close(closed);
  VS_EXPECT_ERRNO(accept(closed, nullptr, nullptr), EBADF);
}

// ---------------------------------------------------------------------------
// getsockname, getpeername

TEST(Names, GetsocknameAndGetpeernameOfTheTwoEndsMirrorEachOther) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  sockaddr_in client_local = SockName(c.client.get());
  sockaddr_in client_peer = PeerName(c.client.get());
  sockaddr_in server_local = SockName(c.server.get());
  sockaddr_in server_peer = PeerName(c.server.get());
  EXPECT_TRUE(SameEndpoint(client_local, server_peer)) << ToString(client_local) << " vs " << ToString(server_peer);
  EXPECT_TRUE(SameEndpoint(client_peer, server_local)) << ToString(client_peer) << " vs " << ToString(server_local);
  EXPECT_EQ(client_peer.sin_addr.s_addr, TestAddr().sin_addr.s_addr);
}

TEST(Names, GetpeernameOnUnconnectedOrListeningSocketFailsEnotconn) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  Fd s = TcpSocket();
  VS_EXPECT_ERRNO(getpeername(s.get(), AsSockaddr(&a), &len), ENOTCONN);
  Fd listener = Listener();
  len = sizeof a;
  VS_EXPECT_ERRNO(getpeername(listener.get(), AsSockaddr(&a), &len), ENOTCONN);
}

TEST(Names, UnboundSocketReportsWildcardAddressAndPortZero) {
  Fd s = TcpSocket();
  sockaddr_in a = SockName(s.get());
  EXPECT_EQ(a.sin_family, AF_INET);
  EXPECT_EQ(a.sin_addr.s_addr, htonl(INADDR_ANY));
  EXPECT_EQ(Port(a), 0);
}

TEST(Names, ShortAddrlenTruncatesAndReportsFullLength) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  sockaddr_in full = SockName(c.client.get());
  sockaddr_in a;
  std::memset(&a, 0xee, sizeof a);
  socklen_t len = 4;  // family + port only
  VS_ASSERT_OK(getsockname(c.client.get(), AsSockaddr(&a), &len));
  EXPECT_EQ(len, sizeof(sockaddr_in));
  EXPECT_EQ(std::memcmp(&a, &full, 4), 0);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(&a)[4], 0xee) << "wrote past the given length";
  len = 4;
  std::memset(&a, 0xee, sizeof a);
  VS_ASSERT_OK(getpeername(c.client.get(), AsSockaddr(&a), &len));
  EXPECT_EQ(len, sizeof(sockaddr_in));
  EXPECT_EQ(reinterpret_cast<uint8_t*>(&a)[4], 0xee) << "wrote past the given length";
}

// ---------------------------------------------------------------------------
// getsockopt, setsockopt

TEST(SockOpt, SoTypeSoDomainSoProtocolDescribeTcpSocket) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  for (int fd : {c.client.get(), c.server.get()}) {
    EXPECT_EQ(GetIntOpt(fd, SOL_SOCKET, SO_TYPE), SOCK_STREAM);
    EXPECT_EQ(GetIntOpt(fd, SOL_SOCKET, SO_DOMAIN), AF_INET);
    EXPECT_EQ(GetIntOpt(fd, SOL_SOCKET, SO_PROTOCOL), IPPROTO_TCP);
  }
  EXPECT_EQ(GetIntOpt(c.client.get(), SOL_SOCKET, SO_ACCEPTCONN), 0);
  Fd listener = Listener();
  EXPECT_EQ(GetIntOpt(listener.get(), SOL_SOCKET, SO_ACCEPTCONN), 1);
}

// Linux doubles the requested size (bookkeeping overhead), so only "at
// least what was asked" is portable.
TEST(SockOpt, SoRcvbufAndSoSndbufReportAtLeastTheRequestedSize) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const int want = 96 * 1024;
  VS_ASSERT_OK(setsockopt(c.client.get(), SOL_SOCKET, SO_RCVBUF, &want, sizeof want));
  VS_ASSERT_OK(setsockopt(c.client.get(), SOL_SOCKET, SO_SNDBUF, &want, sizeof want));
  EXPECT_GE(GetIntOpt(c.client.get(), SOL_SOCKET, SO_RCVBUF), want);
  EXPECT_GE(GetIntOpt(c.client.get(), SOL_SOCKET, SO_SNDBUF), want);
  ExpectRoundTrip(c.client.get(), c.server.get());
}

TEST(SockOpt, TcpNodelayAndSoKeepaliveRoundTrip) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  int fd = c.client.get();
  EXPECT_EQ(GetIntOpt(fd, IPPROTO_TCP, TCP_NODELAY), 0);
  EXPECT_EQ(GetIntOpt(fd, SOL_SOCKET, SO_KEEPALIVE), 0);
  const int on = 1, off = 0;
  VS_ASSERT_OK(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on));
  VS_ASSERT_OK(setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on));
  EXPECT_EQ(GetIntOpt(fd, IPPROTO_TCP, TCP_NODELAY), 1);
  EXPECT_EQ(GetIntOpt(fd, SOL_SOCKET, SO_KEEPALIVE), 1);
  VS_ASSERT_OK(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &off, sizeof off));
  VS_ASSERT_OK(setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &off, sizeof off));
  EXPECT_EQ(GetIntOpt(fd, IPPROTO_TCP, TCP_NODELAY), 0);
  EXPECT_EQ(GetIntOpt(fd, SOL_SOCKET, SO_KEEPALIVE), 0);
  ExpectRoundTrip(c.client.get(), c.server.get());
}

TEST(SockOpt, OptionsSetBeforeConnectSurviveConnect) {
  Fd listener = Listener();
  sockaddr_in addr = SockName(listener.get());
  Fd client = TcpSocket();
  const int on = 1;
  VS_ASSERT_OK(setsockopt(client.get(), IPPROTO_TCP, TCP_NODELAY, &on, sizeof on));
  VS_ASSERT_OK(setsockopt(client.get(), SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on));
  VS_ASSERT_OK(connect(client.get(), AsSockaddr(&addr), sizeof addr));
  EXPECT_EQ(GetIntOpt(client.get(), IPPROTO_TCP, TCP_NODELAY), 1);
  EXPECT_EQ(GetIntOpt(client.get(), SOL_SOCKET, SO_KEEPALIVE), 1);
}

TEST(SockOpt, SoErrorIsZeroOnHealthyConnection) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(GetIntOpt(c.client.get(), SOL_SOCKET, SO_ERROR), 0);
  EXPECT_EQ(GetIntOpt(c.server.get(), SOL_SOCKET, SO_ERROR), 0);
}

TEST(SockOpt, UnknownOptionFailsEnoprotoopt) {
  Fd s = TcpSocket();
  int v = 0;
  socklen_t len = sizeof v;
  VS_EXPECT_ERRNO(getsockopt(s.get(), SOL_SOCKET, 9999, &v, &len), ENOPROTOOPT);
  VS_EXPECT_ERRNO(setsockopt(s.get(), SOL_SOCKET, 9999, &v, sizeof v), ENOPROTOOPT);
  VS_EXPECT_ERRNO(setsockopt(s.get(), IPPROTO_TCP, 9999, &v, sizeof v), ENOPROTOOPT);
}

TEST(SockOpt, SetsockoptWithShortOptlenFailsEinval) {
  Fd s = TcpSocket();
  const int on = 1;
  VS_EXPECT_ERRNO(setsockopt(s.get(), SOL_SOCKET, SO_KEEPALIVE, &on, 2), EINVAL);
  VS_EXPECT_ERRNO(setsockopt(s.get(), IPPROTO_TCP, TCP_NODELAY, &on, 2), EINVAL);
}

TEST(SockOpt, OnNonSocketFailsEnotsock) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  Fd r(p[0]), w(p[1]);
  int v = 1;
  socklen_t len = sizeof v;
  VS_EXPECT_ERRNO(getsockopt(r.get(), SOL_SOCKET, SO_TYPE, &v, &len), ENOTSOCK);
  VS_EXPECT_ERRNO(setsockopt(r.get(), SOL_SOCKET, SO_KEEPALIVE, &v, sizeof v), ENOTSOCK);
}

// ---------------------------------------------------------------------------
// dup, dup2, dup3

TEST(Dup, DuplicateCarriesDataAndKeepsWorkingAfterOriginalIsClosed) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  int d;
  VS_ASSERT_OK(d = dup(c.client.get()));
  Fd dup_fd(d);
  EXPECT_NE(dup_fd.get(), c.client.get());
  ExpectRoundTrip(dup_fd.get(), c.server.get(), "via-dup");
  c.client.reset();
  ExpectRoundTrip(dup_fd.get(), c.server.get(), "after-close");
  EXPECT_TRUE(SameEndpoint(PeerName(dup_fd.get()), SockName(c.server.get())));
}

TEST(Dup, PeerSeesEofOnlyAfterLastDuplicateIsClosed) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  Fd dup_fd(dup(c.client.get()));
  ASSERT_TRUE(dup_fd.valid());
  c.client.reset();
  // The connection stays open while any descriptor refers to it; waiting a
  // little here can only reveal a premature EOF, never cause a false one.
  EXPECT_EQ(WaitFor(c.server.get(), POLLIN, 100), 0);
  dup_fd.reset();
  ASSERT_TRUE(WaitFor(c.server.get(), POLLIN) & POLLIN);
  char b;
  EXPECT_EQ(read(c.server.get(), &b, 1), 0);
}

TEST(Dup, Dup2OntoOpenSocketClosesItAndRedirectsTheNumber) {
  Connection a = ConnectedPair();
  Connection b = ConnectedPair();
  ASSERT_TRUE(a.ok() && b.ok());
  const int target = b.client.get();
  int r;
  VS_ASSERT_OK(r = dup2(a.client.get(), target));
  EXPECT_EQ(r, target);
  // b.client's old socket had only this descriptor: its peer sees EOF.
  ASSERT_TRUE(WaitFor(b.server.get(), POLLIN) & POLLIN);
  char ch;
  EXPECT_EQ(read(b.server.get(), &ch, 1), 0);
  // The number now names a's connection.
  ExpectRoundTrip(target, a.server.get(), "redirected");
}

TEST(Dup, Dup2OntoItselfReturnsFdAndDup2OfClosedFdFailsEbadf) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(dup2(c.client.get(), c.client.get()), c.client.get());
  ExpectRoundTrip(c.client.get(), c.server.get());
  Fd spare = TcpSocket();
  int closed = spare.release();
  close(closed);
  VS_EXPECT_ERRNO(dup2(closed, c.client.get()), EBADF);
  ExpectRoundTrip(c.client.get(), c.server.get(), "still-open");
}

TEST(Dup, Dup3SetsCloexecOnlyWhenAskedAndRejectsSameFdOrBadFlags) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  Fd a = TcpSocket(), b = TcpSocket();
  int r;
  VS_ASSERT_OK(r = dup3(c.client.get(), a.get(), O_CLOEXEC));
  EXPECT_EQ(r, a.get());
  EXPECT_NE(FdFlags(a.get()) & FD_CLOEXEC, 0);
  VS_ASSERT_OK(r = dup3(c.client.get(), b.get(), 0));
  EXPECT_EQ(FdFlags(b.get()) & FD_CLOEXEC, 0);
  VS_EXPECT_ERRNO(dup3(c.client.get(), c.client.get(), 0), EINVAL);
  VS_EXPECT_ERRNO(dup3(c.client.get(), b.get(), O_NONBLOCK), EINVAL);
  ExpectRoundTrip(a.get(), c.server.get(), "via-dup3");
  ExpectRoundTrip(b.get(), c.server.get(), "via-dup3-b");
}

TEST(Dup, DupOfClosedFdFailsEbadf) {
  Fd s = TcpSocket();
  int closed = s.release();
  close(closed);
  VS_EXPECT_ERRNO(dup(closed), EBADF);
}

// ---------------------------------------------------------------------------
// fcntl

TEST(Fcntl, SetflNonblockMakesEmptyReadFailEagainAndGetflReportsIt) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  int fd = c.client.get();
  int flags;
  VS_ASSERT_OK(flags = fcntl(fd, F_GETFL));
  EXPECT_EQ(flags & O_ACCMODE, O_RDWR);
  EXPECT_EQ(flags & O_NONBLOCK, 0);
  VS_ASSERT_OK(fcntl(fd, F_SETFL, flags | O_NONBLOCK));
  EXPECT_EQ(StatusFlags(fd), flags | O_NONBLOCK);
  char b;
  VS_EXPECT_ERRNO(read(fd, &b, 1), EAGAIN);
  VS_EXPECT_ERRNO(recv(fd, &b, 1, 0), EAGAIN);
  VS_ASSERT_OK(fcntl(fd, F_SETFL, flags));
  EXPECT_EQ(StatusFlags(fd), flags);
  ExpectRoundTrip(c.client.get(), c.server.get());
}

// O_NONBLOCK lives in the open file description (shared by every dup);
// FD_CLOEXEC lives in the descriptor.
TEST(Fcntl, StatusFlagsAreSharedByDuplicatesButDescriptorFlagsAreNot) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  Fd d(dup(c.client.get()));
  ASSERT_TRUE(d.valid());
  VS_ASSERT_OK(fcntl(c.client.get(), F_SETFL, O_NONBLOCK));
  EXPECT_NE(StatusFlags(d.get()) & O_NONBLOCK, 0);
  char b;
  VS_EXPECT_ERRNO(read(d.get(), &b, 1), EAGAIN);
  VS_ASSERT_OK(fcntl(c.client.get(), F_SETFD, FD_CLOEXEC));
  EXPECT_EQ(FdFlags(d.get()) & FD_CLOEXEC, 0);
}

TEST(Fcntl, DupfdReturnsFdAtOrAboveArgumentWithoutCloexec) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  int fd;
  VS_ASSERT_OK(fd = fcntl(c.client.get(), F_DUPFD, 200));
  Fd d(fd);
  EXPECT_GE(d.get(), 200);
  EXPECT_EQ(FdFlags(d.get()) & FD_CLOEXEC, 0);
  ExpectRoundTrip(d.get(), c.server.get(), "dupfd");
}

TEST(Fcntl, DupfdCloexecSetsCloexecOnTheNewFd) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  int fd;
  VS_ASSERT_OK(fd = fcntl(c.client.get(), F_DUPFD_CLOEXEC, 200));
  Fd d(fd);
  EXPECT_GE(d.get(), 200);
  EXPECT_NE(FdFlags(d.get()) & FD_CLOEXEC, 0);
  EXPECT_EQ(FdFlags(c.client.get()) & FD_CLOEXEC, 0);
  ExpectRoundTrip(d.get(), c.server.get(), "dupfd-cloexec");
}

TEST(Fcntl, SetfdAndGetfdToggleCloexec) {
  Fd s = TcpSocket();
  EXPECT_EQ(FdFlags(s.get()), 0);
  VS_ASSERT_OK(fcntl(s.get(), F_SETFD, FD_CLOEXEC));
  EXPECT_EQ(FdFlags(s.get()), FD_CLOEXEC);
  VS_ASSERT_OK(fcntl(s.get(), F_SETFD, 0));
  EXPECT_EQ(FdFlags(s.get()), 0);
}

TEST(Fcntl, OnClosedFdFailsEbadf) {
  Fd s = TcpSocket();
  int closed = s.release();
  close(closed);
  VS_EXPECT_ERRNO(fcntl(closed, F_GETFL), EBADF);
  VS_EXPECT_ERRNO(fcntl(closed, F_SETFL, O_NONBLOCK), EBADF);
  VS_EXPECT_ERRNO(fcntl(closed, F_DUPFD, 0), EBADF);
}

// ---------------------------------------------------------------------------
// ioctl

TEST(Ioctl, FionreadReportsExactUnreadByteCount) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  int inq = -1;
  VS_ASSERT_OK(ioctl(c.server.get(), FIONREAD, &inq));
  EXPECT_EQ(inq, 0);
  const std::string data = StreamBytes(1, 3000);
  ASSERT_TRUE(SendAll(c.client.get(), data));
  EXPECT_EQ(WaitForInq(c.server.get(), 3000), 3000);
  EXPECT_EQ(RecvExactly(c.server.get(), 1000), data.substr(0, 1000));
  VS_ASSERT_OK(ioctl(c.server.get(), FIONREAD, &inq));
  EXPECT_EQ(inq, 2000);
  EXPECT_EQ(RecvExactly(c.server.get(), 2000), data.substr(1000));
  VS_ASSERT_OK(ioctl(c.server.get(), FIONREAD, &inq));
  EXPECT_EQ(inq, 0);
}

TEST(Ioctl, FionreadOnListenerFailsEinval) {
  Fd listener = Listener();
  int inq = -1;
  VS_EXPECT_ERRNO(ioctl(listener.get(), FIONREAD, &inq), EINVAL);
}

TEST(Ioctl, FionbioTogglesNonblockingModeVisibleInGetfl) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  int on = 1, off = 0;
  VS_ASSERT_OK(ioctl(c.client.get(), FIONBIO, &on));
  EXPECT_NE(StatusFlags(c.client.get()) & O_NONBLOCK, 0);
  char b;
  VS_EXPECT_ERRNO(recv(c.client.get(), &b, 1, 0), EAGAIN);
  VS_ASSERT_OK(ioctl(c.client.get(), FIONBIO, &off));
  EXPECT_EQ(StatusFlags(c.client.get()) & O_NONBLOCK, 0);
  ExpectRoundTrip(c.client.get(), c.server.get());
}

// ---------------------------------------------------------------------------
// Sockets the library must leave to the kernel.

TEST(PassThrough, UdpSendtoRecvfromRoundTripReportsSenderAddress) {
  Fd a(socket(AF_INET, SOCK_DGRAM, 0)), b(socket(AF_INET, SOCK_DGRAM, 0));
  ASSERT_TRUE(a.valid() && b.valid());
  sockaddr_in addr = TestAddr();
  VS_ASSERT_OK(bind(a.get(), AsSockaddr(&addr), sizeof addr));
  VS_ASSERT_OK(bind(b.get(), AsSockaddr(&addr), sizeof addr));
  sockaddr_in a_addr = SockName(a.get()), b_addr = SockName(b.get());
  const char msg[] = "datagram";
  ssize_t n;
  VS_ASSERT_OK(n = sendto(a.get(), msg, sizeof msg, 0, AsSockaddr(&b_addr), sizeof b_addr));
  EXPECT_EQ(n, static_cast<ssize_t>(sizeof msg));
  ASSERT_TRUE(WaitFor(b.get(), POLLIN) & POLLIN);
  char buf[64];
  sockaddr_in from{};
  socklen_t len = sizeof from;
  VS_ASSERT_OK(n = recvfrom(b.get(), buf, sizeof buf, 0, AsSockaddr(&from), &len));
  EXPECT_EQ(n, static_cast<ssize_t>(sizeof msg));
  EXPECT_STREQ(buf, msg);
  EXPECT_EQ(len, sizeof from);
  EXPECT_TRUE(SameEndpoint(from, a_addr)) << ToString(from) << " vs " << ToString(a_addr);
  // Datagram boundaries: two sends, two receives, a short buffer truncates.
  VS_ASSERT_OK(sendto(a.get(), "12345", 5, 0, AsSockaddr(&b_addr), sizeof b_addr));
  VS_ASSERT_OK(sendto(a.get(), "67", 2, 0, AsSockaddr(&b_addr), sizeof b_addr));
  ASSERT_TRUE(WaitFor(b.get(), POLLIN) & POLLIN);
  EXPECT_EQ(recv(b.get(), buf, 3, 0), 3);
  ASSERT_TRUE(WaitFor(b.get(), POLLIN) & POLLIN);
  EXPECT_EQ(recv(b.get(), buf, sizeof buf, 0), 2);
  EXPECT_EQ(std::string(buf, 2), "67");
  EXPECT_EQ(GetIntOpt(a.get(), SOL_SOCKET, SO_TYPE), SOCK_DGRAM);
}

TEST(PassThrough, UnixSocketpairExchangesDataBothWaysAndSeesEof) {
  int sv[2];
  VS_ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
  Fd a(sv[0]), b(sv[1]);
  ExpectRoundTrip(a.get(), b.get(), "unix");
  EXPECT_EQ(GetIntOpt(a.get(), SOL_SOCKET, SO_DOMAIN), AF_UNIX);
  VS_ASSERT_OK(shutdown(a.get(), SHUT_WR));
  char ch;
  ASSERT_TRUE(WaitFor(b.get(), POLLIN) & POLLIN);
  EXPECT_EQ(read(b.get(), &ch, 1), 0);
  ASSERT_TRUE(SendAll(b.get(), "back"));
  EXPECT_EQ(RecvExactly(a.get(), 4), "back");
}

TEST(PassThrough, UnixAbstractListenerConnectsAndAccepts) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string name = "vsocket-test-" + std::to_string(getpid()) + "-" + std::to_string(MonotonicNs());
  std::memcpy(addr.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  Fd listener(socket(AF_UNIX, SOCK_STREAM, 0));
  VS_ASSERT_OK(bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), len));
  VS_ASSERT_OK(listen(listener.get(), 4));
  Fd client(socket(AF_UNIX, SOCK_STREAM, 0));
  VS_ASSERT_OK(connect(client.get(), reinterpret_cast<sockaddr*>(&addr), len));
  Fd server = AcceptWithin(listener.get());
  ASSERT_TRUE(server.valid());
  ExpectRoundTrip(client.get(), server.get(), "abstract");
}

TEST(PassThrough, PipeReadWriteAndPollWork) {
  int p[2];
  VS_ASSERT_OK(pipe(p));
  Fd r(p[0]), w(p[1]);
  EXPECT_EQ(WaitFor(r.get(), POLLIN, 0), 0);
  EXPECT_EQ(write(w.get(), "pipe", 4), 4);
  ASSERT_TRUE(WaitFor(r.get(), POLLIN) & POLLIN);
  char buf[8];
  EXPECT_EQ(read(r.get(), buf, sizeof buf), 4);
  w.reset();
  EXPECT_EQ(read(r.get(), buf, sizeof buf), 0);
}

TEST(Ipv6, LoopbackStreamConnectsAcceptsAndTransfers) {
  Fd listener(socket(AF_INET6, SOCK_STREAM, 0));
  if (!listener.valid()) GTEST_SKIP() << "no IPv6: " << ErrnoName(errno);
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_loopback;
  if (bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    GTEST_SKIP() << "cannot bind [::1]: " << ErrnoName(errno);
  VS_ASSERT_OK(listen(listener.get(), 4));
  socklen_t len = sizeof addr;
  VS_ASSERT_OK(getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len));
  Fd client(socket(AF_INET6, SOCK_STREAM, 0));
  VS_ASSERT_OK(connect(client.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr));
  sockaddr_in6 from{};
  len = sizeof from;
  ASSERT_TRUE(WaitFor(listener.get(), POLLIN) & POLLIN);
  int fd;
  VS_ASSERT_OK(fd = accept(listener.get(), reinterpret_cast<sockaddr*>(&from), &len));
  Fd server(fd);
  EXPECT_EQ(len, sizeof from);
  EXPECT_EQ(from.sin6_family, AF_INET6);
  EXPECT_EQ(std::memcmp(&from.sin6_addr, &in6addr_loopback, sizeof from.sin6_addr), 0);
  EXPECT_EQ(GetIntOpt(client.get(), SOL_SOCKET, SO_DOMAIN), AF_INET6);
  ExpectRoundTrip(client.get(), server.get(), "six");
}

}  // namespace
}  // namespace vsocket::socktest
