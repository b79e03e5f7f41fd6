// Which transport libvsocket.so takes for which environment (decision 108),
// with real Unix sockets standing in for the agent (SOCK_SEQPACKET) and for
// vsocketd's vhost-user port (SOCK_STREAM).
#include "guest/agent/transport_choice.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "guest/core/config.h"

namespace vsocket::agent {
namespace {

class TransportChoiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vsocket-choice-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/agent.sock";
  }
  void TearDown() override {
    if (listen_ >= 0) close(listen_);
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  // A listener of `type` at path_, as the agent (SOCK_SEQPACKET) or
  // vsocketd's port (SOCK_STREAM) make theirs.
  void Listen(int type) {
    listen_ = socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ASSERT_GE(listen_, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path_.c_str());
    ASSERT_EQ(bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    ASSERT_EQ(listen(listen_, 4), 0);
  }
  // Whether a connection is waiting at the listener.
  bool ListenerSawAConnection() const {
    pollfd p{listen_, POLLIN, 0};
    return poll(&p, 1, 0) == 1;
  }

  std::string dir_, path_;
  int listen_ = -1;
};

TEST_F(TransportChoiceTest, TheAgentsSocketIsTakenForTheAgent) {
  Listen(SOCK_SEQPACKET);
  for (bool is_default : {true, false}) {
    TransportChoice c = ChooseTransport(path_, is_default);
    EXPECT_EQ(c.kind, TransportKind::kAgent) << ToString(c.kind);
    EXPECT_GE(c.agent.get(), 0);
    EXPECT_TRUE(ListenerSawAConnection()) << "the grant must come on the connection the choice made";
    int a = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
    ASSERT_GE(a, 0);
    close(a);
  }
}

TEST_F(TransportChoiceTest, VsocketdsPortIsTakenForProcessModeUnseen) {
  Listen(SOCK_STREAM);
  for (bool is_default : {true, false}) {
    TransportChoice c = ChooseTransport(path_, is_default);
    EXPECT_EQ(c.kind, TransportKind::kProcess) << ToString(c.kind);
    EXPECT_LT(c.agent.get(), 0);
    // vsocketd (rte_vhost) would take a stray connection for a frontend.
    EXPECT_FALSE(ListenerSawAConnection()) << "the probe reached vsocketd's listener";
  }
}

TEST_F(TransportChoiceTest, NothingAtTheDefaultPathIsNeitherWithAReason) {
  TransportChoice c = ChooseTransport(path_, /*path_is_default=*/true);
  EXPECT_EQ(c.kind, TransportKind::kNone) << ToString(c.kind);
  EXPECT_EQ(c.why.code(), Code::kUnavailable);
  EXPECT_NE(c.why.message().find("VSOCKET_SOCKET not set"), std::string::npos) << c.why.message();
  EXPECT_NE(c.why.message().find(path_), std::string::npos) << c.why.message();
  EXPECT_NE(c.why.message().find("No such file"), std::string::npos) << c.why.message();
}

TEST_F(TransportChoiceTest, AStaleSocketFileAtTheDefaultPathIsNeither) {
  Listen(SOCK_SEQPACKET);
  close(listen_);  // the file stays, nobody listens: an agent that died
  listen_ = -1;
  TransportChoice c = ChooseTransport(path_, /*path_is_default=*/true);
  EXPECT_EQ(c.kind, TransportKind::kNone) << ToString(c.kind);
  EXPECT_NE(c.why.message().find("Connection refused"), std::string::npos) << c.why.message();
}

TEST_F(TransportChoiceTest, NothingAtAConfiguredPathIsLeftToProcessModeAsBefore) {
  // Process mode's own open then says why (and retries find an agent that
  // starts later: the next attempt chooses again).
  TransportChoice c = ChooseTransport(path_, /*path_is_default=*/false);
  EXPECT_EQ(c.kind, TransportKind::kProcess) << ToString(c.kind);
}

TEST_F(TransportChoiceTest, AnEmptyPathIsOff) {
  TransportChoice c = ChooseTransport("", /*path_is_default=*/false);
  EXPECT_EQ(c.kind, TransportKind::kNone);
  EXPECT_NE(c.why.message().find("empty"), std::string::npos) << c.why.message();
}

TEST_F(TransportChoiceTest, AnAgentSocketThisUserMayNotUseIsNeitherWithTheReason) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to drop to another uid";
  Listen(SOCK_SEQPACKET);
  ASSERT_EQ(chmod(path_.c_str(), 0600), 0);  // the agent's mode
  ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    TransportChoice c = ChooseTransport(path_, /*path_is_default=*/true);
    _exit(c.kind == TransportKind::kNone && c.why.code() == Code::kPermissionDenied &&
                  c.why.message().find("no permission to connect to vsocket-guestd") != std::string::npos
              ? 0
              : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// The library's factory reads the configuration: with VSOCKET_SOCKET unset
// it looks for the agent at its default path, and names what it looked for.
TEST(TransportChoiceConfigTest, UnsetSocketMeansTheAgentsDefaultPath) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // (a fresh process: the configuration is read once)
    unsetenv("VSOCKET_SOCKET");
    const guest::GuestConfig& cfg = guest::Config();
    if (cfg.socket_path != guest::kDefaultAgentSocket || !cfg.socket_is_default) _exit(1);
    struct stat st{};
    if (stat(guest::kDefaultAgentSocket, &st) == 0) _exit(0);  // (an agent here: nothing more to check)
    auto t = OpenChosenTransport();
    _exit(!t.ok() && t.status().message().find(guest::kDefaultAgentSocket) != std::string::npos ? 0 : 2);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(TransportChoiceConfigTest, ASetSocketIsNotTheDefault) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setenv("VSOCKET_SOCKET", "/run/vsocket/vm1.sock", 1);
    const guest::GuestConfig& cfg = guest::Config();
    _exit(cfg.socket_path == "/run/vsocket/vm1.sock" && !cfg.socket_is_default ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace vsocket::agent
