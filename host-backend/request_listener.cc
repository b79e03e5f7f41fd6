#include "host-backend/request_listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

namespace vsocket::backend {

RequestListener::~RequestListener() { Stop(); }

Status RequestListener::Start(UniqueFd listening, RequestLimits limits, Responder respond) {
  listen_ = std::move(listening);
  limits_ = std::move(limits);
  respond_ = std::move(respond);
  stop_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop_) return Status::FromErrno("eventfd");
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void RequestListener::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  (void)!write(stop_.get(), &one, sizeof(one));
  thread_.join();
}

void RequestListener::Run() {
  for (;;) {
    pollfd p[2] = {{listen_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents) return;
    UniqueFd c(accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (c) Serve(c.get());
  }
}

void RequestListener::Serve(int fd) {
  std::string req;
  char buf[1024];
  while (req.find(limits_.terminator) == std::string::npos && req.size() < limits_.max_bytes) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, limits_.read_timeout_ms) <= 0) break;
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    req.append(buf, static_cast<size_t>(n));
  }
  std::string out = respond_(req);
  size_t off = 0;
  while (off < out.size()) {
    ssize_t n = send(fd, out.data() + off, out.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
}

}  // namespace vsocket::backend
