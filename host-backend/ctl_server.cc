#include "host-backend/ctl_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "base/unix_addr.h"

namespace vsocket::backend {

CtlServer::~CtlServer() { Stop(); }

Status CtlServer::Start(const std::string& path, Handler handler) {
  path_ = path;
  UniqueFd s(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) return Status::FromErrno("ctl socket");
  auto addr = UnixAddress(path, "ctl socket");
  if (!addr.ok()) return addr.status();
  unlink(path.c_str());
  if (bind(s.get(), AsSockaddr(*addr), sizeof(*addr)) != 0) return Status::FromErrno("bind " + path);
  chmod(path.c_str(), 0660);  // operators only (root and the vsocket group)
  if (listen(s.get(), 16) != 0) return Status::FromErrno("listen " + path);
  // One short command line; a client that stalls gets dropped after 1 s.
  return listener_.Start(std::move(s), {"\n", 4096, 1000},
                         [handler](const std::string& req) { return handler(req.substr(0, req.find('\n'))); });
}

void CtlServer::Stop() {
  listener_.Stop();
  if (!path_.empty()) unlink(path_.c_str());
}

}  // namespace vsocket::backend
