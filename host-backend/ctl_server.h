// The daemon's local control socket (for vsocketctl and tests): one request
// line per connection, one response, then close.
#pragma once

#include <functional>
#include <string>

#include "base/status.h"
#include "host-backend/request_listener.h"

namespace vsocket::backend {

class CtlServer {
 public:
  // handler(command line) -> response text.
  using Handler = std::function<std::string(const std::string&)>;

  ~CtlServer();
  Status Start(const std::string& path, Handler handler);
  void Stop();

 private:
  std::string path_;
  RequestListener listener_;
};

}  // namespace vsocket::backend
