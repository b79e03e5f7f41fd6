// The cluster directory's keys and values in etcd (docs/multi-host.md,
// "The etcd directory"):
//
//   PREFIX<host>                        {"fabric_address":"ADDR:PORT","fabrics":["tcp"]}
//   TENANTS<tenant>/<host>/<vm>         {"tenant":7,"addresses":["198.51.100.1","198.51.100.0/28"]}
//
// PREFIX is "/vsocket/hosts/" and TENANTS "/vsocket/tenants/" by default.
// VM records are keyed by tenant first, so that a host watches only the
// tenants it serves (decision 103). Every key lives under the lease of the
// host that wrote it. The host an address runs on is the <host> of its key,
// never a field of the value: a host writes only under its own name (etcd
// RBAC, decision 86), so it can place addresses only on itself, and only in
// the tenants the operator granted it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace vsocket::directory {

inline constexpr char kDefaultPrefix[] = "/vsocket/hosts/";
inline constexpr char kDefaultTenantPrefix[] = "/vsocket/tenants/";

struct HostRecord {
  std::string fabric_address;        // its peer_listen
  std::vector<std::string> fabrics;  // "tcp", "rdma"
};

struct VmRecord {
  uint32_t tenant = 0;
  std::vector<std::string> addresses;  // ADDRESS[/PREFIX] each
};

std::string HostKey(const std::string& prefix, const std::string& host);
// TENANTS<tenant>/: every VM record of `tenant` (what a host serving it
// watches).
std::string TenantPrefix(const std::string& tenant_prefix, uint32_t tenant);
std::string VmKey(const std::string& tenant_prefix, uint32_t tenant, const std::string& host, const std::string& vm);

// What a key names: a host record (under `prefix`: tenant 0, vm empty) or a
// VM's (under `tenant_prefix`). False for a key of another shape (or a host
// or VM name with '/' or blanks in it, a tenant that is not a number from 1
// to 2^32-1 written plainly).
struct KeyName {
  uint32_t tenant = 0;
  std::string host;
  std::string vm;
};
bool ParseKey(const std::string& prefix, const std::string& key, KeyName* name);
bool ParseVmKey(const std::string& tenant_prefix, const std::string& key, KeyName* name);

std::string EncodeHost(const HostRecord& r);
std::string EncodeVm(const VmRecord& r);
Result<HostRecord> DecodeHost(const std::string& json);
Result<VmRecord> DecodeVm(const std::string& json);

}  // namespace vsocket::directory
