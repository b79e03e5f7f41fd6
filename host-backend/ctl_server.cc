#include "host-backend/ctl_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "base/log.h"

namespace vsocket::backend {

CtlServer::~CtlServer() { Stop(); }

Status CtlServer::Start(const std::string& path, Handler handler) {
  path_ = path;
  handler_ = std::move(handler);
  listen_.reset(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  stop_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!listen_ || !stop_) return Status::FromErrno("ctl socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return Status(Code::kInvalidArgument, "ctl path too long");
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  unlink(path.c_str());
  if (bind(listen_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return Status::FromErrno("bind " + path);
  chmod(path.c_str(), 0660);  // operators only (root and the vsocket group)
  if (listen(listen_.get(), 16) != 0) return Status::FromErrno("listen " + path);
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void CtlServer::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  (void)!write(stop_.get(), &one, sizeof(one));
  thread_.join();
  unlink(path_.c_str());
}

void CtlServer::Run() {
  for (;;) {
    pollfd p[2] = {{listen_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents) return;
    UniqueFd c(accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!c) continue;
    // One short command line; a client that stalls gets dropped after 1 s.
    std::string line;
    char buf[512];
    while (line.find('\n') == std::string::npos && line.size() < 4096) {
      pollfd cp{c.get(), POLLIN, 0};
      if (poll(&cp, 1, 1000) <= 0) break;
      ssize_t n = read(c.get(), buf, sizeof(buf));
      if (n <= 0) break;
      line.append(buf, static_cast<size_t>(n));
    }
    if (auto nl = line.find('\n'); nl != std::string::npos) line.resize(nl);
    std::string out = handler_(line);
    size_t off = 0;
    while (off < out.size()) {
      ssize_t n = send(c.get(), out.data() + off, out.size() - off, MSG_NOSIGNAL);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
  }
}

}  // namespace vsocket::backend
