// Link pairs for the conformance suite, by kind: "fake" and "fake_small"
// (in-memory pipe, 4 MiB / 64 KiB per direction), "tcp" (kernel TCP on
// loopback) and "rdma" (first RDMA device, when one exists).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "host-backend/fabric/link.h"

namespace vsocket::fabric {

struct TestLinkPair {
  std::unique_ptr<Link> a, b;
  // Writes raw bytes into b's transport as if a had sent them (stream links).
  std::function<void(const void*, size_t)> inject_into_b;
  std::vector<std::shared_ptr<void>> keep;  // transport ends the links do not own
};

std::vector<std::string> TestLinkKinds();
std::optional<TestLinkPair> MakeTestLinkPair(const std::string& kind);

}  // namespace vsocket::fabric
