// A real etcd for tests: one member on 127.0.0.1, free ports, a temporary
// data directory; killed by PID (SIGKILL) and started again on the same
// ports and data. Every wait is bounded.
#pragma once

#include <arpa/inet.h>
#include <sys/types.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "host-backend/directory/etcd_client.h"
#include "proto/control.h"

namespace vsocket::directory {

// Polls `done` every 20 ms for up to `ms`; its last answer.
template <typename Fn>
bool Eventually(Fn done, int ms) {
  for (int64_t deadline = MonotonicMs() + ms; MonotonicMs() < deadline; usleep(20 * 1000))
    if (done()) return true;
  return done();
}

// An IPv4 endpoint (port 0) from its dotted text.
inline proto::Endpoint V4(const char* a) {
  proto::Endpoint e;
  inet_pton(AF_INET, a, e.addr.data());
  return e;
}

class EtcdTestServer {
 public:
  // The etcd binary ($VSOCKET_ETCD, else /usr/bin/etcd), or "" if missing.
  static std::string Binary();

  EtcdTestServer() = default;
  ~EtcdTestServer();  // kills it and removes the data directory
  EtcdTestServer(const EtcdTestServer&) = delete;
  EtcdTestServer& operator=(const EtcdTestServer&) = delete;

  // More command-line flags (--auth-token-ttl=1, TLS files), from the next
  // Start on.
  void set_extra_args(std::vector<std::string> args) { extra_args_ = std::move(args); }
  // Serves clients over https (the TLS files among the extra args); Start
  // probes it at localhost:PORT with `probe` (a client certificate if etcd
  // asks for one).
  void set_tls(EtcdClientOptions probe) {
    tls_ = true;
    probe_ = std::move(probe);
  }
  // A member of a cluster (EtcdTestCluster): its name, the cluster's
  // --initial-cluster, and the ports it listens on. Before the first Start.
  void set_member(std::string name, std::string initial_cluster, int client_port, int peer_port) {
    name_ = std::move(name);
    initial_cluster_ = std::move(initial_cluster);
    client_port_ = client_port;
    peer_port_ = peer_port;
  }
  // Starts it (the first time: a data directory, and new ports unless
  // set_member gave them) and, if `wait`, waits up to 15 s for it to answer
  // (a refusal by its auth is an answer).
  Status Start(bool wait = true);
  // SIGKILL, and waits for it to be gone.
  void Kill();
  bool running() const { return pid_ > 0; }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }
  int port() const { return client_port_; }

 private:
  pid_t pid_ = -1;
  int client_port_ = 0, peer_port_ = 0;
  std::string dir_;
  std::vector<std::string> extra_args_;
  std::string name_ = "test";
  std::string initial_cluster_;  // "" : this member alone
  bool tls_ = false;
  EtcdClientOptions probe_ = EtcdClientOptions::Timeouts(500, 200, 500);
};

// A cluster of `members` etcd members on 127.0.0.1 (free ports, a data
// directory each), for the fault cases: a member killed (SIGKILL) and
// started again on its ports and data.
class EtcdTestCluster {
 public:
  explicit EtcdTestCluster(int members = 3);
  // Starts every member and waits up to 20 s for the cluster to take a write.
  Status Start();
  void Kill(int member) { members_[member]->Kill(); }
  Status Restart(int member) { return members_[member]->Start(false); }
  std::vector<std::string> endpoints() const;

 private:
  std::vector<std::unique_ptr<EtcdTestServer>> members_;
};

}  // namespace vsocket::directory
