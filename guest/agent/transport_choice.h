// Which transport libvsocket.so's session stands on, chosen at run time
// (decision 108): one library for process mode and VMs.
//
// The configured socket (VSOCKET_SOCKET, else /etc/vsocket/vsocket.conf's
// SOCKET, else kDefaultAgentSocket) is tried as vsocket-guestd's: the agent
// listens with SOCK_SEQPACKET, vsocketd's vhost-user port with SOCK_STREAM,
// and the kernel refuses a SOCK_SEQPACKET connect to a stream socket with
// EPROTOTYPE before the listener sees anything. So:
//   - connected: the agent (VM mode), the grant comes on that connection;
//   - EPROTOTYPE: vsocketd's port (process mode), as before;
//   - anything else at a configured path: process mode as before (its
//     messages say why it cannot connect, its retries find an agent that
//     comes later too);
//   - anything else at the default path: neither; kernel TCP with the
//     reason (backend-unavailable) and what was looked for.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "base/unique_fd.h"
#include "guest/core/transport.h"

namespace vsocket::agent {

enum class TransportKind : uint8_t {
  kAgent,    // vsocket-guestd inside a VM (agent_transport.h)
  kProcess,  // vsocketd's vhost-user port (guest/core/process_transport.h)
  kNone,     // neither reachable: kernel TCP
};
const char* ToString(TransportKind k);

struct TransportChoice {
  TransportKind kind = TransportKind::kNone;
  UniqueFd agent;  // kAgent: connected to the agent, its grant on the way
  Status why;      // kNone: why neither (kUnavailable, kPermissionDenied)
};

// `path_is_default`: nothing configured it (GuestConfig::socket_is_default).
TransportChoice ChooseTransport(const std::string& path, bool path_is_default);

// The library's transport factory (guest::SetTransportFactory): the choice
// above for guest::Config()'s socket, then that transport opened.
Result<std::unique_ptr<guest::Transport>> OpenChosenTransport();

}  // namespace vsocket::agent
