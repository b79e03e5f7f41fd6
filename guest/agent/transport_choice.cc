#include "guest/agent/transport_choice.h"

#include <cerrno>
#include <cstring>

#include "base/log.h"
#include "guest/agent/agent_transport.h"
#include "guest/core/config.h"
#include "guest/core/process_transport.h"

namespace vsocket::agent {

const char* ToString(TransportKind k) {
  switch (k) {
    case TransportKind::kAgent: return "agent";
    case TransportKind::kProcess: return "process";
    case TransportKind::kNone: return "none";
  }
  return "?";
}

TransportChoice ChooseTransport(const std::string& path, bool path_is_default) {
  TransportChoice c;
  if (path.empty()) {
    c.why = Status(Code::kUnavailable, "VSOCKET_SOCKET is empty: acceleration off");
    return c;
  }
  int err = 0;
  auto sock = AgentTransport::Connect(path, &err);
  if (sock.ok()) {
    c.kind = TransportKind::kAgent;
    c.agent = std::move(sock).value();
    return c;
  }
  // A stream socket: vsocketd's port, which saw nothing of this attempt.
  // At a path the user configured, anything else is left to process mode
  // as before (its own messages, its own permission hint).
  if (err == EPROTOTYPE || !path_is_default) {
    c.kind = TransportKind::kProcess;
    return c;
  }
  if (err == EACCES || err == EPERM) {
    c.why = Status(Code::kPermissionDenied, "no permission to connect to vsocket-guestd at " + path +
                                                " (the agent serves root's processes only; docs/vm-mode.md)");
    return c;
  }
  c.why = Status(Code::kUnavailable, std::string("VSOCKET_SOCKET not set and no vsocket-guestd at ") + path + " (" +
                                         (err != 0 ? strerror(err) : sock.status().message().c_str()) +
                                         "): set VSOCKET_SOCKET to vsocketd's port (process mode) or start the "
                                         "agent (in a VM)");
  return c;
}

Result<std::unique_ptr<guest::Transport>> OpenChosenTransport() {
  const guest::GuestConfig& cfg = guest::Config();
  TransportChoice c = ChooseTransport(cfg.socket_path, cfg.socket_is_default);
  switch (c.kind) {
    case TransportKind::kAgent: {
      auto t = AgentTransport::OpenConnected(std::move(c.agent), cfg.socket_path);
      if (t.ok()) VS_LOG(kInfo, "session through vsocket-guestd at %s (VM mode)", cfg.socket_path.c_str());
      return t;
    }
    case TransportKind::kProcess:
      return guest::ProcessTransport::Open();
    case TransportKind::kNone:
      break;
  }
  return c.why;
}

}  // namespace vsocket::agent
