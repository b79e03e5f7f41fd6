// libFuzzer target for the static locator file an operator writes
// (StaticLocator::Parse, as StaticLocator::Load runs it on the file's
// text), then lookups in what it accepted.
// Properties: no crash, no leak, no hang; parsing is deterministic (the
// same text gives the same entries and the same answers); a lookup finds a
// host only for a tenant that some line names.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "host-backend/fabric/locator.h"

namespace {

using vsocket::fabric::StaticLocator;
using vsocket::proto::Endpoint;
using vsocket::proto::Family;

// Addresses to look up: fixed ones near the seeds' ranges, and one made of
// the input's first bytes.
std::vector<Endpoint> Probes(const uint8_t* data, size_t size) {
  std::vector<Endpoint> probes;
  Endpoint v4{Family::kIpv4, {198, 51, 100, 21}, 0};
  Endpoint v6{Family::kIpv6, {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x21}, 0};
  probes.push_back(v4);
  probes.push_back(v6);
  Endpoint raw4{Family::kIpv4, {}, 0}, raw6{Family::kIpv6, {}, 0};
  std::memcpy(raw4.addr.data(), data, std::min<size_t>(size, 4));
  std::memcpy(raw6.addr.data(), data, std::min<size_t>(size, 16));
  probes.push_back(raw4);
  probes.push_back(raw6);
  return probes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto a = StaticLocator::Parse(text, "fuzz");
  auto b = StaticLocator::Parse(text, "fuzz");
  if (a.ok() != b.ok()) std::abort();
  if (!a.ok()) {
    if (a.status().message() != b.status().message()) std::abort();
    return 0;
  }
  if ((*a)->size() != (*b)->size()) std::abort();
  for (const Endpoint& e : Probes(data, size)) {
    for (uint32_t tenant : {1u, 7u, 8u, 0xffffffffu}) {
      std::string host = (*a)->Find(tenant, e);
      if (host != (*b)->Find(tenant, e)) std::abort();
      if (!host.empty() && text.find(std::to_string(tenant)) == std::string::npos) std::abort();
    }
  }
  return 0;
}
