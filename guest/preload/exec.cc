// libvsocket.so's exec family: execve, execv, execvp, execvpe, execveat,
// fexecve, execl, execlp, execle.
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include <vector>

#include "guest/core/exec.h"
#include "guest/core/poll_ops.h"
#include "guest/preload/wrap.h"
#include "guest/sys/libc.h"

using namespace vsocket::guest;
using namespace vsocket::guest::preload;

namespace {

// The exec family: the connections the new program inherits are named
// first, and an accelerated one is reset (guest/core/exec.h). Each variant
// is wrapped: glibc's execl/execvp reach execve internally, not through us.
void NoteExec(const char* program, char* const envp[]) {
  if (t_depth) return;
  Guard g;
  int saved = errno;
  EpollSettleAll();
  BeforeExec(program, envp);
  errno = saved;
}

// The arguments of execl/execlp/execle up to the terminating null pointer.
std::vector<char*> ArgList(const char* arg0, va_list ap) {
  std::vector<char*> v{const_cast<char*>(arg0)};
  if (arg0 != nullptr)
    while (char* a = va_arg(ap, char*)) v.push_back(a);
  v.push_back(nullptr);
  return v;
}

}  // namespace

extern "C" {

// The exec family (NoteExec above).
int execve(const char* path, char* const argv[], char* const envp[]) {
  NoteExec(path, envp);
  return Libc().execve(path, argv, envp);
}

int execv(const char* path, char* const argv[]) {
  NoteExec(path, environ);
  return Libc().execv(path, argv);
}

int execvp(const char* file, char* const argv[]) {
  NoteExec(file, environ);
  return Libc().execvp(file, argv);
}

int execvpe(const char* file, char* const argv[], char* const envp[]) {
  NoteExec(file, envp);
  return Libc().execvpe(file, argv, envp);
}

int execveat(int dirfd, const char* path, char* const argv[], char* const envp[], int flags) {
  NoteExec(path, envp);
  return Libc().execveat(dirfd, path, argv, envp, flags);
}

int fexecve(int fd, char* const argv[], char* const envp[]) {
  char link[64], program[PATH_MAX] = "(fexecve)";
  snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, program, sizeof(program) - 1);
  if (n > 0) program[n] = '\0';
  NoteExec(program, envp);
  return Libc().fexecve(fd, argv, envp);
}

int execl(const char* path, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  std::vector<char*> argv = ArgList(arg, ap);
  va_end(ap);
  NoteExec(path, environ);
  return Libc().execv(path, argv.data());
}

int execlp(const char* file, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  std::vector<char*> argv = ArgList(arg, ap);
  va_end(ap);
  NoteExec(file, environ);
  return Libc().execvp(file, argv.data());
}

int execle(const char* path, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  std::vector<char*> argv = ArgList(arg, ap);
  char* const* envp = va_arg(ap, char* const*);
  va_end(ap);
  NoteExec(path, envp);
  return Libc().execve(path, argv.data(), envp);
}

}  // extern "C"
