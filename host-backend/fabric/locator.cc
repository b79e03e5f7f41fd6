#include "host-backend/fabric/locator.h"

#include <arpa/inet.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace vsocket::fabric {
namespace {

bool PrefixMatch(const std::array<uint8_t, 16>& a, const std::array<uint8_t, 16>& b, int bits) {
  int full = bits / 8, rest = bits % 8;
  for (int i = 0; i < full; ++i)
    if (a[i] != b[i]) return false;
  if (rest == 0) return true;
  uint8_t mask = static_cast<uint8_t>(0xff << (8 - rest));
  return (a[full] & mask) == (b[full] & mask);
}

}  // namespace

Result<std::unique_ptr<StaticLocator>> StaticLocator::Parse(const std::string& text, const std::string& name) {
  auto loc = std::make_unique<StaticLocator>();
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    std::string where = name + ":" + std::to_string(line_no) + ": ";
    if (size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream f(line);
    std::string tenant_s, addr_s, host, extra;
    if (!(f >> tenant_s)) continue;
    if (!(f >> addr_s >> host) || (f >> extra))
      return Status(Code::kInvalidArgument, where + "expected TENANT ADDRESS[/PREFIX] HOST");
    char* end = nullptr;
    unsigned long t = std::strtoul(tenant_s.c_str(), &end, 10);
    if (*end != '\0' || t == 0 || t > 0xffffffffu)
      return Status(Code::kInvalidArgument, where + "tenant must be 1..4294967295");
    Entry e{static_cast<uint32_t>(t), proto::Family::kIpv4, {}, 32, host};
    std::string a = addr_s;
    int max_prefix = 32;
    if (size_t slash = addr_s.find('/'); slash != std::string::npos) {
      a = addr_s.substr(0, slash);
      e.prefix = std::atoi(addr_s.c_str() + slash + 1);
      if (addr_s.size() == slash + 1) e.prefix = -1;
    } else {
      e.prefix = -2;  // whole address
    }
    if (inet_pton(AF_INET, a.c_str(), e.addr.data()) == 1) {
      e.family = proto::Family::kIpv4;
    } else if (inet_pton(AF_INET6, a.c_str(), e.addr.data()) == 1) {
      e.family = proto::Family::kIpv6;
      max_prefix = 128;
    } else {
      return Status(Code::kInvalidArgument, where + "'" + a + "' is not an IPv4 or IPv6 address");
    }
    if (e.prefix == -2) e.prefix = max_prefix;
    if (e.prefix < 0 || e.prefix > max_prefix)
      return Status(Code::kInvalidArgument, where + "prefix length out of range");
    // Host bits off: 198.51.100.5/24 is the entry 198.51.100.0/24 (so that
    // `locator set` replaces it rather than adding a second one).
    for (int bit = e.prefix; bit < 128; ++bit) e.addr[bit / 8] &= static_cast<uint8_t>(~(0x80 >> (bit % 8)));
    loc->entries_.push_back(std::move(e));
  }
  return loc;
}

Result<std::unique_ptr<StaticLocator>> StaticLocator::Load(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "re");
  if (!f) return Status::FromErrno("locator file " + path);
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  std::fclose(f);
  return Parse(text, path);
}

std::string StaticLocator::Find(uint32_t tenant, const proto::Endpoint& addr) const {
  const Entry* best = nullptr;
  for (const Entry& e : entries_) {
    if (e.tenant != tenant || e.family != addr.family) continue;
    if (!PrefixMatch(e.addr, addr.addr, e.prefix)) continue;
    if (best == nullptr || e.prefix > best->prefix) best = &e;
  }
  return best ? best->host : "";
}

size_t StaticLocator::Merge(const StaticLocator& other) {
  size_t replaced = 0;
  for (const Entry& o : other.entries_) {
    bool found = false;
    for (Entry& e : entries_) {
      if (e.tenant == o.tenant && e.family == o.family && e.prefix == o.prefix && e.addr == o.addr) {
        e.host = o.host;
        found = true;
        ++replaced;
      }
    }
    if (!found) entries_.push_back(o);
  }
  return replaced;
}

std::string StaticLocator::Text() const {
  std::string out;
  for (const Entry& e : entries_) {
    char a[INET6_ADDRSTRLEN] = {};
    inet_ntop(e.family == proto::Family::kIpv4 ? AF_INET : AF_INET6, e.addr.data(), a, sizeof(a));
    out += std::to_string(e.tenant) + " " + a + "/" + std::to_string(e.prefix) + " " + e.host + "\n";
  }
  return out;
}

}  // namespace vsocket::fabric
