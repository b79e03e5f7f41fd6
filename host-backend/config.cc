#include "host-backend/config.h"

#include <sched.h>

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>

#include "base/log.h"

namespace vsocket::backend {

bool ParseCpuList(const std::string& text, std::vector<int>* cpus, std::string* error) {
  std::set<int> out;
  size_t i = 0;
  auto number = [&](int* n) {
    size_t start = i;
    long v = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9' && i - start < 6) v = v * 10 + (text[i++] - '0');
    *n = static_cast<int>(v);
    return i > start && v < CPU_SETSIZE;
  };
  while (i < text.size()) {
    int lo, hi;
    if (!number(&lo)) {
      *error = "'" + text + "' is not a CPU list such as 1 or 0,2-3 (CPUs below " + std::to_string(CPU_SETSIZE) + ")";
      return false;
    }
    hi = lo;
    if (i < text.size() && text[i] == '-') {
      ++i;
      if (!number(&hi) || hi < lo) {
        *error = "'" + text + "' has a bad range";
        return false;
      }
    }
    for (int c = lo; c <= hi; ++c) out.insert(c);
    if (i < text.size()) {
      if (text[i] != ',' || i + 1 == text.size()) {
        *error = "'" + text + "' is not a CPU list such as 1 or 0,2-3";
        return false;
      }
      ++i;
    }
  }
  if (out.empty()) {
    *error = "empty CPU list";
    return false;
  }
  cpus->assign(out.begin(), out.end());
  return true;
}

namespace {

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

Status Bad(const std::string& where, const std::string& what) {
  return Status(Code::kInvalidArgument, where + ": " + what);
}

Result<int> ParseInt(const std::string& v, int lo, int hi, const std::string& where) {
  char* end = nullptr;
  long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < lo || n > hi)
    return Bad(where, "'" + v + "' is not a number in " + std::to_string(lo) + ".." + std::to_string(hi));
  return static_cast<int>(n);
}

Status SetDaemonKey(DaemonConfig* c, const std::string& key, const std::string& value, const std::string& where) {
  if (key == "ctl_socket") {
    c->ctl_socket = value;
  } else if (key == "poll_us") {
    auto n = ParseInt(value, 0, 1000000, where);
    if (!n.ok()) return n.status();
    c->poll_us = *n;
  } else if (key == "nap_us") {
    auto n = ParseInt(value, -1, 100000, where);
    if (!n.ok()) return n.status();
    c->nap_us = *n;
  } else if (key == "poll_max_us") {
    auto n = ParseInt(value, 0, 1000000, where);
    if (!n.ok()) return n.status();
    c->poll_max_us = *n;
  } else if (key == "eal_mem_mb") {
    auto n = ParseInt(value, 8, 65536, where);
    if (!n.ok()) return n.status();
    c->eal_mem_mb = *n;
  } else if (key == "cpus") {
    std::vector<int> cpus;
    std::string error;
    if (!ParseCpuList(value, &cpus, &error)) return Bad(where, "cpus: " + error);
    c->cpus = value;
  } else if (key == "log_level") {
    LogLevel l;
    if (!ParseLogLevel(value.c_str(), &l)) return Bad(where, "log_level must be error, warn, info or debug");
    c->log_level = value;
  } else if (key == "metrics_addr") {
    in_addr a;
    if (inet_pton(AF_INET, value.c_str(), &a) != 1) return Bad(where, "metrics_addr must be an IPv4 address");
    c->metrics_addr = value;
  } else if (key == "metrics_port") {
    auto n = ParseInt(value, 0, 65535, where);
    if (!n.ok()) return n.status();
    c->metrics_port = *n;
  } else if (key == "vms_dir") {
    c->vms_dir = value;
  } else if (key == "host_name") {
    c->host_name = value;
  } else if (key == "peer_listen") {
    sockaddr_storage ss;
    unsigned len;
    Status st = ParseHostPort(value, &ss, &len);
    if (!st.ok()) return Bad(where, st.message());
    c->peer_listen = value;
  } else if (key == "tls_cert") {
    c->tls_cert = value;
  } else if (key == "tls_key") {
    c->tls_key = value;
  } else if (key == "tls_ca") {
    c->tls_ca = value;
  } else if (key == "tls_crl") {
    c->tls_crl = value;
  } else if (key == "locator") {
    if (IsEtcdLocator(value)) {
      auto endpoints = EtcdEndpoints(value);
      if (!endpoints.ok()) return Bad(where, endpoints.status().message());
    }
    c->locator = value;
  } else if (key == "etcd_user") {
    c->etcd_user = value;
  } else if (key == "etcd_password_file") {
    c->etcd_password_file = value;
  } else if (key == "etcd_ca") {
    c->etcd_ca = value;
  } else if (key == "etcd_cert") {
    c->etcd_cert = value;
  } else if (key == "etcd_key") {
    c->etcd_key = value;
  } else if (key == "fabric") {
    if (value != "tcp" && value != "rdma") return Bad(where, "fabric must be tcp or rdma");
    c->fabric = value;
  } else if (key == "rdma_device") {
    c->rdma_device = value;
  } else if (key == "rdma_gid_index") {
    auto n = ParseInt(value, -1, 255, where);
    if (!n.ok()) return n.status();
    c->rdma_gid_index = *n;
  } else if (key == "links_per_peer") {
    auto n = ParseInt(value, 1, kMaxLinksPerPeer, where);
    if (!n.ok()) return n.status();
    c->links_per_peer = *n;
  } else if (key == "orphan_mb_per_vm" || key == "orphan_mb_total") {
    auto n = ParseInt(value, 0, 1 << 20, where);
    if (!n.ok()) return n.status();
    (key == "orphan_mb_per_vm" ? c->orphan_mb_per_vm : c->orphan_mb_total) = *n;
  } else if (key == "drain_timeout_ms") {
    auto n = ParseInt(value, 0, 3600000, where);
    if (!n.ok()) return n.status();
    c->drain_timeout_ms = *n;
  } else if (key == "max_devices_per_vm" || key == "max_conns_per_vm") {
    auto n = ParseInt(value, 1, 1 << 24, where);
    if (!n.ok()) return n.status();
    (key == "max_devices_per_vm" ? c->max_devices_per_vm : c->max_conns_per_vm) = *n;
  } else {
    return Bad(
        where,
        "unknown key '" + key +
            "' (daemon keys: ctl_socket, poll_us, poll_max_us, nap_us, eal_mem_mb, cpus, log_level, metrics_addr, metrics_port, "
            "host_name, peer_listen, tls_cert, tls_key, tls_ca, tls_crl, locator, etcd_user, etcd_password_file, "
            "etcd_ca, etcd_cert, etcd_key, "
            "fabric, rdma_device, "
            "rdma_gid_index, links_per_peer, orphan_mb_per_vm, orphan_mb_total, max_devices_per_vm, "
            "max_conns_per_vm, drain_timeout_ms, vms_dir)");
  }
  return Status::Ok();
}

// A portable group name (what adduser/groupadd accept by default). The
// group's existence is checked when the port is created, not here.
bool IsGroupName(const std::string& v) {
  if (v.empty() || v.size() > 32 || v[0] == '-' || v[0] == '.' || std::isdigit(static_cast<unsigned char>(v[0])))
    return false;
  return std::all_of(v.begin(), v.end(), [](unsigned char ch) {
    return std::isalnum(ch) || ch == '_' || ch == '-' || ch == '.';
  });
}

Status SetVmKey(vhost::PortConfig* vm, const std::string& key, const std::string& value, const std::string& where) {
  if (key == "socket") {
    vm->path = value;
  } else if (key == "tenant") {
    char* end = nullptr;
    unsigned long t = std::strtoul(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || t == 0 || t > 0xffffffffu) return Bad(where, "tenant must be 1..4294967295");
    vm->tenant_id = static_cast<uint32_t>(t);
  } else if (key == "addresses") {
    Status st = ParseAddresses(value, &vm->addresses);
    if (!st.ok()) return Bad(where, st.message());
  } else if (key == "group") {
    if (!IsGroupName(value)) return Bad(where, "group must be a group name ([A-Za-z_][A-Za-z0-9_.-]*, at most 32)");
    vm->group = value;
  } else if (key == "away") {
    if (value != "true" && value != "false") return Bad(where, "away must be true or false");
    vm->away = value == "true";
  } else if (key == "incoming") {
    if (value != "true" && value != "false") return Bad(where, "incoming must be true or false");
    vm->incoming = value == "true";
  } else if (key == "prove_sockets") {
    // agent: a QEMU VM whose agent (vsocket-guestd) vouches for its
    // processes' sockets on PATH.agent (decision 100).
    if (value != "true" && value != "false" && value != "agent")
      return Bad(where, "prove_sockets must be true, false or agent");
    vm->prove_sockets = value != "false";
    vm->proofs_by_agent = value == "agent";
  } else if (key == "direct") {
    using D = vhost::PortConfig::Direct;
    if (value == "off") vm->direct = D::kOff;
    else if (value == "same-tenant") vm->direct = D::kSameTenant;
    else if (value == "same-vm") vm->direct = D::kSameVm;
    else return Bad(where, "direct must be off, same-tenant or same-vm");
    vm->direct_set = true;
  } else {
    return Bad(where,
               "unknown key '" + key + "' (VM keys: socket, tenant, addresses, group, away, incoming, prove_sockets, direct)");
  }
  return Status::Ok();
}

Status SetPeerKey(PeerHostConfig* peer, const std::string& key, const std::string& value, const std::string& where) {
  if (key != "address") return Bad(where, "unknown key '" + key + "' (peer keys: address)");
  sockaddr_storage ss;
  unsigned len;
  Status st = ParseHostPort(value, &ss, &len);
  if (!st.ok()) return Bad(where, st.message());
  peer->address = value;
  return Status::Ok();
}

std::string EnvName(const std::string& vm) {
  std::string n;
  for (char ch : vm) n += ch == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return n;
}

}  // namespace

Status ParseAddresses(const std::string& text, std::vector<vhost::VmAddress>* out) {
  out->clear();
  std::string cur;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] != ',' && text[i] != ';') {
      cur += text[i];
      continue;
    }
    std::string a = Trim(cur);
    cur.clear();
    if (a.empty()) continue;
    vhost::VmAddress v;
    if (inet_pton(AF_INET, a.c_str(), v.addr.data()) == 1) {
      v.family = 4;
    } else if (inet_pton(AF_INET6, a.c_str(), v.addr.data()) == 1) {
      v.family = 6;
    } else {
      return Status(Code::kInvalidArgument, "'" + a + "' is not an IPv4 or IPv6 address");
    }
    out->push_back(v);
  }
  return Status::Ok();
}

Status ParseHostPort(const std::string& text, sockaddr_storage* out, unsigned* len) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 == text.size())
    return Status(Code::kInvalidArgument, "'" + text + "' is not ADDR:PORT");
  std::string host = text.substr(0, colon);
  char* end = nullptr;
  unsigned long port = std::strtoul(text.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port == 0 || port > 65535)
    return Status(Code::kInvalidArgument, "'" + text + "': port must be 1..65535");
  *out = {};
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(out);
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &a6->sin6_addr) != 1)
      return Status(Code::kInvalidArgument, "'" + text + "': bad IPv6 address");
    *len = sizeof(sockaddr_in6);
    return Status::Ok();
  }
  auto* a4 = reinterpret_cast<sockaddr_in*>(out);
  a4->sin_family = AF_INET;
  a4->sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &a4->sin_addr) != 1)
    return Status(Code::kInvalidArgument, "'" + text + "': bad IPv4 address (IPv6: [ADDR]:PORT)");
  *len = sizeof(sockaddr_in);
  return Status::Ok();
}

Result<DaemonConfig> ParseConfig(const std::string& text, const std::string& name) {
  DaemonConfig c;
  vhost::PortConfig* vm = nullptr;
  PeerHostConfig* peer = nullptr;
  size_t line_no = 0, start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    std::string where = name + ":" + std::to_string(line_no);
    if (size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    line = Trim(line);
    if (line.empty()) {
      if (end == text.size()) break;
      continue;
    }
    if (line.front() == '[') {
      if (line.back() != ']') return Bad(where, "unterminated section header");
      std::string sec = Trim(line.substr(1, line.size() - 2));
      vm = nullptr;
      peer = nullptr;
      if (sec == "daemon") {
      } else if (sec.rfind("vm ", 0) == 0 && !Trim(sec.substr(3)).empty()) {
        c.vms.emplace_back();
        vm = &c.vms.back();
        vm->vm_name = Trim(sec.substr(3));
      } else if (sec.rfind("peer ", 0) == 0 && !Trim(sec.substr(5)).empty()) {
        c.peers.emplace_back();
        peer = &c.peers.back();
        peer->name = Trim(sec.substr(5));
      } else {
        return Bad(where, "section must be [daemon], [vm NAME] or [peer NAME], not [" + sec + "]");
      }
      continue;
    }
    size_t eq = line.find('=');
    if (eq == std::string::npos) return Bad(where, "expected KEY = VALUE");
    std::string key = Trim(line.substr(0, eq)), value = Trim(line.substr(eq + 1));
    Status st = vm     ? SetVmKey(vm, key, value, where)
                : peer ? SetPeerKey(peer, key, value, where)
                       : SetDaemonKey(&c, key, value, where);
    if (!st.ok()) return st;
    if (end == text.size()) break;
  }
  return c;
}

Status ApplyEnv(char** env, DaemonConfig* config) {
  static constexpr struct {
    const char* env;
    const char* key;
  } kDaemon[] = {{"VSOCKET_CTL_SOCKET", "ctl_socket"},
                 {"VSOCKET_POLL_US", "poll_us"},
                 {"VSOCKET_POLL_MAX_US", "poll_max_us"},
                 {"VSOCKET_NAP_US", "nap_us"},
                 {"VSOCKET_EAL_MEM_MB", "eal_mem_mb"},
                 {"VSOCKET_CPUS", "cpus"},
                 {"VSOCKET_LOG_LEVEL", "log_level"},
                 {"VSOCKET_METRICS_ADDR", "metrics_addr"},
                 {"VSOCKET_METRICS_PORT", "metrics_port"},
                 {"VSOCKET_HOST_NAME", "host_name"},
                 {"VSOCKET_PEER_LISTEN", "peer_listen"},
                 {"VSOCKET_TLS_CERT", "tls_cert"},
                 {"VSOCKET_TLS_KEY", "tls_key"},
                 {"VSOCKET_TLS_CA", "tls_ca"},
                 {"VSOCKET_TLS_CRL", "tls_crl"},
                 {"VSOCKET_LOCATOR", "locator"},
                 {"VSOCKET_ETCD_USER", "etcd_user"},
                 {"VSOCKET_ETCD_PASSWORD_FILE", "etcd_password_file"},
                 {"VSOCKET_ETCD_CA", "etcd_ca"},
                 {"VSOCKET_ETCD_CERT", "etcd_cert"},
                 {"VSOCKET_ETCD_KEY", "etcd_key"},
                 {"VSOCKET_FABRIC", "fabric"},
                 {"VSOCKET_RDMA_DEVICE", "rdma_device"},
                 {"VSOCKET_RDMA_GID_INDEX", "rdma_gid_index"},
                 {"VSOCKET_LINKS_PER_PEER", "links_per_peer"},
                 {"VSOCKET_ORPHAN_MB_PER_VM", "orphan_mb_per_vm"},
                 {"VSOCKET_ORPHAN_MB_TOTAL", "orphan_mb_total"},
                 {"VSOCKET_MAX_DEVICES_PER_VM", "max_devices_per_vm"},
                 {"VSOCKET_MAX_CONNS_PER_VM", "max_conns_per_vm"},
                 {"VSOCKET_DRAIN_TIMEOUT_MS", "drain_timeout_ms"},
                 {"VSOCKET_VMS_DIR", "vms_dir"}};
  for (char** e = env; e && *e; ++e) {
    std::string kv = *e;
    size_t eq = kv.find('=');
    if (eq == std::string::npos || kv.rfind("VSOCKET_", 0) != 0) continue;
    std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    bool done = false;
    for (const auto& d : kDaemon) {
      if (k == d.env) {
        VS_RETURN_IF_ERROR(SetDaemonKey(config, d.key, v, "environment " + k));
        done = true;
      }
    }
    if (!done && k.rfind("VSOCKET_PEER_", 0) == 0 && k != "VSOCKET_PEER_LISTEN") {
      for (PeerHostConfig& p : config->peers)
        if (k == "VSOCKET_PEER_" + EnvName(p.name) + "_ADDRESS")
          VS_RETURN_IF_ERROR(SetPeerKey(&p, "address", v, "environment " + k));
      continue;
    }
    if (done || k.rfind("VSOCKET_VM_", 0) != 0) continue;
    for (vhost::PortConfig& vm : config->vms) {
      std::string prefix = "VSOCKET_VM_" + EnvName(vm.vm_name) + "_";
      if (k.rfind(prefix, 0) != 0) continue;
      std::string key = k.substr(prefix.size());
      std::transform(key.begin(), key.end(), key.begin(), [](unsigned char ch) { return std::tolower(ch); });
      VS_RETURN_IF_ERROR(SetVmKey(&vm, key, v, "environment " + k));
    }
  }
  return Status::Ok();
}

Status Validate(DaemonConfig* config) {
  if (config->vms.empty()) return Status(Code::kInvalidArgument, "no VM configured ([vm NAME] or --port)");
  std::set<std::string> names, sockets;
  for (size_t i = 0; i < config->vms.size(); ++i) {
    vhost::PortConfig& vm = config->vms[i];
    vm.index = static_cast<uint32_t>(i);
    vm.max_devices = static_cast<uint32_t>(config->max_devices_per_vm);
    std::string what = "VM '" + vm.vm_name + "'";
    if (!names.insert(vm.vm_name).second) return Status(Code::kInvalidArgument, what + " is configured twice");
    if (vm.path.empty()) return Status(Code::kInvalidArgument, what + " has no socket");
    if (!sockets.insert(vm.path).second)
      return Status(Code::kInvalidArgument, what + ": socket " + vm.path + " is used twice");
    if (vm.tenant_id == 0) return Status(Code::kInvalidArgument, what + " has no tenant");
    if (vm.away && vm.incoming)
      return Status(Code::kInvalidArgument,
                    what + ": away and incoming are two ways of arriving (away: `vsocketctl migrate end` opens the "
                           "port; incoming: the port is open and the first device to start publishes it); choose one");
    // Direct pairs are for process mode (decision 102: same-tenant there by
    // default); a QEMU VM's processes cannot get them yet.
    if (!vhost::DirectCapable(vm)) {
      if (vm.direct_set && vm.direct != vhost::PortConfig::Direct::kOff)
        return Status(Code::kInvalidArgument,
                      what + ": direct pairs need process mode (prove_sockets = true); set direct = off");
      vm.direct = vhost::PortConfig::Direct::kOff;
    }
    if (vm.addresses.empty())
      VS_LOG(kWarn, "%s has no addresses: its guests can only accelerate loopback connections", what.c_str());
  }
  // Peer hosts come from [peer] sections or, with the etcd directory, from
  // the directory (decision 96): either way this host needs its identity.
  if (!config->peers.empty() || IsEtcdLocator(config->locator)) {
    const char* why = config->peers.empty() ? "locator = etcd (peers from the directory)" : "peers are configured";
    auto need = [why](const std::string& v, const char* key) {
      return v.empty() ? Status(Code::kInvalidArgument, std::string(why) + " but " + key + " is not set")
                       : Status::Ok();
    };
    for (auto [v, k] : {std::pair{&config->host_name, "host_name"},
                        {&config->peer_listen, "peer_listen"},
                        {&config->tls_cert, "tls_cert"},
                        {&config->tls_key, "tls_key"},
                        {&config->tls_ca, "tls_ca"},
                        {&config->locator, "locator"}})
      VS_RETURN_IF_ERROR(need(*v, k));
    std::set<std::string> peer_names;
    for (const PeerHostConfig& p : config->peers) {
      if (p.address.empty()) return Status(Code::kInvalidArgument, "peer '" + p.name + "' has no address");
      if (p.name == config->host_name)
        return Status(Code::kInvalidArgument, "peer '" + p.name + "' is this host's own name");
      if (!peer_names.insert(p.name).second)
        return Status(Code::kInvalidArgument, "peer '" + p.name + "' is configured twice");
    }
  }
  return Status::Ok();
}

bool IsEtcdLocator(const std::string& locator) {
  return locator.rfind("etcd://", 0) == 0 || EtcdLocatorUsesTls(locator);
}

bool EtcdLocatorUsesTls(const std::string& locator) { return locator.rfind("etcds://", 0) == 0; }

Result<std::vector<std::string>> EtcdEndpoints(const std::string& locator) {
  static const std::string kUsage = "locator = etcd[s]://HOST:PORT[,HOST:PORT...]";
  if (!IsEtcdLocator(locator)) return Status(Code::kInvalidArgument, kUsage);
  std::vector<std::string> out;
  std::string rest = locator.substr(EtcdLocatorUsesTls(locator) ? 8 : 7);
  for (size_t start = 0; start <= rest.size();) {
    size_t comma = rest.find(',', start);
    std::string e = rest.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t colon = e.rfind(':');
    std::string host = colon == std::string::npos ? "" : e.substr(0, colon);
    std::string port = colon == std::string::npos ? "" : e.substr(colon + 1);
    char* end = nullptr;
    long n = port.empty() ? 0 : std::strtol(port.c_str(), &end, 10);
    if (host.empty() || host.find_first_of("/ \t@?#") != std::string::npos || port.empty() || *end != '\0' ||
        n < 1 || n > 65535)
      return Status(Code::kInvalidArgument, "'" + e + "' is not HOST:PORT (" + kUsage + ")");
    out.push_back(e);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int EffectiveNapUs(const DaemonConfig& c, int online_cpus) {
  if (c.nap_us >= 0) return c.nap_us;
  return c.cpus.empty() && online_cpus < 4 ? 100 : 0;
}

}  // namespace vsocket::backend
