// fabric = rdma: the RDMA_SETUP handshake on the TLS control channel that
// connects a session's QPs (see peers.h).
#include "host-backend/peering/peers.h"

#include "base/clock.h"
#include "host-backend/fabric/rdma_link.h"
#include "host-backend/peering/control_message.h"

namespace vsocket::backend {

using proto::FrameHeader;
using proto::FrameType;

// rdma fabric: the initiator creates its QPs and offers their setups at
// once; the acceptor creates each QP when the initiator's setup for it
// arrives (OnRdmaSetup).
void Peering::StartRdmaLink(Host& h) {
  h.deadline_ms = MonotonicMs() + kSetupTimeoutMs;
  {
    MutexLock lock(h.mu);
    h.lanes.clear();
  }
  h.rdma_cq.reset();
  if (!h.initiator) {
    h.state = State::kWaitLink;
    // The initiator's setup may have come with the end of the handshake and
    // already sit in the TLS buffer, where no epoll event announces it.
    (void)ServiceUp(h);
    return;
  }
  {
    MutexLock lock(h.mu);
    h.lanes.resize(static_cast<size_t>(links_per_peer_));
  }
  for (size_t i = 0; i < h.lanes.size(); ++i) {
    Status st = CreateRdmaLane(h, i);
    if (!st.ok()) return HostDown(h, st.message());
    if (!SendRdmaSetup(h, i)) return;
  }
  h.state = State::kWaitReady;
}

// The QP of lane i, on the session's completion queue (made for all its
// lanes with the first one).
Status Peering::CreateRdmaLane(Host& h, size_t i) {
  if (!h.rdma_cq) {
    auto cq = fabric::RdmaCompletionQueue::Create(h.rdma, static_cast<int>(h.lanes.size()));
    if (!cq.ok()) return Status(cq.status().code(), "rdma completion queue: " + cq.status().message());
    h.rdma_cq = std::move(cq).value();
  }
  auto link = fabric::RdmaLink::Create(h.rdma, {}, h.rdma_cq);
  if (!link.ok()) return Status(link.status().code(), "rdma link: " + link.status().message());
  MutexLock lock(h.mu);
  h.lanes[i].rdma = link->get();
  h.lanes[i].link = std::move(link).value();
  return Status::Ok();
}

bool Peering::SendRdmaSetup(Host& h, size_t lane) {
  auto info = h.lanes[lane].rdma->LocalInfo().Encode();
  FrameHeader setup;
  setup.type = FrameType::kRdmaSetup;
  setup.len = static_cast<uint32_t>(info.size());
  setup.value = lane;
  setup.aux = static_cast<uint32_t>(h.lanes.size());
  Status st = h.tls->Send(Message(setup, info));
  if (!st.ok()) {
    HostDown(h, "control channel: " + st.message());
    return false;
  }
  return true;
}

// The peer's RDMA_SETUP for one lane (only ever on the TLS channel):
// connects our QP to its. The acceptor creates that QP, answers with its
// own setup, and once every lane is connected sends LINK_READY and is up;
// the initiator is up at LINK_READY. False if the host went down.
bool Peering::OnRdmaSetup(Host& h, const FrameHeader& hdr, std::span<const uint8_t> payload) {
  bool expected = h.initiator ? h.state == State::kWaitReady : h.state == State::kWaitLink;
  size_t i = 0;
  std::string why;
  if (!expected || !LaneOf(h, hdr, &i, &why) || (h.initiator && !h.lanes[i].rdma) || h.lanes[i].rdma_connected) {
    HostDown(h, "unexpected RDMA_SETUP on the control channel" + (why.empty() ? "" : ": " + why));
    return false;
  }
  auto info = fabric::RdmaEndpointInfo::Decode(payload);
  if (!info.ok()) {
    HostDown(h, "bad RDMA_SETUP: " + info.status().message());
    return false;
  }
  Lane& l = h.lanes[i];
  if (!l.rdma) {
    Status created = CreateRdmaLane(h, i);
    if (!created.ok()) {
      HostDown(h, created.message());
      return false;
    }
  }
  Status st = l.rdma->Connect(*info);
  if (!st.ok()) {
    HostDown(h, "rdma link: " + st.message());
    return false;
  }
  l.rdma_connected = true;
  Watch(l.link->wake_fd(), false);
  if (h.initiator) return true;
  if (!SendRdmaSetup(h, i)) return false;
  if (!AllLanes(h, true)) return true;
  FrameHeader ready;
  ready.type = FrameType::kLinkReady;
  st = h.tls->Send(Message(ready, {}));
  if (!st.ok()) {
    HostDown(h, "control channel: " + st.message());
    return false;
  }
  HostUp(h);
  return true;
}

}  // namespace vsocket::backend
