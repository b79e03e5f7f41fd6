#include "host-backend/directory/records.h"

#include <nlohmann/json.hpp>

namespace vsocket::directory {
namespace {

using Json = nlohmann::json;

bool ValidName(const std::string& s) { return !s.empty() && s.find_first_of("/ \t\r\n") == std::string::npos; }

std::vector<std::string> Strings(const Json& j, const char* name, bool* ok) {
  std::vector<std::string> out;
  auto it = j.find(name);
  if (it == j.end()) return out;
  if (!it->is_array()) {
    *ok = false;
    return out;
  }
  for (const Json& e : *it) {
    if (!e.is_string()) {
      *ok = false;
      return out;
    }
    out.push_back(e.get<std::string>());
  }
  return out;
}

}  // namespace

std::string HostKey(const std::string& prefix, const std::string& host) { return prefix + host; }

std::string TenantPrefix(const std::string& tenant_prefix, uint32_t tenant) {
  return tenant_prefix + std::to_string(tenant) + "/";
}

std::string VmKey(const std::string& tenant_prefix, uint32_t tenant, const std::string& host, const std::string& vm) {
  return TenantPrefix(tenant_prefix, tenant) + host + "/" + vm;
}

bool ParseKey(const std::string& prefix, const std::string& key, KeyName* name) {
  if (key.compare(0, prefix.size(), prefix) != 0) return false;
  name->tenant = 0;
  name->host = key.substr(prefix.size());
  name->vm.clear();
  return ValidName(name->host);
}

bool ParseVmKey(const std::string& tenant_prefix, const std::string& key, KeyName* name) {
  if (key.compare(0, tenant_prefix.size(), tenant_prefix) != 0) return false;
  std::string rest = key.substr(tenant_prefix.size());
  size_t a = rest.find('/');
  if (a == std::string::npos) return false;
  size_t b = rest.find('/', a + 1);
  if (b == std::string::npos) return false;
  std::string tenant = rest.substr(0, a);
  // Written plainly (no sign, no leading zero): one tenant, one prefix.
  if (tenant.empty() || tenant.size() > 10 || tenant[0] == '0' ||
      tenant.find_first_not_of("0123456789") != std::string::npos || std::stoull(tenant) > UINT32_MAX)
    return false;
  name->tenant = static_cast<uint32_t>(std::stoull(tenant));
  name->host = rest.substr(a + 1, b - a - 1);
  name->vm = rest.substr(b + 1);
  return ValidName(name->host) && ValidName(name->vm);
}

std::string EncodeHost(const HostRecord& r) {
  return Json{{"fabric_address", r.fabric_address}, {"fabrics", r.fabrics}}.dump();
}

std::string EncodeVm(const VmRecord& r) { return Json{{"tenant", r.tenant}, {"addresses", r.addresses}}.dump(); }

Result<HostRecord> DecodeHost(const std::string& json) {
  Json j = Json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status(Code::kInvalidArgument, "host record is not a JSON object");
  HostRecord r;
  bool ok = true;
  auto a = j.find("fabric_address");
  if (a != j.end() && a->is_string()) r.fabric_address = a->get<std::string>();
  r.fabrics = Strings(j, "fabrics", &ok);
  if (!ok) return Status(Code::kInvalidArgument, "host record: fabrics is not a list of strings");
  return r;
}

Result<VmRecord> DecodeVm(const std::string& json) {
  Json j = Json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status(Code::kInvalidArgument, "VM record is not a JSON object");
  VmRecord r;
  auto t = j.find("tenant");
  if (t == j.end() || !t->is_number_unsigned() || t->get<uint64_t>() == 0 || t->get<uint64_t>() > UINT32_MAX)
    return Status(Code::kInvalidArgument, "VM record: tenant is not a number from 1 to 2^32-1");
  r.tenant = t->get<uint32_t>();
  bool ok = true;
  r.addresses = Strings(j, "addresses", &ok);
  if (!ok) return Status(Code::kInvalidArgument, "VM record: addresses is not a list of strings");
  return r;
}

}  // namespace vsocket::directory
