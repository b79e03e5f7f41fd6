#include "guest/core/config.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include <arpa/inet.h>

#include "base/log.h"

namespace vsocket::guest {
namespace {

std::map<std::string, std::string> ReadFile(const char* path) {
  std::map<std::string, std::string> kv;
  FILE* f = std::fopen(path, "re");
  if (!f) return kv;
  char line[512];
  while (std::fgets(line, sizeof(line), f)) {
    char* p = line;
    while (*p == ' ' || *p == '\t') ++p;
    if (*p == '#' || *p == '\n' || *p == 0) continue;
    char* eq = std::strchr(p, '=');
    if (!eq) continue;
    std::string key(p, eq - p), value(eq + 1);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    while (!value.empty() && (value.back() == '\n' || value.back() == ' ')) value.pop_back();
    size_t s = value.find_first_not_of(" \t");
    kv[key] = s == std::string::npos ? "" : value.substr(s);
  }
  std::fclose(f);
  return kv;
}

GuestConfig Load() {
  GuestConfig c;
  auto file = ReadFile("/etc/vsocket/vsocket.conf");
  auto get = [&](const char* key, std::string* out) {
    std::string env = std::string("VSOCKET_") + key;
    if (const char* v = std::getenv(env.c_str())) {
      *out = v;
      return true;
    }
    auto it = file.find(key);
    if (it == file.end()) return false;
    *out = it->second;
    return true;
  };
  std::string v;
  if (get("SOCKET", &v)) {
    c.socket_path = v;
    c.socket_is_default = false;
  }
  if (get("ENABLE", &v)) c.enabled = v != "0" && v != "false" && v != "no";
  if (get("RING_KB", &v)) {
    long kb = std::strtol(v.c_str(), nullptr, 10);
    uint32_t bytes = 4096;
    while (bytes < uint64_t(kb) * 1024 && bytes < (64u << 20)) bytes <<= 1;
    c.ring_bytes = bytes;
  }
  if (get("REGION_MB", &v)) c.region_bytes = size_t(std::max(4L, std::strtol(v.c_str(), nullptr, 10))) << 20;
  if (get("POLL_US", &v)) c.poll_us = std::max(0, std::atoi(v.c_str()));
  if (get("POLL_MAX_US", &v)) c.poll_max_us = std::max(0, std::atoi(v.c_str()));
  if (get("POLL_AUTO", &v)) c.poll_auto = v != "0" && v != "false" && v != "no";
  if (get("DOORBELL", &v)) c.doorbell = v != "0" && v != "false" && v != "no";
  if (get("RING_HOLD", &v)) c.ring_hold = v != "0" && v != "false" && v != "no";
  if (get("DIRECT", &v)) c.direct = v != "0" && v != "false" && v != "no";
  if (get("UPGRADE", &v)) {
    if (v == "always") {
      c.upgrade = UpgradePolicy::kAlways;
    } else if (v != "auto") {
      std::fprintf(stderr, "libvsocket: VSOCKET_UPGRADE=%s: want auto or always; using auto\n", v.c_str());
    }
  }
  if (get("BUSY_EVENTS", &v)) c.busy_events = uint32_t(std::clamp(std::strtol(v.c_str(), nullptr, 10), 0L, 1024L));
  if (get("STREAM_KB", &v)) c.stream_window = uint32_t(std::clamp(std::strtol(v.c_str(), nullptr, 10), 4L, 65536L)) * 1024;
  if (get("REPORT", &v)) c.report_path = v;
  if (get("LOG_LEVEL", &v)) c.log_level = v;
  if (get("RULES", &v)) {
    std::string error;
    if (!ParseRules(v, &c.rules, &error)) {
      // A rule we cannot read must not silently accelerate what it meant to
      // exclude: fail safe, keep everything on kernel TCP.
      std::fprintf(stderr, "libvsocket: VSOCKET_RULES: %s; acceleration disabled\n", error.c_str());
      c.enabled = false;
    }
  }
  LogLevel level;
  if (ParseLogLevel(c.log_level.c_str(), &level)) SetLogLevel(level);
  SetLogTag("libvsocket");
  return c;
}

}  // namespace

bool ParseRules(const std::string& text, std::vector<DestinationRule>* out, std::string* error) {
  out->clear();
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string rule = text.substr(start, end - start);
    start = end + 1;
    size_t b = rule.find_first_not_of(" \t");
    if (b == std::string::npos) {
      if (end == text.size()) break;
      continue;
    }
    rule = rule.substr(b);
    DestinationRule r;
    size_t sp = rule.find_first_of(" \t");
    std::string verb = rule.substr(0, sp);
    if (verb == "accel") r.accelerate = true;
    else if (verb == "kernel") r.accelerate = false;
    else {
      *error = "rule '" + rule + "' must start with accel or kernel";
      return false;
    }
    std::string target = sp == std::string::npos ? "*" : rule.substr(rule.find_first_not_of(" \t", sp));
    while (!target.empty() && (target.back() == ' ' || target.back() == '\t')) target.pop_back();
    // [ADDR][/PREFIX][:PORT]; IPv6 in brackets: [2001:db8::1]/64:80
    std::string addr = target, port;
    if (!target.empty() && target[0] == '[') {
      size_t close = target.find(']');
      if (close == std::string::npos) {
        *error = "unbalanced [ in '" + target + "'";
        return false;
      }
      addr = target.substr(1, close - 1);
      std::string rest = target.substr(close + 1);
      size_t colon = rest.find(':');
      if (colon != std::string::npos) port = rest.substr(colon + 1), rest = rest.substr(0, colon);
      addr += rest;
    } else if (size_t colon = target.rfind(':'); colon != std::string::npos) {
      port = target.substr(colon + 1);
      addr = target.substr(0, colon);
    }
    if (!port.empty()) {
      char* e = nullptr;
      long p = std::strtol(port.c_str(), &e, 10);
      if (*e != '\0' || p < 1 || p > 65535) {
        *error = "bad port in '" + target + "'";
        return false;
      }
      r.port = static_cast<uint16_t>(p);
    }
    std::string prefix;
    if (size_t slash = addr.find('/'); slash != std::string::npos) {
      prefix = addr.substr(slash + 1);
      addr = addr.substr(0, slash);
    }
    if (addr == "*" || addr.empty()) {
      r.any_address = true;
    } else if (inet_pton(AF_INET, addr.c_str(), r.addr.data()) == 1) {
      r.family = proto::Family::kIpv4;
      r.prefix = 32;
    } else if (inet_pton(AF_INET6, addr.c_str(), r.addr.data()) == 1) {
      r.family = proto::Family::kIpv6;
      r.prefix = 128;
    } else {
      *error = "bad address in '" + target + "'";
      return false;
    }
    if (!prefix.empty()) {
      char* e = nullptr;
      long p = std::strtol(prefix.c_str(), &e, 10);
      if (*e != '\0' || p < 0 || p > r.prefix) {
        *error = "bad prefix length in '" + target + "'";
        return false;
      }
      r.prefix = static_cast<int>(p);
    }
    out->push_back(r);
  }
  return true;
}

bool AccelerationAllowed(const GuestConfig& config, const proto::Endpoint& peer) {
  for (const DestinationRule& r : config.rules) {
    if (r.port != 0 && r.port != peer.port) continue;
    if (!r.any_address) {
      if (r.family != peer.family) continue;
      int full = r.prefix / 8, bits = r.prefix % 8;
      if (std::memcmp(r.addr.data(), peer.addr.data(), full) != 0) continue;
      if (bits && ((r.addr[full] ^ peer.addr[full]) & (0xff << (8 - bits)) & 0xff)) continue;
    }
    return r.accelerate;
  }
  return true;
}

std::atomic<const GuestConfig*> config_internal::g_config{nullptr};

const GuestConfig& config_internal::LoadOnce() {
  // Never destroyed: the exit report (an atexit handler) and late I/O from
  // other exit handlers still read it after static destructors have run.
  static const GuestConfig* const kConfig = new GuestConfig(Load());
  g_config.store(kConfig, std::memory_order_release);
  return *kConfig;
}

}  // namespace vsocket::guest
