// Errors at the socket boundary: a Status carrying the errno the libc
// wrapper sets (guest/preload/ (wrap.h, a file per call family)).
#pragma once

#include <signal.h>
#include <sys/socket.h>

#include "base/status.h"

namespace vsocket::guest {

inline Status Errno(int e, const char* what) { return Status(Code::kInternal, what, e); }

// EPIPE, with SIGPIPE unless MSG_NOSIGNAL, as the kernel's send does.
inline Status BrokenPipe(int flags, const char* why) {
  if (!(flags & MSG_NOSIGNAL)) raise(SIGPIPE);
  return Errno(EPIPE, why);
}

}  // namespace vsocket::guest
