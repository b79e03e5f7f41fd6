// Peering as the connection manager's RemoteHosts: locating addresses,
// pairing messages, links and memory registration on the fabric.
#include "host-backend/peering/peers.h"

#include "base/log.h"
#include "host-backend/fabric/rdma_link.h"
#include "host-backend/peering/control_message.h"

namespace vsocket::backend {

using proto::FrameHeader;
using proto::FrameType;

std::string Peering::HostOf(uint32_t tenant, const proto::Endpoint& addr) const {
  if (etcd_locator_) return etcd_locator_->Find(tenant, addr);  // (its cache: never waits on etcd)
  MutexLock lock(locator_mu_);
  return locator_->Find(tenant, addr);
}

namespace {

Status NotStatic(const std::string& locator) {
  return Status(Code::kFailedPrecondition, "the locator is " + locator +
                                               ": each host publishes its own VMs there; set and reload are for a "
                                               "static locator file");
}

}  // namespace

uint32_t Peering::Locate(uint32_t tenant, const proto::Endpoint& addr) {
  std::string name = HostOf(tenant, addr);
  if (name.empty() || name == host_name_) return 0;
  Host* h = ByName(name);
  return h != nullptr && h->state == State::kUp ? h->id : 0;
}

bool Peering::DirectoryCannotPlace(uint32_t tenant, const proto::Endpoint& addr) {
  if (!etcd_locator_ || counters_.directory.connected.load(std::memory_order_relaxed) != 0) return false;
  if (!HostOf(tenant, addr).empty()) return false;
  // Not in the cache, and etcd cannot be asked: that connection stays on
  // kernel TCP (decision 95).
  counters_.directory.unavailable_fallbacks.fetch_add(1, std::memory_order_relaxed);
  VS_LOG(kDebug, "directory-unavailable: tenant %u port %u not in the cache, etcd unreachable", tenant, addr.port);
  return true;
}

std::vector<uint32_t> Peering::HostsUp() const {
  std::vector<uint32_t> up;
  for (const auto& h : hosts_)
    if (h->state == State::kUp && h->tls) up.push_back(h->id);
  return up;
}

bool Peering::Runs(uint32_t host, uint32_t tenant, const proto::Endpoint& addr) {
  if (host == 0 || host > hosts_.size()) return false;
  // With the etcd directory, the name is that of the key's host: a host
  // places addresses only on itself.
  return HostOf(tenant, addr) == hosts_[host - 1]->name;
}

Result<std::string> Peering::LocatorText() const {
  if (!enabled()) return Status(Code::kFailedPrecondition, "no peer hosts configured: no locator");
  if (etcd_locator_) return NotStatic(locator_path_);
  MutexLock lock(locator_mu_);
  return locator_->Text();
}

Status Peering::SetLocations(const std::string& lines, size_t* replaced) {
  if (!enabled()) return Status(Code::kFailedPrecondition, "no peer hosts configured: no locator");
  if (etcd_locator_) return NotStatic(locator_path_);
  auto set = fabric::StaticLocator::Parse(lines, "locator set");
  if (!set.ok()) return set.status();
  MutexLock lock(locator_mu_);
  *replaced = locator_->Merge(**set);
  return Status::Ok();
}

Status Peering::ReloadLocator() {
  if (!enabled()) return Status(Code::kFailedPrecondition, "no peer hosts configured: no locator");
  if (etcd_locator_) return NotStatic(locator_path_);
  auto loc = fabric::StaticLocator::Load(locator_path_);
  if (!loc.ok()) return loc.status();
  MutexLock lock(locator_mu_);
  locator_ = std::move(loc).value();
  return Status::Ok();
}

bool Peering::SendPairing(uint32_t host, const FrameHeader& h, std::span<const uint8_t> payload) {
  if (host == 0 || host > hosts_.size()) return false;
  Host& p = *hosts_[host - 1];
  if (p.state != State::kUp || !p.tls) return false;
  Status st = p.tls->Send(Message(h, payload));
  if (!st.ok()) {
    VS_LOG(kWarn, "peer %s: pairing message not sent: %s", p.name.c_str(), st.message().c_str());
    return false;
  }
  return true;
}

fabric::Link* Peering::LinkTo(uint32_t host, uint64_t conn) {
  if (host == 0 || host > hosts_.size()) return nullptr;
  Host& p = *hosts_[host - 1];
  if (p.state != State::kUp || p.lanes.empty()) return nullptr;
  // Handles are handed out in sequence: consecutive connections spread
  // round-robin over the links.
  return p.lanes[conn % p.lanes.size()].link.get();
}

fabric::RdmaDevice* Peering::DomainOf(uint32_t host) const {
  if (!rdma_ || host == 0 || host > hosts_.size()) return nullptr;
  return hosts_[host - 1]->rdma.get();
}

namespace {

// A registration in one peer host's protection domain, kept alive with it
// (a domain cannot go while it has memory registered).
struct RdmaRegistration : MemoryRegistration {
  std::shared_ptr<fabric::RdmaDevice> domain;  // declared first: outlives p
  fabric::RdmaDevice::Prepared p;
};

Registration Wrap(std::shared_ptr<fabric::RdmaDevice> domain, fabric::RdmaDevice::Prepared p) {
  if (!p.mr) return nullptr;
  auto r = std::make_unique<RdmaRegistration>();
  r->domain = std::move(domain);
  r->p = std::move(p);
  return r;
}

}  // namespace

RegisterFn Peering::Registering(uint32_t host, void* addr, size_t len, bool remote_write) {
  if (DomainOf(host) == nullptr) return {};
  std::shared_ptr<fabric::RdmaDevice> domain = hosts_[host - 1]->rdma;
  auto use = remote_write ? fabric::RdmaDevice::Use::kRemoteWrite : fabric::RdmaDevice::Use::kLocalRead;
  return [domain, addr, len, use]() -> Result<Registration> {
    Result<fabric::RdmaDevice::Prepared> p = domain->Prepare(addr, len, use);
    if (!p.ok()) return p.status();
    return Wrap(domain, std::move(p).value());
  };
}

Status Peering::Adopt(uint32_t host, Registration* r, uint32_t* rkey) {
  auto* reg = dynamic_cast<RdmaRegistration*>(r->get());
  fabric::RdmaDevice* pd = DomainOf(host);
  if (reg == nullptr || pd == nullptr || reg->domain.get() != pd)
    return Status(Code::kFailedPrecondition, "the host's protection domain changed");
  uint32_t lkey;
  VS_RETURN_IF_ERROR(pd->Adopt(&reg->p, &lkey, rkey));
  r->reset();  // (its memory region is the domain's now)
  return Status::Ok();
}

Registration Peering::TakeRemoteWritable(uint32_t host, void* addr) {
  if (DomainOf(host) == nullptr) return nullptr;
  std::shared_ptr<fabric::RdmaDevice>& domain = hosts_[host - 1]->rdma;
  return Wrap(domain, domain->Take(addr));
}

uint64_t Peering::WithdrawSendable(uint32_t host, void* addr) {
  fabric::RdmaDevice* pd = DomainOf(host);
  return pd ? pd->WithdrawMemory(addr) : 0;
}

Registration Peering::ReleaseSendable(uint64_t token) {
  // Tokens are unique across the domains: the one that has it gives it.
  for (const auto& h : hosts_)
    if (h->rdma)
      if (fabric::RdmaDevice::Prepared p = h->rdma->TakeWithdrawn(token); p.mr) return Wrap(h->rdma, std::move(p));
  return nullptr;
}

}  // namespace vsocket::backend
