#include "host-backend/directory/etcd_test_env.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "base/clock.h"
#include "host-backend/directory/etcd_client.h"

namespace vsocket::directory {
namespace {

// A port nothing listens on now (the kernel's pick; another process could
// take it before etcd binds it, which Start reports).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

}  // namespace

std::string EtcdTestServer::Binary() {
  const char* env = std::getenv("VSOCKET_ETCD");
  std::string path = env != nullptr && *env != '\0' ? env : "/usr/bin/etcd";
  return access(path.c_str(), X_OK) == 0 ? path : "";
}

EtcdTestServer::~EtcdTestServer() {
  Kill();
  if (!dir_.empty()) {
    std::string cmd = "rm -rf '" + dir_ + "'";
    (void)std::system(cmd.c_str());
  }
}

Status EtcdTestServer::Start() {
  std::string bin = Binary();
  if (bin.empty()) return Status(Code::kNotFound, "no etcd binary");
  if (running()) return Status(Code::kFailedPrecondition, "etcd already running");
  if (dir_.empty()) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string templ = std::string(tmp != nullptr ? tmp : "/tmp") + "/etcd.XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) return Status::FromErrno("mkdtemp " + templ);
    dir_ = buf.data();
    client_port_ = FreePort();
    peer_port_ = FreePort();
    if (client_port_ == 0 || peer_port_ == 0 || client_port_ == peer_port_)
      return Status(Code::kUnavailable, "no free ports");
  }
  std::string client = (tls_ ? "https://" : "http://") + endpoint();
  std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
  std::vector<std::string> args = {bin,
                                   "--name=test",
                                   "--data-dir=" + dir_ + "/data",
                                   "--listen-client-urls=" + client,
                                   "--advertise-client-urls=" + client,
                                   "--listen-peer-urls=" + peer,
                                   "--initial-advertise-peer-urls=" + peer,
                                   "--initial-cluster=test=" + peer,
                                   "--logger=zap",
                                   "--log-level=warn"};
  args.insert(args.end(), extra_args_.begin(), extra_args_.end());
  std::string log = dir_ + "/etcd.log";
  pid_t pid = fork();
  if (pid < 0) return Status::FromErrno("fork");
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  pid_ = pid;
  EtcdClient probe({tls_ ? "localhost:" + std::to_string(client_port_) : endpoint()}, probe_);
  for (int64_t deadline = MonotonicMs() + 15000; MonotonicMs() < deadline;) {
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return Status(Code::kUnavailable, "etcd exited at start (see " + log + ")");
    }
    auto answer = probe.GetPrefix("/probe");
    if (answer.ok() || answer.status().code() == Code::kPermissionDenied) return Status::Ok();
    usleep(50 * 1000);
  }
  Kill();
  return Status(Code::kDeadlineExceeded, "etcd did not answer within 15 s (see " + log + ")");
}

void EtcdTestServer::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {}
  pid_ = -1;
}

}  // namespace vsocket::directory
