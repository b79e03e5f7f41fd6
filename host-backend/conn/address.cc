// Which addresses a VM may speak for.
#include "host-backend/conn/address.h"

#include <cstring>

namespace vsocket::backend {

bool IsLoopback(const proto::Endpoint& e) {
  if (e.family == proto::Family::kIpv4) return e.addr[0] == 127;
  static const uint8_t kV6Loop[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  return std::memcmp(e.addr.data(), kV6Loop, 16) == 0;
}

bool AddressAllowed(const vhost::PortConfig& port, const proto::Endpoint& e) {
  if (IsLoopback(e)) return true;  // a VM's own loopback is always its own
  for (const vhost::VmAddress& a : port.addresses)
    if (a.family == static_cast<uint8_t>(e.family) && a.addr == e.addr) return true;
  return false;
}

}  // namespace vsocket::backend
