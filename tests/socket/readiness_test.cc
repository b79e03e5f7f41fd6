// Readiness: poll/ppoll, select/pselect and epoll over connected sockets and
// listeners, including EOF/RDHUP/HUP/ERR reporting, edge-triggered and
// one-shot epoll, nesting, signal masks, EINTR, and the registration
// changes event loops make around every request.
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/socket/test_util.h"

namespace vsocket::socktest {
namespace {

// ---------------------------------------------------------------------------
// poll, ppoll

// A process's first connection, before it has a session with vsocketd: a
// thread asleep in poll or epoll_wait on it while another thread's first
// write registers it (and the peer's answer then comes by the ring, not the
// kernel socket) must wake for that answer, not at its timeout. Run in a
// forked child: a process with no session yet.
int FirstConnectionEcho(bool epoll) {
  EchoPeer p = StartEchoPeer(epoll);
  if (!p.conn.valid()) return 1;
  if (shutdown(p.conn.get(), SHUT_WR) != 0) return 2;
  if (!(WaitFor(p.conn.get(), POLLIN) & POLLIN)) return 3;
  char b;
  if (read(p.conn.get(), &b, 1) != 0) return 4;
  return ExitedWith(WaitChild(p.pid), 0) ? 0 : 5;
}

TEST(FirstConnection, APollWaitSeesTheAnswerThatCameByTheRing) {
  SetTestBudgetSeconds(60);
  ExpectChildSucceeds([] { return FirstConnectionEcho(false); }, 3 * kIoTimeoutMs);
}

TEST(FirstConnection, AnEpollWaitSeesTheAnswerThatCameByTheRing) {
  SetTestBudgetSeconds(60);
  ExpectChildSucceeds([] { return FirstConnectionEcho(true); }, 3 * kIoTimeoutMs);
}

TEST(Poll, ReportsPollinOnlyOnceDataArrives) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  pollfd p{c.server.get(), POLLIN, -1};
  EXPECT_EQ(poll(&p, 1, 0), 0);
  EXPECT_EQ(p.revents, 0);
  ASSERT_TRUE(SendAll(c.client.get(), "d"));
  p.revents = -1;
  EXPECT_EQ(poll(&p, 1, kIoTimeoutMs), 1) << ErrnoName(errno);
  EXPECT_EQ(p.revents, POLLIN);
}

TEST(Poll, ConnectedSocketsReportPolloutAndNothingElse) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  pollfd p[2] = {{c.client.get(), POLLIN | POLLOUT | POLLRDHUP, 0}, {c.server.get(), POLLIN | POLLOUT | POLLRDHUP, 0}};
  EXPECT_EQ(poll(p, 2, kIoTimeoutMs), 2);
  EXPECT_EQ(p[0].revents, POLLOUT);
  EXPECT_EQ(p[1].revents, POLLOUT);
}

// A half-close is POLLIN (read returns 0) plus POLLRDHUP, but not POLLHUP:
// POLLHUP means both directions are shut.
TEST(Poll, PeerCloseGivesPollinAndPollrdhupThenLocalShutWrAddsPollhup) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  c.server.reset();
  short ev = WaitFor(c.client.get(), POLLIN | POLLRDHUP);
  EXPECT_TRUE(ev & POLLIN) << "revents " << ev;
  EXPECT_TRUE(ev & POLLRDHUP) << "revents " << ev;
  EXPECT_FALSE(ev & (POLLHUP | POLLERR)) << "revents " << ev;
  char b;
  EXPECT_EQ(read(c.client.get(), &b, 1), 0);
  VS_ASSERT_OK(shutdown(c.client.get(), SHUT_WR));
  ev = WaitFor(c.client.get(), POLLIN, 0);
  EXPECT_TRUE(ev & POLLHUP) << "revents " << ev;
}

TEST(Poll, PeerShutWrGivesPollrdhupWhileStillWritable) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  VS_ASSERT_OK(shutdown(c.server.get(), SHUT_WR));
  short ev = WaitFor(c.client.get(), POLLRDHUP);
  ASSERT_TRUE(ev & POLLRDHUP) << "revents " << ev;
  ev = WaitFor(c.client.get(), POLLIN | POLLOUT | POLLRDHUP, 0);
  EXPECT_EQ(ev, POLLIN | POLLOUT | POLLRDHUP);
}

TEST(Poll, ListenerIsReadableWhenConnectionIsPending) {
  Fd listener = Listener();
  EXPECT_EQ(WaitFor(listener.get(), POLLIN, 0), 0);
  Fd client = ConnectTo(SockName(listener.get()));
  ASSERT_TRUE(client.valid());
  EXPECT_EQ(WaitFor(listener.get(), POLLIN), POLLIN);
}

TEST(Poll, ClosedFdReportsPollnvalAndNegativeFdIsIgnored) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  Fd spare = TcpSocket();
  int closed = spare.release();
  close(closed);
  pollfd p[3] = {{closed, POLLIN, 0}, {-1, POLLIN, 0}, {c.client.get(), POLLOUT, 0}};
  EXPECT_EQ(poll(p, 3, 0), 2);
  EXPECT_EQ(p[0].revents, POLLNVAL);
  EXPECT_EQ(p[1].revents, 0);
  EXPECT_EQ(p[2].revents, POLLOUT);
}

TEST(Poll, ReportsEachOfManySocketsIndependently) {
  constexpr int kPairs = 8;
  std::vector<Connection> pairs;
  for (int i = 0; i < kPairs; ++i) {
    pairs.push_back(ConnectedPair());
    ASSERT_TRUE(pairs.back().ok());
  }
  for (int i = 0; i < kPairs; i += 2) ASSERT_TRUE(SendAll(pairs[i].client.get(), "x"));
  for (int i = 0; i < kPairs; i += 2) ASSERT_TRUE(WaitFor(pairs[i].server.get(), POLLIN) & POLLIN);
  std::vector<pollfd> p;
  for (auto& c : pairs) p.push_back({c.server.get(), POLLIN, 0});
  EXPECT_EQ(poll(p.data(), p.size(), 0), kPairs / 2);
  for (int i = 0; i < kPairs; ++i) EXPECT_EQ(p[i].revents, i % 2 == 0 ? POLLIN : 0) << "pair " << i;
}

// A connection nobody has used yet, a thread asleep waiting for its reply,
// and another thread whose first write (which, preloaded, registers the
// connection; it upgrades while the server pauses) sends the request: the
// reply may then come by the ring, not the kernel socket the sleeper went
// to sleep on. `wait` must still see it, long before its timeout.
template <typename WaitFn>
void SleeperSeesReplyAfterAnotherThreadsFirstWrite(WaitFn wait) {
  {  // Another connection first, so that the process is attached (preloaded).
    Connection w = ConnectedPair();
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(SendAll(w.client.get(), "w"));
    ASSERT_EQ(RecvExactly(w.server.get(), 1), "w");
  }
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  std::thread server([&] {
    if (RecvExactly(c.server.get(), 1) != "q") return;
    SleepMs(300);
    (void)SendAll(c.server.get(), "r");
  });
  std::thread writer([&] {
    SleepMs(200);
    (void)SendAll(c.client.get(), "q");
  });
  bool woke = wait(c.client.get());
  writer.join();
  server.join();
  EXPECT_TRUE(woke) << "the wait timed out: the reply was not noticed";
  EXPECT_EQ(RecvExactly(c.client.get(), 1), "r");
}

TEST(Poll, SleeperSeesReplyAfterAnotherThreadsFirstWriteUpgradedTheConnection) {
  SleeperSeesReplyAfterAnotherThreadsFirstWrite([](int fd) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, kIoTimeoutMs) == 1 && p.revents == POLLIN;
  });
}

TEST(Poll, TimeoutWithNothingReadyReturnsZero) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  pollfd p{c.server.get(), POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 30), 0);
  EXPECT_EQ(poll(nullptr, 0, 10), 0);
}

// poll, select and epoll_wait are never restarted after a handler, even
// with SA_RESTART (signal(7)).
TEST(Poll, InterruptedBySignalFailsEintrEvenWithSaRestart) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  ScopedSignalHandler handler(SIGUSR1, CountUsr1, SA_RESTART);
  RepeatingSignaller signaller(pthread_self());
  pollfd p{c.server.get(), POLLIN, 0};
  VS_EXPECT_ERRNO(poll(&p, 1, kIoTimeoutMs), EINTR);
  signaller.Stop();
}

TEST(Ppoll, WaitsWithTimespecTimeoutAndReportsData) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  pollfd p{c.server.get(), POLLIN, 0};
  timespec ts{0, 30'000'000};
  EXPECT_EQ(ppoll(&p, 1, &ts, nullptr), 0);
  ASSERT_TRUE(SendAll(c.client.get(), "p"));
  ts = {kIoTimeoutMs / 1000, 0};
  EXPECT_EQ(ppoll(&p, 1, &ts, nullptr), 1) << ErrnoName(errno);
  EXPECT_EQ(p.revents, POLLIN);
}

// Returns the sigset to pass to ppoll/pselect/epoll_pwait so that SIGUSR1 is
// blocked only while the call waits.
sigset_t MaskWithUsr1Blocked() {
  sigset_t mask;
  pthread_sigmask(SIG_SETMASK, nullptr, &mask);
  sigaddset(&mask, SIGUSR1);
  return mask;
}

TEST(Ppoll, SigmaskHoldsOffSignalThatInterruptsPlainPoll) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  ScopedSignalHandler handler(SIGUSR1, CountUsr1, 0);
  Usr1Count() = 0;
  RepeatingSignaller signaller(pthread_self());
  pollfd p{c.server.get(), POLLIN, 0};
  timespec ts{0, 200'000'000};
  sigset_t mask = MaskWithUsr1Blocked();
  EXPECT_EQ(ppoll(&p, 1, &ts, &mask), 0) << ErrnoName(errno);
  ts = {kIoTimeoutMs / 1000, 0};
  VS_EXPECT_ERRNO(ppoll(&p, 1, &ts, nullptr), EINTR);
  signaller.Stop();
  EXPECT_GE(Usr1Count().load(), 1);
}

// ---------------------------------------------------------------------------
// select, pselect

TEST(Select, ReportsReadableAndWritableSetsAndTimesOut) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const int a = c.client.get(), b = c.server.get();
  const int nfds = std::max(a, b) + 1;
  fd_set r, w;
  FD_ZERO(&r);
  FD_SET(b, &r);
  timeval tv{0, 30'000};
  EXPECT_EQ(select(nfds, &r, nullptr, nullptr, &tv), 0);
  EXPECT_FALSE(FD_ISSET(b, &r));

  ASSERT_TRUE(SendAll(a, "s"));
  FD_ZERO(&r);
  FD_ZERO(&w);
  FD_SET(a, &r);
  FD_SET(b, &r);
  FD_SET(a, &w);
  tv = {kIoTimeoutMs / 1000, 0};
  EXPECT_EQ(select(nfds, &r, &w, nullptr, &tv), 2) << ErrnoName(errno);
  EXPECT_FALSE(FD_ISSET(a, &r));
  EXPECT_TRUE(FD_ISSET(b, &r));
  EXPECT_TRUE(FD_ISSET(a, &w));
}

TEST(Select, ReadableAtEofAndListenerReadableWhenConnectionPending) {
  Fd listener = Listener();
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  c.client.reset();
  Fd pending = ConnectTo(SockName(listener.get()));
  ASSERT_TRUE(pending.valid());
  fd_set r;
  FD_ZERO(&r);
  FD_SET(c.server.get(), &r);
  FD_SET(listener.get(), &r);
  timeval tv{kIoTimeoutMs / 1000, 0};
  int nfds = std::max(c.server.get(), listener.get()) + 1;
  // Both may not be ready at the same instant; wait until both are.
  int n = 0;
  for (int i = 0; i < 100; ++i) {
    fd_set rr = r;
    n = select(nfds, &rr, nullptr, nullptr, &tv);
    if (n == 2) break;
    SleepMs(5);
  }
  EXPECT_EQ(n, 2) << ErrnoName(errno);
  char b;
  EXPECT_EQ(read(c.server.get(), &b, 1), 0);
}

TEST(Select, ClosedFdInSetFailsEbadf) {
  Fd spare = TcpSocket();
  int closed = spare.release();
  close(closed);
  fd_set r;
  FD_ZERO(&r);
  FD_SET(closed, &r);
  timeval tv{0, 0};
  VS_EXPECT_ERRNO(select(closed + 1, &r, nullptr, nullptr, &tv), EBADF);
}

TEST(Select, InterruptedBySignalFailsEintrEvenWithSaRestart) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  ScopedSignalHandler handler(SIGUSR1, CountUsr1, SA_RESTART);
  RepeatingSignaller signaller(pthread_self());
  fd_set r;
  FD_ZERO(&r);
  FD_SET(c.server.get(), &r);
  timeval tv{kIoTimeoutMs / 1000, 0};
  VS_EXPECT_ERRNO(select(c.server.get() + 1, &r, nullptr, nullptr, &tv), EINTR);
  signaller.Stop();
}

TEST(Pselect, SigmaskHoldsOffSignalAndDataIsReported) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  ScopedSignalHandler handler(SIGUSR1, CountUsr1, 0);
  Usr1Count() = 0;
  const int fd = c.server.get();
  {
    RepeatingSignaller signaller(pthread_self());
    fd_set r;
    FD_ZERO(&r);
    FD_SET(fd, &r);
    timespec ts{0, 200'000'000};
    sigset_t mask = MaskWithUsr1Blocked();
    EXPECT_EQ(pselect(fd + 1, &r, nullptr, nullptr, &ts, &mask), 0) << ErrnoName(errno);
    signaller.Stop();
  }
  EXPECT_GE(Usr1Count().load(), 1);
  ASSERT_TRUE(SendAll(c.client.get(), "q"));
  fd_set r;
  FD_ZERO(&r);
  FD_SET(fd, &r);
  timespec ts{kIoTimeoutMs / 1000, 0};
  EXPECT_EQ(pselect(fd + 1, &r, nullptr, nullptr, &ts, nullptr), 1) << ErrnoName(errno);
  EXPECT_TRUE(FD_ISSET(fd, &r));
}

// ---------------------------------------------------------------------------
// epoll

Fd EpollFd() {
  Fd ep(epoll_create1(0));
  if (!ep.valid()) ADD_FAILURE() << "epoll_create1: " << ErrnoName(errno);
  return ep;
}

void Add(int ep, int fd, uint32_t events, uint64_t cookie) {
  epoll_event e{};
  e.events = events;
  e.data.u64 = cookie;
  ASSERT_EQ(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e), 0) << ErrnoName(errno);
}

// One epoll_wait for at most 8 events.
std::vector<epoll_event> Wait(int ep, int timeout_ms) {
  epoll_event ev[8];
  int n = epoll_wait(ep, ev, 8, timeout_ms);
  if (n < 0) {
    ADD_FAILURE() << "epoll_wait: " << ErrnoName(errno);
    return {};
  }
  return std::vector<epoll_event>(ev, ev + n);
}

TEST(Epoll, CreateRejectsNonPositiveSizeAndCreate1HonorsCloexecAndRejectsBadFlags) {
  int fd;
  VS_ASSERT_OK(fd = epoll_create(1));
  Fd a(fd);
  EXPECT_EQ(FdFlags(a.get()) & FD_CLOEXEC, 0);
  VS_EXPECT_ERRNO(epoll_create(0), EINVAL);
  VS_EXPECT_ERRNO(epoll_create(-1), EINVAL);
  VS_ASSERT_OK(fd = epoll_create1(EPOLL_CLOEXEC));
  Fd b(fd);
  EXPECT_NE(FdFlags(b.get()) & FD_CLOEXEC, 0);
  VS_EXPECT_ERRNO(epoll_create1(0x1), EINVAL);
}

TEST(Epoll, CtlAddModDelSucceedAndMisuseFailsWithMatchingErrno) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  Fd ep = EpollFd();
  const int fd = c.server.get();
  epoll_event e{};
  e.events = EPOLLIN;
  VS_EXPECT_OK(epoll_ctl(ep.get(), EPOLL_CTL_ADD, fd, &e));
  VS_EXPECT_ERRNO(epoll_ctl(ep.get(), EPOLL_CTL_ADD, fd, &e), EEXIST);
  e.events = EPOLLIN | EPOLLOUT;
  VS_EXPECT_OK(epoll_ctl(ep.get(), EPOLL_CTL_MOD, fd, &e));
  VS_EXPECT_OK(epoll_ctl(ep.get(), EPOLL_CTL_DEL, fd, &e));
  VS_EXPECT_ERRNO(epoll_ctl(ep.get(), EPOLL_CTL_DEL, fd, &e), ENOENT);
  VS_EXPECT_ERRNO(epoll_ctl(ep.get(), EPOLL_CTL_MOD, fd, &e), ENOENT);
  VS_EXPECT_ERRNO(epoll_ctl(ep.get(), EPOLL_CTL_ADD, ep.get(), &e), EINVAL);
  VS_EXPECT_ERRNO(epoll_ctl(fd, EPOLL_CTL_ADD, c.client.get(), &e), EINVAL);  // not an epoll fd
  int closed = c.client.release();
  close(closed);
  VS_EXPECT_ERRNO(epoll_ctl(ep.get(), EPOLL_CTL_ADD, closed, &e), EBADF);
  // Regular files are always ready; epoll refuses them.
  std::string path = TempDir() + "/vsocket-epoll-XXXXXX";
  Fd file(mkstemp(path.data()));
  ASSERT_TRUE(file.valid()) << path << ": " << ErrnoName(errno);
  unlink(path.c_str());
  VS_EXPECT_ERRNO(epoll_ctl(ep.get(), EPOLL_CTL_ADD, file.get(), &e), EPERM);
}

TEST(Epoll, WaitReturnsRegisteredCookieAndEventsAndTimesOut) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  Fd ep = EpollFd();
  Add(ep.get(), c.server.get(), EPOLLIN | EPOLLOUT, 0x1234567890abcdefull);
  auto ev = Wait(ep.get(), kIoTimeoutMs);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].events, static_cast<uint32_t>(EPOLLOUT));
  EXPECT_EQ(ev[0].data.u64, 0x1234567890abcdefull);
  ASSERT_TRUE(SendAll(c.client.get(), "e"));
  ASSERT_TRUE(WaitFor(c.server.get(), POLLIN) & POLLIN);
  ev = Wait(ep.get(), kIoTimeoutMs);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].events, static_cast<uint32_t>(EPOLLIN | EPOLLOUT));

  Fd ep2 = EpollFd();
  Add(ep2.get(), c.client.get(), EPOLLIN, 1);
  EXPECT_EQ(Wait(ep2.get(), 30).size(), 0u);
  epoll_event one;
  VS_EXPECT_ERRNO(epoll_wait(ep2.get(), &one, 0, 0), EINVAL);
  VS_EXPECT_ERRNO(epoll_wait(c.client.get(), &one, 1, 0), EINVAL);
}

TEST(Epoll, SleeperSeesReplyAfterAnotherThreadsFirstWriteUpgradedTheConnection) {
  SleeperSeesReplyAfterAnotherThreadsFirstWrite([](int fd) {
    Fd ep = EpollFd();
    Add(ep.get(), fd, EPOLLIN, 7);
    auto ev = Wait(ep.get(), kIoTimeoutMs);
    return ev.size() == 1 && ev[0].events == EPOLLIN;
  });
}

TEST(Epoll, LevelTriggeredKeepsReportingUntilDrained) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  Fd ep = EpollFd();
  Add(ep.get(), c.server.get(), EPOLLIN, 7);
  ASSERT_TRUE(SendAll(c.client.get(), "abc"));
  ASSERT_EQ(WaitForInq(c.server.get(), 3), 3);
  EXPECT_EQ(Wait(ep.get(), kIoTimeoutMs).size(), 1u);
  EXPECT_EQ(Wait(ep.get(), 0).size(), 1u);
  char b[3];
  ASSERT_EQ(read(c.server.get(), b, 1), 1);
  EXPECT_EQ(Wait(ep.get(), 0).size(), 1u);
  ASSERT_EQ(read(c.server.get(), b, 3), 2);
  EXPECT_EQ(Wait(ep.get(), 0).size(), 0u);
}

// Linux re-arms an edge-triggered item on every arrival, drained or not;
// with nothing new, it stays quiet.
TEST(Epoll, EdgeTriggeredFiresOncePerNewArrival) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  Fd ep = EpollFd();
  Add(ep.get(), c.server.get(), EPOLLIN | EPOLLET, 8);
  EXPECT_EQ(Wait(ep.get(), 0).size(), 0u);
  ASSERT_TRUE(SendAll(c.client.get(), "a"));
  auto ev = Wait(ep.get(), kIoTimeoutMs);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].data.u64, 8u);
  EXPECT_EQ(Wait(ep.get(), 0).size(), 0u) << "no new data, no new edge";
  EXPECT_EQ(Wait(ep.get(), 30).size(), 0u);
  ASSERT_TRUE(SendAll(c.client.get(), "b"));
  EXPECT_EQ(Wait(ep.get(), kIoTimeoutMs).size(), 1u) << "new data while undrained";
  EXPECT_EQ(Wait(ep.get(), 0).size(), 0u);
  EXPECT_EQ(RecvExactly(c.server.get(), 2), "ab");
  EXPECT_EQ(Wait(ep.get(), 0).size(), 0u);
}

TEST(Epoll, OneshotFiresOnceUntilRearmedWithMod) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  Fd ep = EpollFd();
  Add(ep.get(), c.server.get(), EPOLLIN | EPOLLONESHOT, 9);
  ASSERT_TRUE(SendAll(c.client.get(), "1"));
  EXPECT_EQ(Wait(ep.get(), kIoTimeoutMs).size(), 1u);
  EXPECT_EQ(Wait(ep.get(), 0).size(), 0u) << "disarmed although data is unread";
  ASSERT_TRUE(SendAll(c.client.get(), "2"));
  EXPECT_EQ(Wait(ep.get(), 30).size(), 0u) << "disarmed although new data came";
  epoll_event e{};
  e.events = EPOLLIN | EPOLLONESHOT;
  e.data.u64 = 10;
  VS_ASSERT_OK(epoll_ctl(ep.get(), EPOLL_CTL_MOD, c.server.get(), &e));
  auto ev = Wait(ep.get(), kIoTimeoutMs);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].data.u64, 10u);
  EXPECT_EQ(Wait(ep.get(), 0).size(), 0u);
  // A disarmed item is still registered: ADD says EEXIST.
  VS_EXPECT_ERRNO(epoll_ctl(ep.get(), EPOLL_CTL_ADD, c.server.get(), &e), EEXIST);
}

TEST(Epoll, RdhupReportedWhenPeerShutsDownWritingWithoutHup) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  Fd ep = EpollFd();
  Add(ep.get(), c.server.get(), EPOLLIN | EPOLLRDHUP, 11);
  VS_ASSERT_OK(shutdown(c.client.get(), SHUT_WR));
  auto ev = Wait(ep.get(), kIoTimeoutMs);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].events, static_cast<uint32_t>(EPOLLIN | EPOLLRDHUP));
}

TEST(Epoll, ErrAndHupReportedAfterPeerResetEvenIfNotRequested) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  Fd ep = EpollFd();
  Add(ep.get(), c.client.get(), EPOLLIN, 12);
  CloseWithReset(c.server);
  std::vector<epoll_event> ev;
  Deadline deadline(kIoTimeoutMs);
  // The first wakeup may come before the RST is fully processed; wait for ERR.
  while (!deadline.Expired()) {
    ev = Wait(ep.get(), deadline.RemainingMs());
    if (ev.size() == 1 && (ev[0].events & EPOLLERR)) break;
    SleepMs(1);
  }
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_TRUE(ev[0].events & EPOLLERR) << std::hex << ev[0].events;
  EXPECT_TRUE(ev[0].events & EPOLLHUP) << std::hex << ev[0].events;
}

TEST(Epoll, SameSocketInTwoEpollSetsIsReportedByBoth) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  Fd ep1 = EpollFd(), ep2 = EpollFd();
  Add(ep1.get(), c.server.get(), EPOLLIN, 1);
  Add(ep2.get(), c.server.get(), EPOLLIN | EPOLLET, 2);
  ASSERT_TRUE(SendAll(c.client.get(), "both"));
  auto e1 = Wait(ep1.get(), kIoTimeoutMs);
  auto e2 = Wait(ep2.get(), kIoTimeoutMs);
  ASSERT_EQ(e1.size(), 1u);
  ASSERT_EQ(e2.size(), 1u);
  EXPECT_EQ(e1[0].data.u64, 1u);
  EXPECT_EQ(e2[0].data.u64, 2u);
}

TEST(Epoll, EpollFdNestedInAnotherEpollFdReportsInnerReadiness) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  Fd inner = EpollFd(), outer = EpollFd();
  Add(inner.get(), c.server.get(), EPOLLIN, 21);
  Add(outer.get(), inner.get(), EPOLLIN, 22);
  EXPECT_EQ(Wait(outer.get(), 0).size(), 0u);
  EXPECT_EQ(WaitFor(inner.get(), POLLIN, 0), 0);
  ASSERT_TRUE(SendAll(c.client.get(), "nested"));
  auto ev = Wait(outer.get(), kIoTimeoutMs);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].data.u64, 22u);
  EXPECT_EQ(WaitFor(inner.get(), POLLIN, 0), POLLIN);
  ev = Wait(inner.get(), 0);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].data.u64, 21u);
  EXPECT_EQ(RecvExactly(c.server.get(), 6), "nested");
  EXPECT_EQ(Wait(outer.get(), 0).size(), 0u);
}

TEST(Epoll, ListenerReportsEpollinForPendingConnection) {
  Fd listener = Listener();
  Fd ep = EpollFd();
  Add(ep.get(), listener.get(), EPOLLIN, 31);
  EXPECT_EQ(Wait(ep.get(), 0).size(), 0u);
  Fd client = ConnectTo(SockName(listener.get()));
  auto ev = Wait(ep.get(), kIoTimeoutMs);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].events, static_cast<uint32_t>(EPOLLIN));
}

// With fewer slots than ready items, level-triggered epoll hands out each
// ready item in turn instead of starving the later ones.
TEST(Epoll, MaxeventsBelowReadyCountReportsEachReadySocketInTurn) {
  constexpr int kPairs = 3;
  std::vector<Connection> pairs;
  Fd ep = EpollFd();
  for (int i = 0; i < kPairs; ++i) {
    pairs.push_back(ConnectedPair());
    ASSERT_TRUE(pairs.back().ok());
    Add(ep.get(), pairs.back().server.get(), EPOLLIN, static_cast<uint64_t>(i));
    ASSERT_TRUE(SendAll(pairs.back().client.get(), "r"));
    ASSERT_TRUE(WaitFor(pairs.back().server.get(), POLLIN) & POLLIN);
  }
  std::set<uint64_t> seen;
  for (int i = 0; i < kPairs; ++i) {
    epoll_event e;
    ASSERT_EQ(epoll_wait(ep.get(), &e, 1, kIoTimeoutMs), 1) << ErrnoName(errno);
    seen.insert(e.data.u64);
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kPairs));
}

TEST(Epoll, PwaitSigmaskHoldsOffSignalAndWaitIsInterruptedWithoutIt) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  Fd ep = EpollFd();
  Add(ep.get(), c.server.get(), EPOLLIN, 41);
  ScopedSignalHandler handler(SIGUSR1, CountUsr1, SA_RESTART);
  Usr1Count() = 0;
  RepeatingSignaller signaller(pthread_self());
  epoll_event e;
  sigset_t mask = MaskWithUsr1Blocked();
  EXPECT_EQ(epoll_pwait(ep.get(), &e, 1, 200, &mask), 0) << ErrnoName(errno);
  // Never restarted, even with SA_RESTART.
  VS_EXPECT_ERRNO(epoll_wait(ep.get(), &e, 1, kIoTimeoutMs), EINTR);
  signaller.Stop();
  EXPECT_GE(Usr1Count().load(), 1);
  ASSERT_TRUE(SendAll(c.client.get(), "w"));
  EXPECT_EQ(epoll_pwait(ep.get(), &e, 1, kIoTimeoutMs, nullptr), 1) << ErrnoName(errno);
  EXPECT_EQ(e.data.u64, 41u);
}

// epoll_pwait2 (glibc 2.35; a timespec timeout) is an epoll wait like the
// others: a connection already in use (preloaded: upgraded, its bytes come
// by the ring) is reported as soon as its data is there, a zero timespec
// looks and returns, a sub-millisecond one times out, a null one waits.
TEST(Epoll, Pwait2ReportsDataOnAConnectionAlreadyInUse) {
  Connection c = ConnectedPairInUse();
  ASSERT_TRUE(c.ok());
  Fd ep = EpollFd();
  Add(ep.get(), c.server.get(), EPOLLIN, 42);
  epoll_event e[2];
  timespec zero{0, 0}, short_wait{0, 300'000}, full{kIoTimeoutMs / 1000, (kIoTimeoutMs % 1000) * 1'000'000L};
  EXPECT_EQ(epoll_pwait2(ep.get(), e, 2, &zero, nullptr), 0) << ErrnoName(errno);
  EXPECT_EQ(epoll_pwait2(ep.get(), e, 2, &short_wait, nullptr), 0) << ErrnoName(errno);
  std::thread writer([&] {
    SleepMs(100);
    (void)SendAll(c.client.get(), "c");
  });
  int n = epoll_pwait2(ep.get(), e, 2, &full, nullptr);
  writer.join();
  ASSERT_EQ(n, 1) << "the wait timed out or failed (" << ErrnoName(errno) << "): the data was not noticed";
  EXPECT_EQ(e[0].events, static_cast<uint32_t>(EPOLLIN));
  EXPECT_EQ(e[0].data.u64, 42u);
  EXPECT_EQ(epoll_pwait2(ep.get(), e, 2, nullptr, nullptr), 1) << ErrnoName(errno);
  EXPECT_EQ(RecvExactly(c.server.get(), 1), "c");
  EXPECT_EQ(epoll_pwait2(ep.get(), e, 2, &zero, nullptr), 0) << ErrnoName(errno);
  VS_EXPECT_ERRNO(epoll_pwait2(ep.get(), e, 0, &zero, nullptr), EINVAL);
  timespec bad{0, 1'000'000'000};
  VS_EXPECT_ERRNO(epoll_pwait2(ep.get(), e, 2, &bad, nullptr), EINVAL);
}

TEST(Epoll, Pwait2SleeperSeesReplyAfterAnotherThreadsFirstWriteUpgradedTheConnection) {
  SleeperSeesReplyAfterAnotherThreadsFirstWrite([](int fd) {
    Fd ep = EpollFd();
    Add(ep.get(), fd, EPOLLIN, 7);
    epoll_event e[2];
    timespec full{kIoTimeoutMs / 1000, (kIoTimeoutMs % 1000) * 1'000'000L};
    int n = epoll_pwait2(ep.get(), e, 2, &full, nullptr);
    return n == 1 && e[0].events == EPOLLIN;
  });
}

// epoll registers the open file description: closing one descriptor while
// a dup keeps the socket open leaves the registration (and its events) in
// place. Closing the last descriptor removes it.
TEST(Epoll, RegistrationOutlivesClosedFdWhileDuplicateKeepsSocketOpen) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  Fd ep = EpollFd();
  Add(ep.get(), c.server.get(), EPOLLIN, 51);
  Fd d(dup(c.server.get()));
  ASSERT_TRUE(d.valid());
  c.server.reset();
  ASSERT_TRUE(SendAll(c.client.get(), "ghost"));
  auto ev = Wait(ep.get(), kIoTimeoutMs);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].data.u64, 51u);
  EXPECT_EQ(RecvExactly(d.get(), 5), "ghost");
  d.reset();
  ASSERT_TRUE(SendAll(c.client.get(), "gone"));
  EXPECT_EQ(Wait(ep.get(), 50).size(), 0u);
}

TEST(Epoll, ClosingTheOnlyDescriptorRemovesRegistration) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  Fd ep = EpollFd();
  Add(ep.get(), c.server.get(), EPOLLIN | EPOLLRDHUP, 61);
  c.server.reset();
  c.client.reset();  // would wake the registration if it were still there
  EXPECT_EQ(Wait(ep.get(), 50).size(), 0u);
}

// A registered socket's number taken over by dup2 (the socket stays open
// through a dup) and then closed: that number, given to another socket, is
// a new registration for epoll (the kernel keys it by the open file), not
// EEXIST.
TEST(Epoll, NumberOfRegisteredSocketReusedAfterDup2AndCloseCanBeAddedAgain) {
  Connection c = ConnectedPair();
  Connection other = ConnectedPair();
  ASSERT_TRUE(c.ok() && other.ok());
  Fd ep = EpollFd();
  const int fd = c.server.release();
  Add(ep.get(), fd, EPOLLIN, 71);
  Fd keep(dup(fd));  // the first socket stays open
  ASSERT_TRUE(keep.valid());
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  Fd pipe_w(pipe_fds[1]);
  ASSERT_EQ(dup2(pipe_fds[0], fd), fd) << ErrnoName(errno);
  close(pipe_fds[0]);
  ASSERT_EQ(close(fd), 0);  // the pipe's copy: fd is free
  // The other connection's server socket at number fd (dup takes the lowest
  // free number: fill any lower hole first).
  std::vector<Fd> holes;
  Fd at_fd;
  for (int i = 0; i < 4096 && !at_fd.valid(); ++i) {
    Fd d(dup(other.server.get()));
    ASSERT_TRUE(d.valid()) << ErrnoName(errno);
    ASSERT_LE(d.get(), fd);
    if (d.get() == fd) {
      at_fd = std::move(d);
    } else {
      holes.push_back(std::move(d));
    }
  }
  ASSERT_TRUE(at_fd.valid());
  holes.clear();
  Add(ep.get(), fd, EPOLLIN, 72);
  ASSERT_TRUE(SendAll(other.client.get(), "new"));
  auto ev = Wait(ep.get(), kIoTimeoutMs);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].data.u64, 72u);
  EXPECT_EQ(RecvExactly(at_fd.get(), 3), "new");
}


// ---- changes an event loop makes around every request ------------------
// redis (ae) and hiredis clients delete a socket's registration and add it
// again, for reading or for writing, around every request; the library
// applies such changes together before the next wait (decision 61). Each
// must still look applied at once: to the next wait, to another thread
// already waiting, to an epoll set or poll watching this one, to a child,
// and after the descriptor is closed.

// 'r' readable (data waits), 'w' writable: a pair whose server side is both.
Connection ReadableAndWritable() {
  Connection c = ConnectedPair();
  if (c.ok() && (!SendAll(c.client.get(), "x") || WaitForInq(c.server.get(), 1) != 1)) c = Connection{};
  return c;
}

void Ctl(int ep, int op, int fd, uint32_t events, uint64_t cookie) {
  epoll_event e{};
  e.events = events;
  e.data.u64 = cookie;
  ASSERT_EQ(epoll_ctl(ep, op, fd, &e), 0) << "op " << op << ": " << ErrnoName(errno);
}

// The event loop's turn: delete fd's registration, add it back for `events`.
void Readd(int ep, int fd, uint32_t events, uint64_t cookie) {
  Ctl(ep, EPOLL_CTL_DEL, fd, 0, 0);
  Ctl(ep, EPOLL_CTL_ADD, fd, events, cookie);
}

// The next wait on ep reports exactly one fd: `events` with `cookie`.
void ExpectOnly(int ep, uint32_t events, uint64_t cookie) {
  auto ev = Wait(ep, kIoTimeoutMs);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].events, events);
  EXPECT_EQ(ev[0].data.u64, cookie);
}

TEST(EpollChurn, DeleteThenAddAgainReportsOnlyTheNewRegistration) {
  Connection c = ReadableAndWritable();
  ASSERT_TRUE(c.ok());
  const int fd = c.server.get();
  Fd ep = EpollFd();
  Ctl(ep.get(), EPOLL_CTL_ADD, fd, EPOLLIN, 1);
  Ctl(ep.get(), EPOLL_CTL_MOD, fd, EPOLLIN, 1);
  Readd(ep.get(), fd, EPOLLOUT, 2);
  ExpectOnly(ep.get(), EPOLLOUT, 2);
  Readd(ep.get(), fd, EPOLLIN, 3);
  ExpectOnly(ep.get(), EPOLLIN, 3);
  // Deleted is deleted, for the wait and for epoll_ctl.
  Ctl(ep.get(), EPOLL_CTL_DEL, fd, 0, 0);
  EXPECT_EQ(Wait(ep.get(), 0).size(), 0u);
  epoll_event e{};
  VS_EXPECT_ERRNO(epoll_ctl(ep.get(), EPOLL_CTL_MOD, fd, &e), ENOENT);
  VS_EXPECT_ERRNO(epoll_ctl(ep.get(), EPOLL_CTL_DEL, fd, &e), ENOENT);
  Ctl(ep.get(), EPOLL_CTL_ADD, fd, EPOLLIN, 4);
  VS_EXPECT_ERRNO(epoll_ctl(ep.get(), EPOLL_CTL_ADD, fd, &e), EEXIST);
  ExpectOnly(ep.get(), EPOLLIN, 4);
}

// An event loop's 200 requests on c's client end, registered in ep:
// ask_write() asks for writing, the wait reports only EPOLLOUT with
// out_cookie, the request goes out, ask_read() asks for reading, the server
// answers, the wait reports only EPOLLIN with in_cookie; every byte checked.
template <typename AskWrite, typename AskRead>
void RequestLoop(const Connection& c, int ep, AskWrite ask_write, uint64_t out_cookie, AskRead ask_read,
                 uint64_t in_cookie) {
  const int fd = c.client.get();
  for (int i = 0; i < 200; ++i) {
    SCOPED_TRACE(i);
    const std::string req = "request " + std::to_string(i) + "\n", reply = "+" + std::to_string(i * 7) + "\n";
    ASSERT_NO_FATAL_FAILURE(ask_write());
    ASSERT_NO_FATAL_FAILURE(ExpectOnly(ep, EPOLLOUT, out_cookie));
    ASSERT_TRUE(SendAll(fd, req));
    ASSERT_NO_FATAL_FAILURE(ask_read());
    ASSERT_EQ(RecvExactly(c.server.get(), req.size()), req);
    ASSERT_TRUE(SendAll(c.server.get(), reply));
    ASSERT_NO_FATAL_FAILURE(ExpectOnly(ep, EPOLLIN, in_cookie));
    ASSERT_EQ(RecvExactly(fd, reply.size()), reply);
  }
}

TEST(EpollChurn, ManyRequestsOfDeleteAndAddMoveEveryByte) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const int fd = c.client.get();
  Fd ep = EpollFd();
  Ctl(ep.get(), EPOLL_CTL_ADD, fd, EPOLLIN, 9);
  RequestLoop(
      c, ep.get(),
      [&] {
        Ctl(ep.get(), EPOLL_CTL_MOD, fd, EPOLLIN, 9);
        Readd(ep.get(), fd, EPOLLOUT, 10);
      },
      10, [&] { Readd(ep.get(), fd, EPOLLIN, 9); }, 9);
}

// Another thread already asleep in epoll_wait on the set must see a change
// made while it sleeps (nothing waits for its next wait).
TEST(EpollChurn, ThreadAsleepInWaitSeesTheChangeAtOnce) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const int fd = c.server.get();  // writable, nothing to read
  Fd ep = EpollFd();
  Ctl(ep.get(), EPOLL_CTL_ADD, fd, EPOLLIN, 1);
  std::atomic<int> woke{-1};
  std::atomic<uint64_t> cookie{0};
  std::thread sleeper([&] {
    epoll_event e[4];
    int n = epoll_wait(ep.get(), e, 4, kIoTimeoutMs);
    if (n == 1) cookie = e[0].data.u64;
    woke = n;
  });
  usleep(100 * 1000);  // (the sleeper is in epoll_wait by now, or about to be)
  Readd(ep.get(), fd, EPOLLOUT, 2);
  sleeper.join();
  EXPECT_EQ(woke.load(), 1);
  EXPECT_EQ(cookie.load(), 2u);
}

// What an epoll_wait on ep, asleep when change() runs 100 ms after it
// began, returns.
template <typename Change>
int WaitWokenBy(int ep, Change change) {
  std::atomic<int> woke{-1};
  std::thread sleeper([&] {
    epoll_event e[4];
    woke = epoll_wait(ep, e, 4, kIoTimeoutMs);
  });
  usleep(100 * 1000);
  change();
  sleeper.join();
  return woke.load();
}

// A set watched by another epoll set: the outer one's sleeper sees the inner
// set become ready when a socket is added to it for writing.
TEST(EpollChurn, OuterSetAsleepSeesChangeToNestedSet) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const int fd = c.server.get();
  Fd inner = EpollFd(), outer = EpollFd();
  Ctl(inner.get(), EPOLL_CTL_ADD, fd, EPOLLIN, 1);
  Ctl(outer.get(), EPOLL_CTL_ADD, inner.get(), EPOLLIN, 7);
  EXPECT_EQ(Wait(outer.get(), 0).size(), 0u);
  EXPECT_EQ(WaitWokenBy(outer.get(), [&] { Readd(inner.get(), fd, EPOLLOUT, 2); }), 1);
}

// The same with the order of an event loop that nests its sets first: the
// inner set is added to the outer one while it watches nothing yet.
TEST(EpollChurn, OuterSetSeesChangesToSetNestedBeforeItWatchedAnything) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const int fd = c.server.get();
  Fd inner = EpollFd(), outer = EpollFd();
  Ctl(outer.get(), EPOLL_CTL_ADD, inner.get(), EPOLLIN, 7);
  Ctl(inner.get(), EPOLL_CTL_ADD, fd, EPOLLIN, 1);
  Ctl(inner.get(), EPOLL_CTL_MOD, fd, EPOLLIN, 1);
  EXPECT_EQ(Wait(outer.get(), 0).size(), 0u);
  Readd(inner.get(), fd, EPOLLOUT, 2);
  EXPECT_EQ(Wait(outer.get(), 0).size(), 1u);  // no wait on inner in between
  Readd(inner.get(), fd, EPOLLIN, 3);
  EXPECT_EQ(Wait(outer.get(), 0).size(), 0u);
  EXPECT_EQ(WaitWokenBy(outer.get(), [&] { Readd(inner.get(), fd, EPOLLOUT, 4); }), 1);
}

// poll() on an epoll fd reports its readiness as the changes made it.
TEST(EpollChurn, PollOnTheSetSeesChanges) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const int fd = c.server.get();
  Fd ep = EpollFd();
  Ctl(ep.get(), EPOLL_CTL_ADD, fd, EPOLLIN, 1);
  EXPECT_EQ(WaitFor(ep.get(), POLLIN, 0), 0);
  Readd(ep.get(), fd, EPOLLOUT, 2);
  EXPECT_EQ(WaitFor(ep.get(), POLLIN, 0), POLLIN);
  Ctl(ep.get(), EPOLL_CTL_DEL, fd, 0, 0);
  EXPECT_EQ(WaitFor(ep.get(), POLLIN, 0), 0);
}

// A child shares the epoll object: it sees every change made before fork.
TEST(EpollChurn, ChildSeesChangesMadeBeforeFork) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const int fd = c.server.get();
  Fd ep = EpollFd();
  Ctl(ep.get(), EPOLL_CTL_ADD, fd, EPOLLIN, 1);
  Readd(ep.get(), fd, EPOLLOUT, 2);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    epoll_event e[4];
    int n = epoll_wait(ep.get(), e, 4, kIoTimeoutMs);
    _exit(n == 1 && e[0].data.u64 == 2 && e[0].events == EPOLLOUT ? 0 : 10 + n);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// wrk's and every ae client's turn: the registration asks for writing once
// an answer is in, the wait reports the socket writable, the request goes
// out and the registration asks for reading again (decision 75: the
// library may answer such a wait with one poll of the socket, the kernel's
// registration left for reading).
TEST(EpollChurn, WritableAskedForPerRequestReportsWritableThenTheAnswer) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const int fd = c.client.get();
  Fd ep = EpollFd();
  Ctl(ep.get(), EPOLL_CTL_ADD, fd, EPOLLIN, 9);
  RequestLoop(
      c, ep.get(), [&] { Ctl(ep.get(), EPOLL_CTL_MOD, fd, EPOLLIN | EPOLLOUT, 9); }, 9,
      [&] { Ctl(ep.get(), EPOLL_CTL_MOD, fd, EPOLLIN, 9); }, 9);
}

// Readable and writable at once, and the peer's FIN: the wait reports what
// the kernel's would, every bit of it.
TEST(EpollChurn, WritableAskedForReportsReadableAndHangupToo) {
  Connection c = ReadableAndWritable();
  ASSERT_TRUE(c.ok());
  const int fd = c.server.get();
  Fd ep = EpollFd();
  Ctl(ep.get(), EPOLL_CTL_ADD, fd, EPOLLIN | EPOLLRDHUP, 3);
  ExpectOnly(ep.get(), EPOLLIN, 3);
  Ctl(ep.get(), EPOLL_CTL_MOD, fd, EPOLLIN | EPOLLOUT | EPOLLRDHUP, 3);
  ExpectOnly(ep.get(), EPOLLIN | EPOLLOUT, 3);
  Ctl(ep.get(), EPOLL_CTL_MOD, fd, EPOLLIN | EPOLLRDHUP, 3);
  ASSERT_EQ(shutdown(c.client.get(), SHUT_WR), 0);
  ASSERT_EQ(WaitFor(fd, POLLRDHUP, kIoTimeoutMs), POLLRDHUP);
  Ctl(ep.get(), EPOLL_CTL_MOD, fd, EPOLLIN | EPOLLOUT | EPOLLRDHUP, 3);
  ExpectOnly(ep.get(), EPOLLIN | EPOLLOUT | EPOLLRDHUP, 3);
}

// A socket whose send buffer is full is not writable: the wait sleeps
// until the peer's answer, and reports only that.
TEST(EpollChurn, WritableAskedForOnAFullSendBufferWaitsForTheAnswer) {
  Connection c = ConnectedPair();
  ASSERT_TRUE(c.ok());
  const int fd = c.client.get();
  // Filled until it stays full (what the sender queued may move on towards
  // the peer's receive buffer, which frees room again for a while).
  std::string chunk(65536, 'f');
  bool full = false;
  for (int round = 0; round < 64 && !full; ++round) {
    for (int i = 0; i < 4096 && send(fd, chunk.data(), chunk.size(), MSG_DONTWAIT) > 0; ++i) {
    }
    full = WaitFor(fd, POLLOUT, 100) == 0;
  }
  ASSERT_TRUE(full) << "the send buffer never stayed full";
  Fd ep = EpollFd();
  Ctl(ep.get(), EPOLL_CTL_ADD, fd, EPOLLIN, 1);
  Ctl(ep.get(), EPOLL_CTL_MOD, fd, EPOLLIN | EPOLLOUT, 1);
  EXPECT_EQ(Wait(ep.get(), 50).size(), 0u);
  ASSERT_TRUE(SendAll(c.server.get(), "answer"));
  // (Accelerated, the ring may drain towards the peer and report writable
  // before the answer is in.)
  bool readable = false;
  for (int i = 0; i < 200 && !readable; ++i) {
    auto ev = Wait(ep.get(), kIoTimeoutMs);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].data.u64, 1u);
    readable = ev[0].events & EPOLLIN;
    if (!readable) usleep(10 * 1000);
  }
  EXPECT_TRUE(readable);
}

// A socket asked for writing again before every wait does not hide the
// other sockets of the set: at least every other wait reports them.
TEST(EpollChurn, WritableAskedForBeforeEveryWaitDoesNotStarveTheOthers) {
  Connection a = ConnectedPair(), b = ReadableAndWritable();
  ASSERT_TRUE(a.ok() && b.ok());
  Fd ep = EpollFd();
  Ctl(ep.get(), EPOLL_CTL_ADD, a.client.get(), EPOLLIN, 1);
  Ctl(ep.get(), EPOLL_CTL_ADD, b.server.get(), EPOLLIN, 2);
  int saw_b = 0;
  for (int i = 0; i < 6; ++i) {
    Ctl(ep.get(), EPOLL_CTL_MOD, a.client.get(), EPOLLIN, 1);
    Ctl(ep.get(), EPOLL_CTL_MOD, a.client.get(), EPOLLIN | EPOLLOUT, 1);
    for (const epoll_event& e : Wait(ep.get(), kIoTimeoutMs)) saw_b += e.data.u64 == 2 && e.events == EPOLLIN;
  }
  EXPECT_GE(saw_b, 3);
}

// Deleted, then the descriptor closed while a dup keeps the socket: the
// registration is gone (it was deleted), not left behind with its cookie.
TEST(EpollChurn, DeletedThenClosedWhileDupKeepsSocketReportsNothing) {
  Connection c = ReadableAndWritable();
  ASSERT_TRUE(c.ok());
  Fd ep = EpollFd();
  Ctl(ep.get(), EPOLL_CTL_ADD, c.server.get(), EPOLLIN | EPOLLOUT, 5);
  Fd d(dup(c.server.get()));
  ASSERT_TRUE(d.valid());
  Ctl(ep.get(), EPOLL_CTL_DEL, c.server.get(), 0, 0);
  c.server.reset();
  EXPECT_EQ(Wait(ep.get(), 50).size(), 0u);
}

}  // namespace
}  // namespace vsocket::socktest
