// The fd table follows a connection's numbers even where the program
// closed one behind the library's back (a raw system call): a new socket
// under that number, or a region-full sweep, reclaims the old connection
// instead of leaking it (issue 34).
#include "guest/core/fd_table.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <thread>

#include "guest/core/loopback_pair.h"

namespace vsocket::guest {
namespace {

// As registration records it.
void Registered(int fd, Conn& c) {
  struct stat st{};
  ASSERT_EQ(fstat(fd, &st), 0);
  c.sock_dev = st.st_dev;
  c.sock_ino = st.st_ino;
}

TEST(FdTable, ANewSocketUnderAnUnseenClosedNumberReclaimsTheOldConnection) {
  auto [a, b] = testing::LoopbackTcpPair();
  Adopt(a, false);
  std::shared_ptr<Conn> old = Lookup(a);
  ASSERT_NE(old, nullptr);
  uint64_t before = StaleReclaimed();
  syscall(SYS_close, a);  // as libuv closes: the library sees nothing
  auto [c, d] = testing::LoopbackTcpPair();  // the lowest free number again
  ASSERT_EQ(c, a) << "the test wants the number reused";
  Adopt(c, false);
  EXPECT_EQ(StaleReclaimed(), before + 1);
  EXPECT_EQ(old->fd_refs.load(), 0);
  EXPECT_NE(Lookup(c), old);
  Forget(c, false);
  for (int fd : {b, c, d}) close(fd);
}

TEST(FdTable, TheRegionFullSweepReclaimsConnectionsWhoseNumbersNameAnotherFile) {
  auto [a, b] = testing::LoopbackTcpPair();
  Adopt(a, false);
  std::shared_ptr<Conn> conn = Lookup(a);
  Registered(a, *conn);
  auto [keep, keep_peer] = testing::LoopbackTcpPair();  // a live one: left alone
  Adopt(keep, false);
  Registered(keep, *Lookup(keep));
  uint64_t before = StaleReclaimed();
  EXPECT_EQ(ReclaimStale(), 0u) << "nothing was closed yet";
  syscall(SYS_close, a);
  // Another file under the number, put there behind the library's back too.
  int other = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_EQ(syscall(SYS_dup3, other, a, O_CLOEXEC), a);
  close(other);
  int file = a;
  EXPECT_EQ(ReclaimStale(), 1u);
  EXPECT_EQ(StaleReclaimed(), before + 1);
  EXPECT_EQ(Lookup(file), nullptr) << "a file was taken for the old connection";
  EXPECT_NE(Lookup(keep), nullptr);
  // A number closed and not reused at all is reclaimed too.
  int k2 = keep;
  syscall(SYS_close, k2);
  EXPECT_EQ(ReclaimStale(), 1u);
  EXPECT_EQ(Lookup(k2), nullptr);
  for (int fd : {b, file, keep_peer}) close(fd);
}

// A wrapper's look-up (LookupForCall) borrows the thread's cached
// reference: it must follow every change of the fd (a close, a new socket
// under the number), never hand a nested call the entry it is replacing,
// and give the reference back when the thread ends.
TEST(FdTable, ACallsLookupFollowsTheFdThroughCloseAndReuse) {
  auto [a, b] = testing::LoopbackTcpPair();
  Adopt(a, false);
  Conn* first = Lookup(a).get();
  {
    ConnRef r = LookupForCall(a);
    ASSERT_EQ(r.get(), first);
    ConnRef again = LookupForCall(a);  // nested, same fd: the same entry
    EXPECT_EQ(again.get(), first);
  }
  std::weak_ptr<Conn> gone = Lookup(a);
  Forget(a);
  EXPECT_FALSE(LookupForCall(a)) << "a forgotten fd still answered from the cache";
  EXPECT_TRUE(gone.expired()) << "the closing thread's cache kept the connection";
  Adopt(a, false);  // a new connection under the same number
  Conn* second = Lookup(a).get();
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(LookupForCall(a).get(), second);
  Forget(a);
  for (int fd : {a, b}) close(fd);
}

TEST(FdTable, ANestedCallOnAnotherFdTakesItsOwnReference) {
  auto [a, b] = testing::LoopbackTcpPair();
  Adopt(a, false);
  Adopt(b, false);
  std::weak_ptr<Conn> wa = Lookup(a);
  {
    ConnRef ra = LookupForCall(a);
    {
      ConnRef rb = LookupForCall(b);  // (a signal handler's call, say)
      EXPECT_EQ(rb.get(), Lookup(b).get());
    }
    Forget(a);  // another thread's close, while ra is in use
    EXPECT_FALSE(wa.expired()) << "the borrowed connection went while borrowed";
    EXPECT_EQ(ra->fd_refs.load(), 0);
  }
  Forget(b);
  for (int fd : {a, b}) close(fd);
}

TEST(FdTable, AThreadsCachedReferenceEndsWithTheThread) {
  auto [a, b] = testing::LoopbackTcpPair();
  Adopt(a, false);
  std::weak_ptr<Conn> w = Lookup(a);
  int fd_a = a;
  std::thread t([fd_a] { EXPECT_TRUE(LookupForCall(fd_a)); });
  t.join();
  Forget(a);
  EXPECT_TRUE(w.expired()) << "an exited thread's cache kept the connection";
  for (int fd : {a, b}) close(fd);
}

}  // namespace
}  // namespace vsocket::guest
