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
// the key PREFIX<host> and on the keys under PREFIX<host>/, read on every
// key under PREFIX. `root`: a client of the root user (or any before auth is
// on). Also right for a host that authenticates with a certificate (etcd
// ignores the password then).
Status GrantHost(EtcdClient& root, const std::string& prefix, const std::string& host, const std::string& password);

}  // namespace vsocket::directory
