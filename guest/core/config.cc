#include "guest/core/config.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>
#include <mutex>

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
  if (get("SOCKET", &v)) c.socket_path = v;
  if (get("ENABLE", &v)) c.enabled = v != "0" && v != "false" && v != "no";
  if (get("RING_KB", &v)) {
    long kb = std::strtol(v.c_str(), nullptr, 10);
    uint32_t bytes = 4096;
    while (bytes < uint64_t(kb) * 1024 && bytes < (64u << 20)) bytes <<= 1;
    c.ring_bytes = bytes;
  }
  if (get("REGION_MB", &v)) c.region_bytes = size_t(std::max(4L, std::strtol(v.c_str(), nullptr, 10))) << 20;
  if (get("POLL_US", &v)) c.poll_us = std::max(0, std::atoi(v.c_str()));
  if (get("REPORT", &v)) c.report_path = v;
  if (get("LOG_LEVEL", &v)) c.log_level = v;
  LogLevel level;
  if (ParseLogLevel(c.log_level.c_str(), &level)) SetLogLevel(level);
  SetLogTag("libvsocket");
  return c;
}

}  // namespace

const GuestConfig& Config() {
  static const GuestConfig kConfig = Load();
  return kConfig;
}

}  // namespace vsocket::guest
