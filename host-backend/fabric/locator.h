// Which host runs a guest address: (tenant, address) -> host name.
//
// The interface is what pairing needs; StaticLocator reads it from a file
// every vsocketd of a cluster shares. A shared directory service can take
// its place later without touching the callers (see docs/multi-host.md).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "proto/control.h"

namespace vsocket::fabric {

class Locator {
 public:
  virtual ~Locator() = default;
  // The host running `addr` for `tenant`, or "" if no entry says.
  virtual std::string Find(uint32_t tenant, const proto::Endpoint& addr) const = 0;
};

// File format, one entry per line ('#' starts a comment):
//   TENANT  ADDRESS[/PREFIX]  HOST
// The longest matching prefix of the tenant wins; entries of other tenants
// never match (the same address may belong to different tenants on
// different hosts).
class StaticLocator : public Locator {
 public:
  static Result<std::unique_ptr<StaticLocator>> Parse(const std::string& text, const std::string& name);
  static Result<std::unique_ptr<StaticLocator>> Load(const std::string& path);
  std::string Find(uint32_t tenant, const proto::Endpoint& addr) const override;
  size_t size() const { return entries_.size(); }
  // Takes other's entries: one for the same tenant and prefix replaces
  // ours (a guest that moved: `vsocketctl locator set`). Returns how many
  // were replaced.
  size_t Merge(const StaticLocator& other);
  // The entries in the file format, one per line.
  std::string Text() const;

 private:
  struct Entry {
    uint32_t tenant;
    proto::Family family;
    std::array<uint8_t, 16> addr;
    int prefix;
    std::string host;
  };
  std::vector<Entry> entries_;
};

}  // namespace vsocket::fabric
