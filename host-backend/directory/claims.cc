#include "host-backend/directory/claims.h"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <tuple>

namespace vsocket::directory {
namespace {

using Bytes = std::array<uint8_t, 16>;

// One claim as the range of addresses it covers (first and last, IPv4 in
// the first four bytes).
struct Range {
  uint32_t tenant;
  int family;
  Bytes first, last;
  size_t index;
};

bool ToRange(const Claim& c, size_t index, Range* r) {
  std::string addr = c.address;
  int bits = -1;
  if (size_t slash = addr.find('/'); slash != std::string::npos) {
    char* end = nullptr;
    bits = int(std::strtol(addr.c_str() + slash + 1, &end, 10));
    if (end == addr.c_str() + slash + 1 || *end != '\0') return false;
    addr.resize(slash);
  }
  Bytes a{};
  int family = addr.find(':') == std::string::npos ? 4 : 6;
  if (inet_pton(family == 4 ? AF_INET : AF_INET6, addr.c_str(), a.data()) != 1) return false;
  int width = family == 4 ? 32 : 128;
  if (bits < 0) bits = width;
  if (bits > width) return false;
  r->tenant = c.tenant;
  r->family = family;
  r->first = r->last = a;
  for (int bit = bits; bit < width; ++bit) {
    uint8_t mask = uint8_t(0x80 >> (bit % 8));
    r->first[bit / 8] &= uint8_t(~mask);
    r->last[bit / 8] |= mask;
  }
  r->index = index;
  return true;
}

}  // namespace

std::vector<bool> Contested(const std::vector<Claim>& claims) {
  std::vector<bool> contested(claims.size(), false);
  std::vector<Range> ranges;
  ranges.reserve(claims.size());
  for (size_t i = 0; i < claims.size(); ++i)
    if (Range r; ToRange(claims[i], i, &r)) ranges.push_back(r);
  // By tenant, family, first address, widest first: a range's enclosing
  // ranges come before it. CIDR ranges nest or are disjoint, so the ranges
  // still open when one begins all contain it.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return std::tie(a.tenant, a.family, a.first, b.last) < std::tie(b.tenant, b.family, b.first, a.last);
  });
  std::vector<const Range*> open;  // nested, outermost first (at most 129 deep)
  for (const Range& r : ranges) {
    while (!open.empty() && (open.back()->tenant != r.tenant || open.back()->family != r.family ||
                             open.back()->last < r.first))
      open.pop_back();
    for (const Range* o : open)
      if (claims[o->index].host != claims[r.index].host) contested[o->index] = contested[r.index] = true;
    open.push_back(&r);
  }
  return contested;
}

}  // namespace vsocket::directory
