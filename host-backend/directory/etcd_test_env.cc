#include "host-backend/directory/etcd_test_env.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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

Status EtcdTestServer::Start(bool wait) {
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
    if (client_port_ == 0) {
      client_port_ = FreePort();
      peer_port_ = FreePort();
    }
    if (client_port_ == 0 || peer_port_ == 0 || client_port_ == peer_port_)
      return Status(Code::kUnavailable, "no free ports");
  }
  std::string client = (tls_ ? "https://" : "http://") + endpoint();
  std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
  std::vector<std::string> args = {bin,
                                   "--name=" + name_,
                                   "--data-dir=" + dir_ + "/data",
                                   "--listen-client-urls=" + client,
                                   "--advertise-client-urls=" + client,
                                   "--listen-peer-urls=" + peer,
                                   "--initial-advertise-peer-urls=" + peer,
                                   "--initial-cluster=" + (initial_cluster_.empty() ? name_ + "=" + peer : initial_cluster_),
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
  if (!wait) return Status::Ok();
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

EtcdTestCluster::EtcdTestCluster(int members) {
  std::vector<int> ports;
  auto fresh = [&] {
    for (int tries = 0; tries < 20; ++tries) {
      int p = FreePort();
      if (p != 0 && std::find(ports.begin(), ports.end(), p) == ports.end()) {
        ports.push_back(p);
        return p;
      }
    }
    return 0;
  };
  std::string cluster;
  std::vector<std::pair<int, int>> member_ports;
  for (int i = 0; i < members; ++i) {
    int client = fresh(), peer = fresh();
    member_ports.emplace_back(client, peer);
    cluster += (i ? "," : "") + std::string("m") + std::to_string(i) + "=http://127.0.0.1:" + std::to_string(peer);
  }
  for (int i = 0; i < members; ++i) {
    members_.push_back(std::make_unique<EtcdTestServer>());
    members_.back()->set_member("m" + std::to_string(i), cluster, member_ports[i].first, member_ports[i].second);
  }
}

Status EtcdTestCluster::Start() {
  for (auto& m : members_) VS_RETURN_IF_ERROR(m->Start(false));
  EtcdClient probe(endpoints(), EtcdClientOptions::Timeouts(500, 200, 500));
  for (int64_t deadline = MonotonicMs() + 20000; MonotonicMs() < deadline; usleep(100 * 1000))
    if (probe.Put("/probe", "1").ok()) return Status::Ok();
  return Status(Code::kDeadlineExceeded, "the etcd cluster took no write within 20 s");
}

std::vector<std::string> EtcdTestCluster::endpoints() const {
  std::vector<std::string> out;
  for (const auto& m : members_) out.push_back(m->endpoint());
  return out;
}

}  // namespace vsocket::directory
