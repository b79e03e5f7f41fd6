// stdio on a connection: fdopen, dprintf, vdprintf and their fortified
// variants.
//
// glibc's stdio reads, writes and closes a FILE's fd through its internal
// calls, never through ours: a FILE made by fdopen() on a connection would
// read the kernel socket while the bytes come by the ring, write past the
// ring, and fclose() would leave the connection in our tables under a
// closed number. Such a FILE is made with fopencookie() instead, its read,
// write and close going through the wrappers (and fileno() answering the
// fd, as for any FILE); dprintf formats, then writes through write()
// (decision 74).
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "guest/core/fd_table.h"
#include "guest/preload/wrap.h"
#include "guest/sys/libc.h"

using namespace vsocket::guest;
using namespace vsocket::guest::preload;

namespace {

struct ConnCookie {
  int fd;
};

ssize_t CookieRead(void* cookie, char* buf, size_t n) { return read(static_cast<ConnCookie*>(cookie)->fd, buf, n); }

ssize_t CookieWrite(void* cookie, const char* buf, size_t n) {
  int fd = static_cast<ConnCookie*>(cookie)->fd;
  size_t done = 0;
  while (done < n) {
    ssize_t w = write(fd, buf + done, n - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      return done > 0 ? static_cast<ssize_t>(done) : -1;
    }
    done += static_cast<size_t>(w);
  }
  return static_cast<ssize_t>(done);
}

int CookieSeek(void*, off64_t*, int) {
  errno = ESPIPE;
  return -1;
}

int CookieClose(void* cookie) {
  auto* c = static_cast<ConnCookie*>(cookie);
  int r = close(c->fd);
  delete c;
  return r;
}

// Whether fd names a connection this library follows that can carry bytes.
bool CarriesBytes(int fd) {
  if (t_depth || InForeignChild()) return false;
  auto c = Lookup(fd);
  return c && !c->listening.load(std::memory_order_relaxed);
}

// The formatted text goes through write(); returns its length or -1.
int WriteFormatted(int fd, char* text, int len) {
  if (len < 0) return -1;
  ConnCookie cookie{fd};
  ssize_t done = CookieWrite(&cookie, text, static_cast<size_t>(len));
  int saved = errno;
  free(text);
  errno = saved;
  return done == len ? len : -1;
}

}  // namespace

extern "C" {

// (glibc's checked vasprintf: dprintf's _FORTIFY_SOURCE variants keep its
// checks.)
int __vasprintf_chk(char** out, int flag, const char* fmt, va_list ap);

FILE* fdopen(int fd, const char* mode) {
  using Fn = FILE* (*)(int, const char*);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "fdopen"));
  if (!CarriesBytes(fd)) return real(fd, mode);
  if (Libc().fcntl(fd, F_GETFL) < 0) return nullptr;  // (EBADF, as glibc's)
  auto* cookie = new ConnCookie{fd};
  FILE* f = fopencookie(cookie, mode, cookie_io_functions_t{CookieRead, CookieWrite, CookieSeek, CookieClose});
  if (f == nullptr) {
    delete cookie;
    return nullptr;
  }
  f->_fileno = fd;  // fileno() answers the fd (glibc marks a cookie stream -2; any value but -1 is "open")
  return f;
}

int vdprintf(int fd, const char* fmt, va_list ap) {
  using Fn = int (*)(int, const char*, va_list);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "vdprintf"));
  if (!CarriesBytes(fd)) return real(fd, fmt, ap);
  char* text = nullptr;
  int len = vasprintf(&text, fmt, ap);
  return WriteFormatted(fd, text, len);
}

int dprintf(int fd, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = vdprintf(fd, fmt, ap);
  va_end(ap);
  return r;
}

int __vdprintf_chk(int fd, int flag, const char* fmt, va_list ap) {
  using Fn = int (*)(int, int, const char*, va_list);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "__vdprintf_chk"));
  if (!CarriesBytes(fd)) return real(fd, flag, fmt, ap);
  char* text = nullptr;
  int len = __vasprintf_chk(&text, flag, fmt, ap);
  return WriteFormatted(fd, text, len);
}

int __dprintf_chk(int fd, int flag, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = __vdprintf_chk(fd, flag, fmt, ap);
  va_end(ap);
  return r;
}

}  // extern "C"
