// A Unix-domain socket address for a path, or why it cannot be one (the
// path does not fit sun_path with its terminating NUL).
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <cstring>
#include <string>

#include "base/status.h"

namespace vsocket {

// `what` names the socket in the error: "<what> path too long: <path>".
inline Result<sockaddr_un> UnixAddress(const std::string& path, const char* what = "socket") {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path))
    return Status(Code::kInvalidArgument, std::string(what) + " path too long: " + path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

inline const sockaddr* AsSockaddr(const sockaddr_un& addr) { return reinterpret_cast<const sockaddr*>(&addr); }

}  // namespace vsocket
