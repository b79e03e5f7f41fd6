#include "base/asym_fence.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace vsocket {

namespace {

long Membarrier(int cmd) { return syscall(__NR_membarrier, cmd, 0, 0); }

// The process that registered (0: not yet asked; -1: cannot). A forked
// child has another pid: it registers again (exec clears a registration).
std::atomic<pid_t> g_ready_pid{0};

// A forked child runs on a copy of the parent's memory: its rings may say
// we promised, so it registers at once (the fast side's light fences rely
// on it), and falls back to full fences on both sides if it cannot.
void RegisterInChild() {
  bool ok = Membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0;
  g_ready_pid.store(ok ? getpid() : -1, std::memory_order_release);
}

}  // namespace

bool AsymFenceReady() {
  pid_t me = getpid();
  pid_t r = g_ready_pid.load(std::memory_order_acquire);
  if (r == me) return true;
  if (r == -1) return false;
  const char* env = getenv("VSOCKET_ASYM_FENCE");
  bool ok = !(env != nullptr && (strcmp(env, "0") == 0 || strcmp(env, "no") == 0 || strcmp(env, "false") == 0));
  long q = ok ? Membarrier(MEMBARRIER_CMD_QUERY) : -1;
  ok = q >= 0 && (q & MEMBARRIER_CMD_GLOBAL_EXPEDITED) && (q & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) &&
       Membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0;
  static std::atomic<bool> atfork{false};
  if (ok && !atfork.exchange(true)) pthread_atfork(nullptr, nullptr, RegisterInChild);
  g_ready_pid.store(ok ? me : -1, std::memory_order_release);
  return ok;
}

void HeavyFence() {
  if (g_ready_pid.load(std::memory_order_acquire) > 0 && Membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0) return;
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

}  // namespace vsocket
