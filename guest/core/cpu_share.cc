#include "guest/core/cpu_share.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/clock.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {

CpuShare DecideCpuShare(const cpu_set_t& mine, const cpu_set_t& backend) {
  cpu_set_t both;
  CPU_AND(&both, &mine, &backend);
  CpuShare r;
  r.mine = CPU_COUNT(&mine);
  r.shared = CPU_COUNT(&both);
  r.sleep_at_once = r.mine > 0 && r.shared == r.mine && r.mine < kFewCpus;
  return r;
}

bool ProcessCpus(pid_t pid, cpu_set_t* out) {
  CPU_ZERO(out);
  if (pid <= 0) return false;
  bool any = false;
  std::string dir = "/proc/" + std::to_string(pid) + "/task";
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      pid_t tid = static_cast<pid_t>(std::atoi(e->d_name));
      cpu_set_t s;
      if (tid > 0 && sched_getaffinity(tid, sizeof(s), &s) == 0) {
        CPU_OR(out, out, &s);
        any = true;
      }
    }
    closedir(d);
  }
  if (!any && sched_getaffinity(pid, sizeof(*out), out) == 0) any = true;
  return any;
}

CpuShare BackendCpuShare(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  cpu_set_t mine, backend;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || !ProcessCpus(cred.pid, &backend) ||
      sched_getaffinity(0, sizeof(mine), &mine) != 0)
    return CpuShare{};
  return DecideCpuShare(mine, backend);
}

int LoadavgRunning(const char* line) {
  double l1, l5, l15;
  int running, total;
  if (std::sscanf(line, "%lf %lf %lf %d/%d", &l1, &l5, &l15, &running, &total) != 5) return -1;
  return running;
}

bool IdleCpuNow() {
  static const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  thread_local int64_t read_at = 0;
  thread_local bool idle = false;
  int64_t now = MonotonicNs();
  if (read_at != 0 && now - read_at < kIdleCpuRefreshNs) return idle;
  read_at = now;
  idle = false;
  int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return idle;
  char buf[128];
  ssize_t n = Libc().read(fd, buf, sizeof(buf) - 1);
  Libc().close(fd);
  if (n <= 0) return idle;
  buf[n] = '\0';
  idle = IdleCpuFrom(LoadavgRunning(buf), cpus);
  return idle;
}

}  // namespace vsocket::guest
