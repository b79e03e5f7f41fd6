// The epoll emulation's rules, white-box: deferred changes (decision 61),
// the one-poll answer and its starvation rule (decision 75), the library's
// marker events never reaching the application, and a ring event waking a
// sleeping wait, through the fake transport (vsocketd's side in the test).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <tuple>
#include <thread>

#include "guest/core/epoll/emulated.h"
#include "guest/core/fake_transport.h"
#include "guest/core/fd_table.h"
#include "guest/core/loopback_pair.h"
#include "guest/core/poll_ops.h"
#include "guest/core/session.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {
namespace {

using proto::Message;
using proto::MsgType;

// A connected loopback TCP pair; `a` followed by the library as a
// connection held on kernel TCP (as the policy holds request/response ones).
struct Pair {
  int a = -1, b = -1;
  std::shared_ptr<Conn> conn;
  Pair() {
    std::tie(a, b) = testing::LoopbackTcpPair();
    EXPECT_GE(a, 0);
    Adopt(a, false);
    conn = Lookup(a);
    conn->held.store(true);
  }
  ~Pair() {
    EpollForget(a);
    Forget(a, false);
    close(a);
    close(b);
  }
  void PeerWrites() { ASSERT_EQ(write(b, "x", 1), 1); }
};

epoll_event Ev(uint32_t events, uint64_t data) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = data;
  return ev;
}

// close() as the wrapper does it: the library forgets the set first.
void CloseSet(int ep) {
  EpollForget(ep);
  close(ep);
}

// What the kernel's own epoll object reports now (the library bypassed).
int KernelReady(int epfd) {
  epoll_event ev[8];
  return Libc().epoll_wait(epfd, ev, 8, 0);
}

TEST(EpollDeferred, ADelOfAHeldConnectionWaitsForTheNextWait) {
  Pair p;
  int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev = Ev(EPOLLIN, 1);
  ASSERT_EQ(EpollCtl(ep, EPOLL_CTL_ADD, p.a, &ev), 0);
  p.PeerWrites();
  EXPECT_EQ(KernelReady(ep), 1);
  ASSERT_EQ(EpollCtl(ep, EPOLL_CTL_DEL, p.a, nullptr), 0);
  EXPECT_TRUE(EpollHasDeferred());
  EXPECT_EQ(KernelReady(ep), 1) << "the DEL reached the kernel at once";
  // The application sees it deleted all the same.
  epoll_event out[4];
  EXPECT_EQ(EpollWait(ep, out, 4, 0, nullptr), 0);
  EXPECT_FALSE(EpollHasDeferred());
  EXPECT_EQ(KernelReady(ep), 0) << "the wait did not apply the DEL";
  CloseSet(ep);
}

TEST(EpollDeferred, DelThenAddIsNoChangeAtAll) {
  Pair p;
  int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev = Ev(EPOLLIN, 7);
  ASSERT_EQ(EpollCtl(ep, EPOLL_CTL_ADD, p.a, &ev), 0);
  ASSERT_EQ(EpollCtl(ep, EPOLL_CTL_DEL, p.a, nullptr), 0);
  ASSERT_EQ(EpollCtl(ep, EPOLL_CTL_ADD, p.a, &ev), 0);
  // A second ADD is refused as the kernel would.
  EXPECT_EQ(EpollCtl(ep, EPOLL_CTL_ADD, p.a, &ev), -1);
  EXPECT_EQ(errno, EEXIST);
  p.PeerWrites();
  epoll_event out[4];
  ASSERT_EQ(EpollWait(ep, out, 4, 1000, nullptr), 1);
  EXPECT_EQ(out[0].data.u64, 7u);
  EXPECT_EQ(out[0].events, uint32_t{EPOLLIN});
  CloseSet(ep);
}

TEST(EpollDeferred, EdgeTriggeredChangesAreNeverDeferred) {
  Pair p;
  int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev = Ev(EPOLLIN | EPOLLET, 1);
  ASSERT_EQ(EpollCtl(ep, EPOLL_CTL_ADD, p.a, &ev), 0);
  ASSERT_EQ(EpollCtl(ep, EPOLL_CTL_DEL, p.a, nullptr), 0);
  EXPECT_FALSE(EpollHasDeferred());
  CloseSet(ep);
}

// Closing a connection drops its node in every set that has one, also when
// the set that took the last node is gone (the look-up of that set alone,
// EpollForget's usual case, then falls back to every set): the fd number's
// next connection is a new one to the set that kept the old.
TEST(EpollForget, AClosedConnectionLeavesEverySetAlsoWhenItsLastSetClosedFirst) {
  int ep1 = epoll_create1(EPOLL_CLOEXEC), ep2 = epoll_create1(EPOLL_CLOEXEC);
  int fd;
  {
    Pair p;
    fd = p.a;
    epoll_event ev = Ev(EPOLLIN, 1);
    ASSERT_EQ(EpollCtl(ep1, EPOLL_CTL_ADD, p.a, &ev), 0);
    ASSERT_EQ(EpollCtl(ep2, EPOLL_CTL_ADD, p.a, &ev), 0);
    CloseSet(ep2);  // the set that took the last node
  }  // (~Pair: EpollForget, Forget, close as the close() wrapper does)
  Pair q;
  ASSERT_EQ(q.a, fd) << "the fd number was not reused: the check below proves nothing";
  epoll_event ev = Ev(EPOLLIN, 2);
  ASSERT_EQ(EpollCtl(ep1, EPOLL_CTL_ADD, q.a, &ev), 0) << strerror(errno) << ": the old connection's node stayed";
  q.PeerWrites();
  epoll_event out[4];
  ASSERT_EQ(EpollWait(ep1, out, 4, 1000, nullptr), 1);
  EXPECT_EQ(out[0].data.u64, 2u);
  CloseSet(ep1);
}

TEST(EpollOnePoll, AnAskForWritingIsAnsweredByOnePollThenTheKernelWaitsNext) {
  Pair asker, other;
  int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev = Ev(EPOLLIN, 1);
  ASSERT_EQ(EpollCtl(ep, EPOLL_CTL_ADD, asker.a, &ev), 0);
  ev = Ev(EPOLLIN, 2);
  ASSERT_EQ(EpollCtl(ep, EPOLL_CTL_ADD, other.a, &ev), 0);
  other.PeerWrites();  // ready for the kernel's wait
  ev = Ev(EPOLLIN | EPOLLOUT, 1);
  ASSERT_EQ(EpollCtl(ep, EPOLL_CTL_MOD, asker.a, &ev), 0);  // wrk's ask for writing
  EXPECT_TRUE(EpollHasDeferred());
  epoll_event out[4];
  // First wait: the one poll of the asker's socket answers (writable).
  ASSERT_EQ(EpollWait(ep, out, 4, 1000, nullptr), 1);
  EXPECT_EQ(out[0].data.u64, 1u);
  EXPECT_EQ(out[0].events, uint32_t{EPOLLOUT});
  EXPECT_TRUE(EpollHasDeferred()) << "the kept change was applied";
  // Second wait: the kernel's own, every change applied: the other
  // connection is not starved.
  int n = EpollWait(ep, out, 4, 1000, nullptr);
  ASSERT_EQ(n, 2);
  bool saw_other = false;
  for (int i = 0; i < n; ++i) saw_other |= out[i].data.u64 == 2 && (out[i].events & EPOLLIN);
  EXPECT_TRUE(saw_other);
  EXPECT_FALSE(EpollHasDeferred());
  CloseSet(ep);
}

TEST(EpollMarkers, TheLibrarysWakeUpsNeverReachTheApplication) {
  EXPECT_TRUE(epoll::IsMarker(epoll::kWakeMarker));
  EXPECT_TRUE(epoll::IsMarker(epoll::kSessionMarker));
  EXPECT_TRUE(epoll::IsMarker(epoll::kBackendMarker));
  EXPECT_TRUE(epoll::IsMarker(epoll::kFeedMarker | 42));
  EXPECT_FALSE(epoll::IsMarker(0));
  EXPECT_FALSE(epoll::IsMarker(42));
  Pair p;
  int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev = Ev(EPOLLIN, 3);
  ASSERT_EQ(EpollCtl(ep, EPOLL_CTL_ADD, p.a, &ev), 0);
  EpollKick(*p.conn);  // the set's wake eventfd, as a registering connection writes it
  EXPECT_EQ(KernelReady(ep), 1);
  epoll_event out[4];
  EXPECT_EQ(EpollWait(ep, out, 4, 0, nullptr), 0) << "a marker event reached the application";
  CloseSet(ep);
}

// The session over the fake transport, for the connection that is upgraded.
testing::FakeTransport* g_fake = nullptr;
Result<std::unique_ptr<Transport>> MakeFake() {
  auto t = std::make_unique<testing::FakeTransport>();
  g_fake = t.get();
  g_fake->set_responder([](const Message& m) -> std::optional<Message> {
    if (m.type == MsgType::kHello) return Message{MsgType::kHelloAck, 0, proto::HelloAck{}};
    if (m.type == MsgType::kUnregister) return Message{MsgType::kRegisterAck, 0, proto::RegisterAck{}};
    return std::nullopt;
  });
  return std::unique_ptr<Transport>(std::move(t));
}

// A session on the fake transport (vsocketd's side in the test); each
// connection ends before it (the test body's locals go before TearDown).
class EpollEmulated : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("VSOCKET_SOCKET", "/nonexistent/vsocket-fake.sock", 1);
    setenv("VSOCKET_POLL_US", "0", 1);
    SetTransportFactory(&MakeFake);
    proto::Reason why{};
    s_ = Session::Get(&why);
    ASSERT_NE(s_, nullptr);
  }
  void TearDown() override {
    Session::DestroyForTesting();
    SetTransportFactory(nullptr);
  }
  // p's `a` registered as connection `id` and upgraded (its fence 0), with
  // `rx` bytes landed in its RX ring.
  void Upgrade(Pair& p, uint64_t id, uint64_t rx = 0) {
    Conn& c = *p.conn;
    c.held.store(false);
    c.id = id;
    c.session = s_;
    ASSERT_TRUE(c.state.Apply(ConnEvent::kRegistered));
    s_->Track(p.conn);
    ASSERT_TRUE(g_fake->PostEvent({MsgType::kUpgrade, 0, proto::Upgrade{id, 65536, 16}}));
    ASSERT_TRUE(g_fake->PostEvent({MsgType::kFence, 0, proto::ConnCounter{id, 0}}));
    if (rx > 0) ASSERT_TRUE(g_fake->PostEvent({MsgType::kRxTail, 0, proto::ConnCounter{id, rx}}));
    s_->Drain();
    ASSERT_EQ(c.state.phase(), Phase::kUpgraded);
  }
  Session* s_ = nullptr;
};

TEST_F(EpollEmulated, ARingEventWakesASleepingWaitWithTheApplicationsData) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(Upgrade(p, 11));
  int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev = Ev(EPOLLIN, 0xabcdef);
  ASSERT_EQ(EpollCtl(ep, EPOLL_CTL_ADD, p.a, &ev), 0);
  // Its registration moved out of the kernel's set: bytes on the kernel
  // socket no longer make the application's wait report it.
  p.PeerWrites();
  auto waiter = std::async(std::launch::async, [&] {
    epoll_event out[4];
    int n = EpollWait(ep, out, 4, 5000, nullptr);
    return n == 1 ? out[0] : Ev(0, n);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // (asleep or not: either way it must see it)
  ASSERT_TRUE(g_fake->PostEvent({MsgType::kRxTail, 0, proto::ConnCounter{11, 100}}));
  ASSERT_EQ(waiter.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  epoll_event got = waiter.get();
  EXPECT_EQ(got.data.u64, 0xabcdefu);
  EXPECT_EQ(got.events, uint32_t{EPOLLIN});
  s_->Untrack(11);
  CloseSet(ep);
}

// One look at the kernel's events and the library's own in a wait with
// room for fewer than both: the kernel's event is never dropped (an
// edge-triggered one would be lost for good); what is left out waits for
// the next wait.
TEST_F(EpollEmulated, AKernelEventIsNeverDroppedForWantOfRoom) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(Upgrade(p, 12, 100));
  int pfd[2];
  ASSERT_EQ(pipe2(pfd, O_NONBLOCK | O_CLOEXEC), 0);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev = Ev(EPOLLIN, 0xc0);
  ASSERT_EQ(EpollCtl(ep, EPOLL_CTL_ADD, p.a, &ev), 0);
  ev = Ev(EPOLLIN | EPOLLET, 0x919e);
  ASSERT_EQ(EpollCtl(ep, EPOLL_CTL_ADD, pfd[0], &ev), 0);
  ASSERT_EQ(write(pfd[1], "x", 1), 1);
  bool conn_seen = false, pipe_seen = false;
  for (int i = 0; i < 3; ++i) {
    epoll_event out[1];
    int n = EpollWait(ep, out, 1, 0, nullptr);
    ASSERT_LE(n, 1);
    if (n == 1) (out[0].data.u64 == 0xc0 ? conn_seen : pipe_seen) = true;
  }
  EXPECT_TRUE(conn_seen);
  EXPECT_TRUE(pipe_seen) << "the pipe's edge-triggered event was dropped";
  s_->Untrack(12);
  CloseSet(ep);
  close(pfd[0]);
  close(pfd[1]);
}

}  // namespace
}  // namespace vsocket::guest
