// The cluster directory's keys and values in etcd (docs/multi-host.md,
// "The etcd directory"):
//
//   PREFIX<host>            {"fabric_address":"ADDR:PORT","fabrics":["tcp"]}
//   PREFIX<host>/vms/<vm>   {"tenant":7,"addresses":["198.51.100.1","198.51.100.0/28"]}
//
// PREFIX is "/vsocket/hosts/" by default. Every key lives under the lease of
// the host that wrote it. The host an address runs on is the <host> of its
// key, never a field of the value: a host writes only under its own name, so
// it can place addresses only on itself.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace vsocket::directory {

inline constexpr char kDefaultPrefix[] = "/vsocket/hosts/";

struct HostRecord {
  std::string fabric_address;        // its peer_listen
  std::vector<std::string> fabrics;  // "tcp", "rdma"
};

struct VmRecord {
  uint32_t tenant = 0;
  std::vector<std::string> addresses;  // ADDRESS[/PREFIX] each
};

std::string HostKey(const std::string& prefix, const std::string& host);
std::string VmKey(const std::string& prefix, const std::string& host, const std::string& vm);

// What a key under `prefix` names: a host record (vm empty) or a VM's.
// False for a key of another shape (or a host or VM name with '/' or
// blanks in it).
struct KeyName {
  std::string host;
  std::string vm;
};
bool ParseKey(const std::string& prefix, const std::string& key, KeyName* name);

std::string EncodeHost(const HostRecord& r);
std::string EncodeVm(const VmRecord& r);
Result<HostRecord> DecodeHost(const std::string& json);
Result<VmRecord> DecodeVm(const std::string& json);

}  // namespace vsocket::directory
