#include "guest/agent/agent_transport.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>

#include "vhost/ring/split_ring.h"

namespace vsocket::agent {
namespace {

// vsocket-guestd's side, played by the test: listens, accepts one process
// and sends it `grant` with a memfd of `memfd_bytes` (normal pages: the
// transport cannot tell) and the four eventfds.
class FakeAgent {
 public:
  FakeAgent() {
    path_ = "/tmp/vsocket-agent-test-" + std::to_string(getpid()) + ".sock";
    listen_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, path_.c_str());
    unlink(path_.c_str());
    EXPECT_EQ(bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(listen_, 4), 0);
    for (int& e : events_) e = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  }
  ~FakeAgent() {
    if (server_.joinable()) server_.join();
    if (client_ >= 0) close(client_);
    for (int e : events_) close(e);
    if (memfd_ >= 0) close(memfd_);
    close(listen_);
    unlink(path_.c_str());
  }
  // Serves one grant in the background.
  void Serve(const Grant& g, uint64_t memfd_bytes, bool with_fds = true) {
    memfd_ = memfd_create("fake-agent", MFD_CLOEXEC);
    EXPECT_EQ(ftruncate(memfd_, static_cast<off_t>(memfd_bytes)), 0);
    server_ = std::thread([this, g, with_fds] {
      client_ = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
      iovec iov{const_cast<Grant*>(&g), sizeof(g)};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * kGrantFds)] = {};
      if (with_fds) {
        int fds[kGrantFds] = {memfd_, events_[0], events_[1], events_[2], events_[3]};
        msg.msg_control = ctl;
        msg.msg_controllen = sizeof(ctl);
        cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(fds));
        std::memcpy(CMSG_DATA(c), fds, sizeof(fds));
      }
      EXPECT_EQ(sendmsg(client_, &msg, 0), static_cast<ssize_t>(sizeof(g)));
    });
  }
  void Join() { server_.join(); }
  void HangUp() {
    close(client_);
    client_ = -1;
  }
  const std::string& path() const { return path_; }
  int kick(int q) const { return events_[q]; }
  int call(int q) const { return events_[2 + q]; }

 private:
  std::string path_;
  int listen_ = -1;
  int client_ = -1;
  int memfd_ = -1;
  int events_[4] = {-1, -1, -1, -1};
  std::thread server_;
};

// Two 2 MiB pages whose GPAs are out of order (as pagemap may give them).
Grant TwoPageGrant() {
  Grant g;
  g.queue_size = 256;
  g.event_idx = 1;
  g.memory_bytes = 2 * kGrantPageBytes;
  g.ring_offset[0] = 0;
  g.ring_offset[1] = 64 * 1024;
  g.pool_offset = 128 * 1024;
  g.pool_bytes = g.memory_bytes - g.pool_offset;
  g.num_pages = 2;
  g.page_gpa[0] = 0x40000000;
  g.page_gpa[1] = 0x10000000;
  return g;
}

bool Readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 1000) == 1;
}

TEST(AgentTransportTest, TakesAGrantTranslatesEachPageAndRelaysKicksAndWakeUps) {
  FakeAgent agent;
  Grant g = TwoPageGrant();
  agent.Serve(g, g.memory_bytes);
  auto t = AgentTransport::Open(agent.path());
  agent.Join();
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  guest::Transport& tr = **t;
  EXPECT_EQ(tr.queue(guest::QueueId::kRequests).size(), 256);
  // Allocations never cross the page boundary; GPAs follow each page's own.
  vhost::RegionAllocator& mem = tr.allocator();
  uint8_t* small = mem.Allocate(4096);
  uint8_t* big = mem.Allocate(kGrantPageBytes - 64 * 1024);  // does not fit before the boundary
  ASSERT_NE(small, nullptr);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(tr.Gpa(small), 0x40000000u + 128 * 1024);
  EXPECT_EQ(tr.Gpa(big), 0x10000000u) << "starts the second page";
  EXPECT_EQ(tr.Gpa(big + 100), 0x10000000u + 100);
  // A kick reaches the agent; the agent's wake-up reaches the process.
  tr.Kick(guest::QueueId::kEvents);
  EXPECT_TRUE(Readable(agent.kick(1)));
  EXPECT_FALSE(Readable(agent.kick(0)));
  uint64_t one = 1;
  ASSERT_EQ(write(agent.call(0), &one, sizeof(one)), 8);
  EXPECT_TRUE(Readable(tr.wake_fd(guest::QueueId::kRequests)));
  EXPECT_FALSE(tr.BackendGone());
  EXPECT_FALSE(tr.proves_sockets());
  agent.HangUp();
  EXPECT_TRUE(tr.BackendGone()) << "the agent's hang-up is the backend gone";
}

TEST(AgentTransportTest, RefusesARingAcrossAPage) {
  FakeAgent agent;
  Grant g = TwoPageGrant();
  g.ring_offset[1] = kGrantPageBytes - 4096;  // desc table runs into the next page
  agent.Serve(g, g.memory_bytes);
  auto t = AgentTransport::Open(agent.path());
  agent.Join();
  EXPECT_EQ(t.status().code(), Code::kDataLoss);
}

TEST(AgentTransportTest, RefusesMemoryLargerThanItsFile) {
  FakeAgent agent;
  Grant g = TwoPageGrant();
  agent.Serve(g, kGrantPageBytes);  // half of what the grant claims
  auto t = AgentTransport::Open(agent.path());
  agent.Join();
  EXPECT_EQ(t.status().code(), Code::kDataLoss);
}

TEST(AgentTransportTest, APoolOutsideTheMemoryIsRefused) {
  FakeAgent agent;
  Grant g = TwoPageGrant();
  g.pool_bytes = g.memory_bytes;  // from pool_offset on, past the end
  agent.Serve(g, g.memory_bytes);
  auto t = AgentTransport::Open(agent.path());
  agent.Join();
  EXPECT_EQ(t.status().code(), Code::kDataLoss);
}

TEST(AgentTransportTest, EveryFunctionTakenIsUnavailableNotAnError) {
  FakeAgent agent;
  Grant g;
  g.status = GrantStatus::kBusy;
  agent.Serve(g, 4096, /*with_fds=*/false);
  auto t = AgentTransport::Open(agent.path());
  agent.Join();
  EXPECT_EQ(t.status().code(), Code::kUnavailable);
}

TEST(AgentTransportTest, NoAgentIsUnavailable) {
  auto t = AgentTransport::Open("/tmp/vsocket-agent-test-nobody.sock");
  EXPECT_EQ(t.status().code(), Code::kUnavailable);
}

}  // namespace
}  // namespace vsocket::agent
