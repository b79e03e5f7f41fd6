// A minimal HTTP listener for Prometheus: GET /metrics returns the text
// exposition, anything else 404. One request per connection.
#pragma once

#include <functional>
#include <string>

#include "base/status.h"
#include "host-backend/request_listener.h"

namespace vsocket::backend {

class MetricsServer {
 public:
  ~MetricsServer();
  Status Start(const std::string& addr, int port, std::function<std::string()> render);
  void Stop();

 private:
  RequestListener listener_;
};

}  // namespace vsocket::backend
