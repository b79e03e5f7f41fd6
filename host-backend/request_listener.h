// Answers one short request per connection on an already listening socket:
// reads until `terminator` (bounded in size and time), writes the reply,
// closes. Its own thread, blocking in poll (never spinning). Shared by the
// control socket and the metrics endpoint.
#pragma once

#include <functional>
#include <string>
#include <thread>

#include "base/status.h"
#include "base/unique_fd.h"

namespace vsocket::backend {

struct RequestLimits {
  std::string terminator;  // the request is complete once this arrives
  size_t max_bytes;        // a longer request is answered as it stands
  int read_timeout_ms;     // a client that stalls this long is answered as it stands
};

class RequestListener {
 public:
  // respond(request, including the terminator if it came) -> reply.
  using Responder = std::function<std::string(const std::string&)>;

  ~RequestListener();
  Status Start(UniqueFd listening, RequestLimits limits, Responder respond);
  void Stop();

 private:
  void Run();
  void Serve(int fd);

  RequestLimits limits_;
  Responder respond_;
  UniqueFd listen_;
  UniqueFd stop_;
  std::thread thread_;
};

}  // namespace vsocket::backend
