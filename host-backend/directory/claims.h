// Which of the directory's address claims contradict each other.
//
// RBAC keeps a host to its own keys, but the addresses inside its VM
// records are what it says they are: a compromised host could publish
// another host's VM address as its own and be asked to pair for it. An
// address (or a range overlapping it) that two hosts claim for the same
// tenant is therefore believed of neither: the locator drops every claim
// of the overlap, so connections to it stay on kernel TCP (and inbound
// pairing requests naming it are refused) until one host withdraws it.
// The worst a lying host can do is keep such addresses on kernel TCP.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vsocket::directory {

struct Claim {
  uint32_t tenant = 0;
  std::string address;  // ADDRESS[/PREFIX]
  std::string host;
};

// contested[i]: claims[i] overlaps a claim of another host for the same
// tenant. Claims whose address does not parse are never contested (the
// locator's parser refuses them apart). O(n log n).
std::vector<bool> Contested(const std::vector<Claim>& claims);

}  // namespace vsocket::directory
