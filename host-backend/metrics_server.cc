#include "host-backend/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

namespace vsocket::backend {

MetricsServer::~MetricsServer() { Stop(); }

Status MetricsServer::Start(const std::string& addr, int port, std::function<std::string()> render) {
  UniqueFd s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) return Status::FromErrno("metrics socket");
  int one = 1;
  setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, addr.c_str(), &a.sin_addr) != 1)
    return Status(Code::kInvalidArgument, "bad metrics address " + addr);
  if (bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
    return Status::FromErrno("bind metrics " + addr + ":" + std::to_string(port));
  if (listen(s.get(), 16) != 0) return Status::FromErrno("listen metrics");
  return listener_.Start(std::move(s), {"\r\n\r\n", 8192, 2000}, [render](const std::string& req) {
    bool ok = req.rfind("GET /metrics ", 0) == 0 || req.rfind("GET /metrics?", 0) == 0;
    std::string body = ok ? render() : "not found: try /metrics\n";
    return std::string("HTTP/1.1 ") + (ok ? "200 OK" : "404 Not Found") +
           "\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\nConnection: close\r\n\r\n" + body;
  });
}

void MetricsServer::Stop() { listener_.Stop(); }

}  // namespace vsocket::backend
