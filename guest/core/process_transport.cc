#include "guest/core/process_transport.h"

#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

#include "guest/core/config.h"

namespace vsocket::guest {
namespace {

constexpr uint16_t kQueueSize = 256;

// Why this process may not connect to the socket at `path`, and what would
// let it: the socket's owner, group and mode against our uid and groups.
std::string PermissionHint(const std::string& path) {
  struct stat st{};
  std::string out = "no permission to connect to vsocketd at " + path;
  if (stat(path.c_str(), &st) != 0) return out;
  struct group g{};
  struct group* found = nullptr;
  std::vector<char> buf(4096);
  if (getgrgid_r(st.st_gid, &g, buf.data(), buf.size(), &found) != 0) found = nullptr;
  std::string gname = found != nullptr ? found->gr_name : std::to_string(st.st_gid);
  char line[256];
  snprintf(line, sizeof(line), " (owner uid %u, group %s, mode %04o; this process: uid %u, gid %u)",
           static_cast<unsigned>(st.st_uid), gname.c_str(), static_cast<unsigned>(st.st_mode & 07777),
           static_cast<unsigned>(geteuid()), static_cast<unsigned>(getegid()));
  out += line;
  if (st.st_mode & S_IWGRP)
    out += ": add this user to group " + gname;
  else
    out += ": ask the operator to set `group = GROUP` for this VM in vsocketd.conf (docs/operator-guide.md)";
  return out;
}

std::atomic<TransportFactory> g_factory{nullptr};

}  // namespace

Result<std::unique_ptr<Transport>> ProcessTransport::Open() {
  const GuestConfig& cfg = Config();
  vhost::FrontendOptions o;
  o.socket_path = cfg.socket_path;
  o.num_queues = 2;
  o.queue_size = kQueueSize;
  o.region_bytes = cfg.region_bytes;
  o.timeout_ms = 2000;
  // A backend that is not there (stopped, restarting: no socket, or nobody
  // listening) is not waited for: the application's call that asked goes on
  // on kernel TCP now, and a later call tries again (50 ms, backing off to
  // 1 s). Waiting here stalled the application's I/O 2 s per attempt.
  o.connect_wait_ms = 0;
  auto fe = vhost::VhostUserFrontend::Create(o);
  if (!fe.ok()) return fe.status();
  Status st = (*fe)->Connect();
  if (st.code() == Code::kPermissionDenied) return Status(Code::kPermissionDenied, PermissionHint(cfg.socket_path));
  if (!st.ok()) return st;
  return std::unique_ptr<Transport>(new ProcessTransport(std::move(fe).value()));
}

void SetTransportFactory(TransportFactory f) { g_factory.store(f, std::memory_order_release); }

Result<std::unique_ptr<Transport>> OpenTransport() {
  if (TransportFactory f = g_factory.load(std::memory_order_acquire)) return f();
  return ProcessTransport::Open();
}

}  // namespace vsocket::guest
