#include "host-backend/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

namespace vsocket::backend {

MetricsServer::~MetricsServer() { Stop(); }

Status MetricsServer::Start(const std::string& addr, int port, std::function<std::string()> render) {
  render_ = std::move(render);
  listen_.reset(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  stop_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!listen_ || !stop_) return Status::FromErrno("metrics socket");
  int one = 1;
  setsockopt(listen_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, addr.c_str(), &a.sin_addr) != 1)
    return Status(Code::kInvalidArgument, "bad metrics address " + addr);
  if (bind(listen_.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
    return Status::FromErrno("bind metrics " + addr + ":" + std::to_string(port));
  if (listen(listen_.get(), 16) != 0) return Status::FromErrno("listen metrics");
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void MetricsServer::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  (void)!write(stop_.get(), &one, sizeof(one));
  thread_.join();
}

void MetricsServer::Run() {
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

void MetricsServer::Serve(int fd) {
  std::string req;
  char buf[1024];
  while (req.find("\r\n\r\n") == std::string::npos && req.size() < 8192) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 2000) <= 0) return;
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) return;
    req.append(buf, static_cast<size_t>(n));
  }
  bool ok = req.rfind("GET /metrics ", 0) == 0 || req.rfind("GET /metrics?", 0) == 0;
  std::string body = ok ? render_() : "not found: try /metrics\n";
  std::string resp = std::string("HTTP/1.1 ") + (ok ? "200 OK" : "404 Not Found") +
                     "\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  size_t off = 0;
  while (off < resp.size()) {
    ssize_t n = send(fd, resp.data() + off, resp.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

}  // namespace vsocket::backend
