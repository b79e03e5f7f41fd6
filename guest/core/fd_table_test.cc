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

}  // namespace
}  // namespace vsocket::guest
