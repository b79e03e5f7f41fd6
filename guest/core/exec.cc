#include "guest/core/exec.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <unordered_set>

#include "base/log.h"
#include "guest/core/conn_state.h"
#include "guest/core/fd_table.h"
#include "guest/core/registration.h"
#include "guest/core/report.h"
#include "guest/core/resync.h"
#include "guest/core/session.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {

namespace {

bool PreloadsUs(char* const envp[]) {
  for (char* const* e = envp; e != nullptr && *e != nullptr; ++e)
    if (std::strncmp(*e, "LD_PRELOAD=", 11) == 0 && std::strstr(*e + 11, "libvsocket") != nullptr) return true;
  return false;
}

// "local -> peer" of fd, for the log.
std::string AddressText(const Conn& c) {
  auto one = [](const proto::Endpoint& e) {
    char a[INET6_ADDRSTRLEN] = "?";
    inet_ntop(e.family == proto::Family::kIpv6 ? AF_INET6 : AF_INET, e.addr.data(), a, sizeof(a));
    return std::string(a) + ":" + std::to_string(e.port);
  };
  return one(c.local) + " -> " + one(c.peer);
}

}  // namespace

void BeforeExec(const char* program, char* const envp[]) {
  bool preloaded = PreloadsUs(envp);
  // (In a vfork child the parent's session is still there: not ours.)
  Session* mine = Session::Existing();
  if (mine != nullptr && mine->owner_pid() != getpid()) mine = nullptr;
  std::unordered_set<const Conn*> done;
  ForEachConn([&](int fd, Conn& c) {
    int flags = Libc().fcntl(fd, F_GETFD);
    if (flags < 0 || (flags & FD_CLOEXEC) || !done.insert(&c).second) return;  // not passed on
    MutexLock setup(c.setup_mu);
    // Never looked at (e.g. accepted, then handed to a re-executed server):
    // its addresses for the log and the report. Not a connection (a
    // listener, or not connected yet): nothing to say.
    if (c.state.phase() == Phase::kUnprobed && ReadAddresses(fd, c) != Addresses::kRead) return;
    if (mine != nullptr && c.session == mine && c.state.accelerated() && !c.state.reset()) {
      ReportExec(c, program);
      VS_LOG(kWarn, "exec %s: fd %d (%s) was accelerated and cannot go on in the new program: connection reset", program,
             fd, AddressText(c).c_str());
      Aborted(c);         // the peer is told through vsocketd (ECONNRESET there)
      ResetKernel(fd, c);  // and the new program through the kernel
      return;
    }
    ReportExec(c, program);
    if (preloaded)
      VS_LOG(kWarn, "exec %s: fd %d (%s) goes on over kernel TCP in the new program (reason inherited)", program, fd,
             AddressText(c).c_str());
    else
      VS_LOG(kWarn,
             "exec %s: fd %d (%s) goes on over kernel TCP in the new program, whose environment does not preload "
             "libvsocket (reason inherited)",
             program, fd, AddressText(c).c_str());
  });
}

}  // namespace vsocket::guest
