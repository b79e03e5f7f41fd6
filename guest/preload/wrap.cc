// libvsocket.so's start-up and the state every wrapper consults (wrap.h):
// the re-entry guard, the owning process, the vfork() trampoline.
#include "guest/preload/wrap.h"

#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <cstdlib>

#include "base/own_fd.h"
#include "guest/core/config.h"
#include "guest/core/fd_table.h"
#include "guest/core/fork.h"
#include "guest/core/poll_ops.h"
#include "guest/core/report.h"
#include "guest/core/resync.h"
#include "guest/core/session.h"
#include "guest/core/writer.h"
#include "guest/sys/libc.h"

using namespace vsocket::guest;
using namespace vsocket::guest::preload;

// vfork() as the application calls it: marks the calling thread, then
// jumps to libc's vfork with the caller's stack untouched (a wrapper with a
// frame of its own would have that frame reused by the child and then
// returned through by the parent). Both return straight to the caller.
extern "C" {
__attribute__((visibility("hidden"))) __thread bool vsocket_t_vforked = false;
__attribute__((visibility("hidden"))) void* vsocket_real_vfork = nullptr;
}
#if defined(__x86_64__)
asm(R"(
  .text
  .globl vfork
  .type vfork, @function
vfork:
  movq vsocket_t_vforked@gottpoff(%rip), %rax
  movb $1, %fs:(%rax)
  jmpq *vsocket_real_vfork(%rip)
  .size vfork, .-vfork
)");
#endif

namespace vsocket::guest::preload {

constinit thread_local int t_depth = 0;

std::atomic<pid_t> g_pid{0};

}  // namespace vsocket::guest::preload

namespace {

__attribute__((constructor)) void Init() {
  // The library's own fds are numbered high and left alone by the
  // program's close() calls (base/own_fd.h, close() in fd_lifecycle.cc).
  vsocket::ProtectOwnFds();
  g_pid.store(getpid());
  vsocket_real_vfork = dlsym(RTLD_NEXT, "vfork");
  Libc();
  // Read the settings now: servers such as nginx clear the environment
  // before their workers do any I/O.
  Config();
  Session::SetLinkLostHandler(StartResync);
  // The child's only thread is not inside any of our wrappers, whatever the
  // forking thread's state was (a fork from a signal handler that
  // interrupted a wrapper would otherwise leave the guard set for good).
  pthread_atfork([] {
    LeaveRingsBeforeFork();  // (decision 85)
    EpollSettleAll();  // the child shares the epoll objects
    BeforeFork();
  }, AfterForkInParent, [] {
    t_depth = 0;
    g_pid.store(getpid());
    AfterForkInChild();
  });
  atexit([] {
    FinishLingersAtExit();
    ReportAll("exit");
  });
  ReportOnTerminatingSignals();
}

}  // namespace
