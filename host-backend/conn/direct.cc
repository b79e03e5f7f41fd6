// Direct pairs (decision 97): a same-host pair whose two processes may
// share memory gets a ring pair of its own, made here and fetched by each
// library on its proof channel; vsocketd then moves none of its bytes.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>

#include <algorithm>

#include "base/log.h"
#include "host-backend/conn/address.h"
#include "host-backend/conn/conn_manager.h"
#include "proto/direct.h"

namespace vsocket::backend {

struct DirectPage {
  void* at = MAP_FAILED;
  ~DirectPage() {
    if (at != MAP_FAILED) munmap(at, proto::kDirectRingsOffset);
  }
  uint64_t produced(int side) const {
    const auto* s = reinterpret_cast<const proto::DirectSide*>(static_cast<const uint8_t*>(at) +
                                                               proto::kDirectSideOffset[side & 1]);
    return __atomic_load_n(&s->produced, __ATOMIC_RELAXED);
  }
};

namespace {

using Direct = vhost::PortConfig::Direct;

// Whether the VM's setting lets its connection share memory with that peer.
bool Lets(Direct d, bool same_vm) { return d == Direct::kSameTenant || (d == Direct::kSameVm && same_vm); }

// Whether two VMs' settings let a connection of one share a pair with a
// process of the other (the same VM: a == b). Process mode only: the memory
// and fds go over the proof channel (a QEMU VM's processes get theirs from
// its agent: not yet).
bool PortsLet(const vhost::PortConfig* a, const vhost::PortConfig* b) {
  if (a == nullptr || b == nullptr || !vhost::DirectCapable(*a) || !vhost::DirectCapable(*b)) return false;
  bool same_vm = a->index == b->index;
  return Lets(a->direct, same_vm) && Lets(b->direct, same_vm);
}

uint64_t NewToken() {
  uint64_t t = 0;
  while (t == 0)
    if (getrandom(&t, sizeof(t), 0) != static_cast<ssize_t>(sizeof(t))) t = 0;
  return t;
}

}  // namespace

bool ConnManager::DirectAllowed(const BackendConn& a, const BackendConn& b) const {
  if (!a.takes_direct || !b.takes_direct || a.device == nullptr || b.device == nullptr) return false;
  if (a.key.tenant != b.key.tenant) return false;  // (never paired anyway)
  return PortsLet(a.device->port(), b.device->port()) && a.device->call_fd(1) >= 0 && b.device->call_fd(1) >= 0;
}

bool ConnManager::DirectPossible(const BackendConn& c) const {
  if (!c.takes_direct || c.device == nullptr) return false;
  const vhost::PortConfig* mine = c.device->port();
  // A loopback peer is a process of the same VM.
  return PortsLet(mine, IsLoopback(c.key.peer) ? mine : LocalPortFor(c.key.tenant, c.key.peer));
}

void ConnManager::DeclineDirect(BackendConn& c) {
  c.reason = proto::Reason::kKernelFaster;
  // (Before any upgrade: the library takes it as a withdrawal. Its fallback
  // is counted as the DOWNGRADE goes out, events.cc.)
  Raise(c, kEvDowngrade);
  counters_.direct_declined.fetch_add(1, std::memory_order_relaxed);
}

void ConnManager::MaybeGoDirect(BackendConn& a, BackendConn& b) {
  if (!DirectAllowed(a, b)) return;
  uint32_t ring = std::min({a.tx.size, a.rx.size, b.tx.size, b.rx.size});
  auto memory = proto::MakeDirectMemory(ring, a.conn_id, b.conn_id);
  DirectOffer oa, ob;
  if (memory.ok()) {
    oa = {a.device, a.handle, UniqueFd(fcntl(memory->get(), F_DUPFD_CLOEXEC, 0)),
          UniqueFd(fcntl(b.device->call_fd(1), F_DUPFD_CLOEXEC, 0)), 0};
    ob = {b.device, b.handle, std::move(*memory), UniqueFd(fcntl(a.device->call_fd(1), F_DUPFD_CLOEXEC, 0)), 1};
  }
  if (!memory.ok() || !oa.memory || !oa.wake || !ob.wake) {
    counters_.direct_failed.fetch_add(1, std::memory_order_relaxed);
    VS_LOG(kWarn, "conn %lu <-> %lu: no direct ring pair (%s): through vsocketd",
           static_cast<unsigned long>(a.handle), static_cast<unsigned long>(b.handle),
           memory.ok() ? "dup failed" : memory.status().ToString().c_str());
    return;
  }
  auto page = std::make_shared<DirectPage>();
  page->at = mmap(nullptr, proto::kDirectRingsOffset, PROT_READ, MAP_SHARED, ob.memory.get(), 0);
  if (page->at != MAP_FAILED) {
    a.direct_page = b.direct_page = page;
    a.direct_side = 0;
    b.direct_side = 1;
    a.direct_counted = b.direct_counted = 0;
  }
  a.ev_direct_token = NewToken();
  b.ev_direct_token = NewToken();
  {
    MutexLock lock(direct_mu_);
    direct_offers_[a.ev_direct_token] = std::move(oa);
    direct_offers_[b.ev_direct_token] = std::move(ob);
  }
  a.direct = b.direct = true;
  counters_.direct_pairs.fetch_add(1, std::memory_order_relaxed);
  Raise(a, kEvDirect);
  Raise(b, kEvDirect);
}

void ConnManager::CountDirect(BackendConn& c) {
  if (!c.direct_page) return;
  uint64_t produced = c.direct_page->produced(c.direct_side);
  if (produced <= c.direct_counted) return;
  uint64_t n = produced - c.direct_counted;
  c.direct_counted = produced;
  c.accel_bytes_out.fetch_add(n, std::memory_order_relaxed);
  vm_totals_[c.vm_index % kMaxVms].accel_bytes_out.fetch_add(n, std::memory_order_relaxed);
  if (c.peer != nullptr) {
    c.peer->accel_bytes_in.fetch_add(n, std::memory_order_relaxed);
    vm_totals_[c.peer->vm_index % kMaxVms].accel_bytes_in.fetch_add(n, std::memory_order_relaxed);
  }
  counters_.direct_bytes.fetch_add(n, std::memory_order_relaxed);
}

void ConnManager::CountAllDirect() {
  for (auto& [h, c] : conns_)
    if (c->direct_page) CountDirect(*c);
}

Status ConnManager::FetchDirect(const vhost::BackendDevice* device, uint64_t token, vhost::DirectGrant* out) {
  MutexLock lock(direct_mu_);
  auto it = direct_offers_.find(token);
  if (it == direct_offers_.end() || it->second.device != device)
    return Status(Code::kNotFound, "no direct pair for that token here");
  out->memory = std::move(it->second.memory);
  out->wake = std::move(it->second.wake);
  out->side = it->second.side;
  direct_offers_.erase(it);
  return Status::Ok();
}

void ConnManager::DropDirectOffers(uint64_t handle) {
  MutexLock lock(direct_mu_);
  std::erase_if(direct_offers_, [&](const auto& kv) { return kv.second.handle == handle; });
}

}  // namespace vsocket::backend
