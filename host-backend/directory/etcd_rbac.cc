#include "host-backend/directory/etcd_rbac.h"

#include <nlohmann/json.hpp>

#include "host-backend/directory/records.h"

namespace vsocket::directory {
namespace {

using Json = nlohmann::json;

// One permission of `role`: on `key` alone, or with `prefix` on every key
// that starts with it.
Status Grant(EtcdClient& root, const std::string& role, const char* type, const std::string& key, bool prefix) {
  Json perm = {{"permType", type}, {"key", Base64(key)}};
  if (prefix) perm["range_end"] = Base64(PrefixEnd(key));
  return root.Admin("/v3/auth/role/grant", Json{{"name", role}, {"perm", perm}}.dump());
}

}  // namespace

std::string HostRole(const std::string& host) { return "vsocket-host-" + host; }

Status EnableAuth(EtcdClient& client, const std::string& root_password) {
  VS_RETURN_IF_ERROR(client.Admin("/v3/auth/role/add", Json{{"name", "root"}}.dump()));
  VS_RETURN_IF_ERROR(client.Admin("/v3/auth/user/add", Json{{"name", "root"}, {"password", root_password}}.dump()));
  VS_RETURN_IF_ERROR(client.Admin("/v3/auth/user/grant", Json{{"user", "root"}, {"role", "root"}}.dump()));
  return client.Admin("/v3/auth/enable", "{}");
}

Status GrantHost(EtcdClient& root, const std::string& prefix, const std::string& host, const std::string& password) {
  if (host.empty() || host.find_first_of("/ \t\n") != std::string::npos)
    return Status(Code::kInvalidArgument, "host name '" + host + "' is not a directory key's name");
  const std::string role = HostRole(host);
  VS_RETURN_IF_ERROR(root.Admin("/v3/auth/role/add", Json{{"name", role}}.dump()));
  // Its host record (the key alone: a prefix would take in every host whose
  // name starts with this one); its VMs' records are per tenant (GrantTenant).
  VS_RETURN_IF_ERROR(Grant(root, role, "READWRITE", HostKey(prefix, host), false));
  VS_RETURN_IF_ERROR(Grant(root, role, "READ", prefix, true));  // (every host record: its peers)
  VS_RETURN_IF_ERROR(root.Admin("/v3/auth/user/add", Json{{"name", host}, {"password", password}}.dump()));
  return root.Admin("/v3/auth/user/grant", Json{{"user", host}, {"role", role}}.dump());
}

Status GrantTenant(EtcdClient& root, const std::string& tenant_prefix, const std::string& host, uint32_t tenant) {
  if (host.empty() || host.find_first_of("/ \t\n") != std::string::npos)
    return Status(Code::kInvalidArgument, "host name '" + host + "' is not a directory key's name");
  if (tenant == 0) return Status(Code::kInvalidArgument, "tenant 0");
  const std::string role = HostRole(host);
  // (The trailing slashes: tenant 1's prefix is not tenant 10's, hostA's
  // not hostAB's.)
  VS_RETURN_IF_ERROR(Grant(root, role, "READWRITE", TenantPrefix(tenant_prefix, tenant) + host + "/", true));
  return Grant(root, role, "READ", TenantPrefix(tenant_prefix, tenant), true);
}

}  // namespace vsocket::directory
