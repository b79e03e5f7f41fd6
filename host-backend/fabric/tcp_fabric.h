// The tcp fabric: StreamLink over one kernel TCP connection per peer host.
#pragma once

#include <optional>
#include <utility>

#include "base/status.h"

namespace vsocket::fabric {

// Makes a connected TCP socket fit for a link: non-blocking, TCP_NODELAY
// (a lone small frame on an idle link must go at once; batching is ours),
// keepalive (a dead peer host is noticed), larger buffers.
Status ConfigureLinkSocket(int fd);

// Two connected, configured sockets over 127.0.0.1 (tests only).
std::optional<std::pair<int, int>> ConnectedTcpPairForTest();

}  // namespace vsocket::fabric
