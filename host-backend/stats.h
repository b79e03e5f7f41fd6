// vsocketd's reporting: the control-socket commands and their JSON.
#pragma once

#include <string>

#include "host-backend/control_service.h"
#include "host-backend/worker.h"

namespace vsocket::backend {

// Commands: "stats" (JSON). Unknown commands get {"error": ...}.
std::string HandleCtlCommand(const std::string& command, const ControlService& service,
                             const Worker& worker);

}  // namespace vsocket::backend
