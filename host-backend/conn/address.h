// Which addresses a VM may speak for.
#pragma once

#include "proto/control.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {

bool IsLoopback(const proto::Endpoint& e);
// Whether `e` is one of the VM's own addresses (or loopback, always its own).
bool AddressAllowed(const vhost::PortConfig& port, const proto::Endpoint& e);

}  // namespace vsocket::backend
