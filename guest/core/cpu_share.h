// Whether a blocked call should sleep at once instead of polling first,
// because every CPU this process can run on is also one vsocketd runs on.
//
// A polling waiter only gains if a CPU is free while it polls. When the
// library and vsocketd share a kernel (containers, the test beds) and the
// process has no CPU of its own, just a few that vsocketd's threads also
// use, the CPU a waiter spins on is the one the backend needs to move the
// answer, and polling makes the answer later, not sooner (docs/benchmarks.md:
// cross-host RTT p50 1.1-1.7x kernel TCP polling, 0.7-0.9x sleeping, on 2
// CPUs). If the process has a CPU vsocketd does not use (the operator gave
// vsocketd its own core), or many CPUs, polling stays: there it pays.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <cstdint>

namespace vsocket::guest {

// Fewer CPUs than this, all shared with the backend: sleep at once. With 4
// or more, the two backends' workers and the two ends of a connection (the
// busiest case, a cross-host pair on one machine) each find a CPU.
inline constexpr int kFewCpus = 4;

struct CpuShare {
  int mine = 0;    // CPUs this thread may run on
  int shared = 0;  // of those, CPUs some backend thread may run on too
  bool sleep_at_once = false;
};

// The decision from the two CPU sets.
CpuShare DecideCpuShare(const cpu_set_t& mine, const cpu_set_t& backend);

// The CPUs process `pid` may run on: the union over its threads (false if
// none could be read: the process is not visible from here).
bool ProcessCpus(pid_t pid, cpu_set_t* out);

// Whether a CPU is idle now: the machine's runnable threads, the caller
// among them, are no more than its online CPUs (/proc/loadavg's running
// count, read at most once every kIdleCpuRefreshNs per thread; false if it
// cannot be read). A waiter for a direct pair's peer polls only then where
// the CPUs are few (wait.h: PollBudgetNs, decision 113).
bool IdleCpuNow();
inline constexpr int64_t kIdleCpuRefreshNs = 2'000'000;
// The rule from its two numbers.
inline bool IdleCpuFrom(int running, int cpus) { return running > 0 && cpus > 0 && running <= cpus; }
// The running count of a /proc/loadavg line ("0.52 0.58 0.59 2/458 1234"),
// or -1.
int LoadavgRunning(const char* line);

// The backend at the other end of the unix socket `fd` (SO_PEERCRED) and
// this thread: the decision (sleep_at_once false when the backend is not
// visible, e.g. in another PID namespace).
CpuShare BackendCpuShare(int fd);

}  // namespace vsocket::guest
