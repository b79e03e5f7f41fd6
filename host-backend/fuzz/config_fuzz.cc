// libFuzzer target for vsocketd.conf: ParseConfig on the file's text, then
// what the daemon runs on an accepted configuration (Validate, the peers'
// addresses through ParseHostPort).
// Properties: no crash, no leak, no hang; a configuration Validate accepts
// has a VM, every VM a socket and a tenant, and no two VMs one name.
#include <sys/socket.h>

#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>

#include "base/log.h"
#include "host-backend/config.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vsocket::SetLogLevel(vsocket::LogLevel::kError);  // Validate warns about VMs without addresses
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vsocket::backend;
  auto c = ParseConfig(std::string(reinterpret_cast<const char*>(data), size), "fuzz.conf");
  if (!c.ok()) return 0;
  if (!Validate(&*c).ok()) return 0;
  if (c->vms.empty()) std::abort();
  std::set<std::string> names;
  for (const auto& vm : c->vms) {
    if (vm.path.empty() || vm.tenant_id == 0 || !names.insert(vm.vm_name).second) std::abort();
  }
  for (const PeerHostConfig& p : c->peers) {
    sockaddr_storage ss;
    unsigned len = 0;
    if (ParseHostPort(p.address, &ss, &len).ok() && (len == 0 || len > sizeof(ss))) std::abort();
  }
  return 0;
}
