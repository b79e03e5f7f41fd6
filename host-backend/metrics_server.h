// A minimal HTTP listener for Prometheus: GET /metrics returns the text
// exposition, anything else 404. One request per connection, its own thread
// blocking in poll (no spinning), bounded request size and time.
#pragma once

#include <functional>
#include <string>
#include <thread>

#include "base/status.h"
#include "base/unique_fd.h"

namespace vsocket::backend {

class MetricsServer {
 public:
  ~MetricsServer();
  Status Start(const std::string& addr, int port, std::function<std::string()> render);
  void Stop();

 private:
  void Run();
  void Serve(int fd);

  std::function<std::string()> render_;
  UniqueFd listen_;
  UniqueFd stop_;
  std::thread thread_;
};

}  // namespace vsocket::backend
