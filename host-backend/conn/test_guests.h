// Unit tests of ConnManager: guests without queues (requests go straight to
// ConnManager::Handle), their memory in the test's own vectors.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "host-backend/conn/conn_manager.h"
#include "vhost/backend/backend_device.h"

namespace vsocket::backend::testing {

inline proto::Endpoint Ipv4(std::array<uint8_t, 4> a, uint16_t port) {
  proto::Endpoint e;
  e.family = proto::Family::kIpv4;
  e.addr = {a[0], a[1], a[2], a[3]};
  e.port = port;
  return e;
}

inline proto::Endpoint Loopback(uint16_t port) { return Ipv4({127, 0, 0, 1}, port); }

// Device `id` of `port`, its guest memory `mem` at guest-physical `base`,
// attached to cm.
inline std::shared_ptr<vhost::BackendDevice> AttachedDevice(ConnManager& cm, uint64_t id, vhost::PortConfig* port,
                                                            std::vector<uint8_t>& mem, uint64_t base) {
  auto d = std::make_shared<vhost::BackendDevice>(-1, id, port);
  auto m = vhost::GuestMemory::Create({{base, mem.size(), mem.data()}});
  if (m.ok()) d->SetMemoryForTesting(std::move(m).value());
  cm.OnAttach(*d);
  return d;
}

// REGISTER_CONN of connection `id` on d, its rings `ring` bytes each at
// tx_gpa and rx_gpa: true if vsocketd accepted it.
inline bool Register(ConnManager& cm, vhost::BackendDevice& d, uint64_t id, proto::Role role, proto::Endpoint local,
                     proto::Endpoint peer, uint64_t tx_gpa, uint64_t rx_gpa, uint32_t ring) {
  proto::RegisterConn r;
  r.conn_id = id;
  r.role = role;
  r.local = local;
  r.peer = peer;
  r.tx_ring_gpa = tx_gpa;
  r.rx_ring_gpa = rx_gpa;
  r.tx_ring_bytes = r.rx_ring_bytes = ring;
  proto::Message ack;
  (void)cm.Handle(d, proto::Message{proto::MsgType::kRegisterConn, id, r}, &ack);
  auto* a = std::get_if<proto::RegisterAck>(&ack.body);
  return a != nullptr && a->status == proto::WireError::kOk;
}

}  // namespace vsocket::backend::testing
