// etcd's RBAC for the cluster directory (docs/multi-host.md, "Permissions"):
// one etcd user per host, named as the host (the CN of its certificate, so
// that with client certificates etcd takes the user from the certificate),
// with a role that may write only that host's own keys and read the rest.
// A host's credentials then cannot place anything under another host's
// name: etcd refuses the write, whatever the host's vsocketd was made to do.
//
// These are the calls an operator makes once per host (etcdctl does the
// same: `role grant-permission [--prefix]`); tests and the test beds use
// them through the gateway.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "host-backend/directory/etcd_client.h"

namespace vsocket::directory {

// The role granted to `host`'s user.
std::string HostRole(const std::string& host);

// Creates the root user (with `root_password`) and its role and turns auth
// on. `client` has no user (auth is still off).
Status EnableAuth(EtcdClient& client, const std::string& root_password);

// Adds the user `host` (with `password`) and its role: read and write on
// the key PREFIX<host> (its host record), read on every key under PREFIX
// (the host records: its peers). `root`: a client of the root user (or any
// before auth is on). Also right for a host that authenticates with a
// certificate (etcd ignores the password then).
Status GrantHost(EtcdClient& root, const std::string& prefix, const std::string& host, const std::string& password);

// Lets `host` serve `tenant` (decision 103): read and write on the keys
// under TENANTS<tenant>/<host>/ (its VM records of that tenant), read on
// every key under TENANTS<tenant>/ (where the tenant's other VMs run). The
// operator grants it when a VM of the tenant is first placed on the host;
// without it, the host can neither publish nor follow that tenant.
Status GrantTenant(EtcdClient& root, const std::string& tenant_prefix, const std::string& host, uint32_t tenant);

}  // namespace vsocket::directory
