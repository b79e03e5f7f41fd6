// The daemon's local control socket (for vsocketctl and tests): one request
// line per connection, one response, then close. Its own thread, blocking in
// poll (no spinning).
#pragma once

#include <functional>
#include <string>
#include <thread>

#include "base/status.h"
#include "base/unique_fd.h"

namespace vsocket::backend {

class CtlServer {
 public:
  // handler(command line) -> response text.
  using Handler = std::function<std::string(const std::string&)>;

  ~CtlServer();
  Status Start(const std::string& path, Handler handler);
  void Stop();

 private:
  void Run();

  std::string path_;
  Handler handler_;
  UniqueFd listen_;
  UniqueFd stop_;
  std::thread thread_;
};

}  // namespace vsocket::backend
