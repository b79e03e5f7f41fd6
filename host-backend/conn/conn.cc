// ConnKey hashing and connection state names.
#include "host-backend/conn/conn.h"

namespace vsocket::backend {

size_t ConnKeyHash::operator()(const ConnKey& k) const {
  // FNV-1a over the identifying bytes.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* p, size_t n) {
    auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  mix(&k.tenant, 4);
  mix(&k.scope, 4);
  for (const proto::Endpoint* e : {&k.local, &k.peer}) {
    mix(&e->family, 1);
    mix(e->addr.data(), e->addr.size());
    mix(&e->port, 2);
  }
  return static_cast<size_t>(h);
}

const char* ToString(ConnState s) {
  switch (s) {
    case ConnState::kPending: return "kernel";
    case ConnState::kUpgraded: return "accelerated";
    case ConnState::kClosed: return "closed";
  }
  return "?";
}

}  // namespace vsocket::backend
