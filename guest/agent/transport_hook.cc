// Makes a library build talk to vsocket-guestd instead of being its own
// vhost-user frontend: the session's transport factory (transport.h) opens
// AgentTransport at VSOCKET_SOCKET (the agent's socket inside the VM).
// Linked into libvsocket-vm.so (the VM build of the library) only.
#include "guest/agent/agent_transport.h"
#include "guest/core/config.h"

namespace vsocket::agent {
namespace {

Result<std::unique_ptr<guest::Transport>> OpenAgentTransport() {
  return AgentTransport::Open(guest::Config().socket_path);
}

// (Only stores a function pointer: safe before anything else is set up.)
__attribute__((constructor)) void InstallAgentTransport() { guest::SetTransportFactory(&OpenAgentTransport); }

}  // namespace
}  // namespace vsocket::agent
