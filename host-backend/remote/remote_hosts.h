// The other hosts as the connection manager sees them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "base/status.h"
#include "host-backend/fabric/link.h"
#include "proto/control.h"
#include "proto/fabric.h"

namespace vsocket::backend {

// The other hosts, as the connection manager needs them (implemented by
// Peering on the worker thread; host ids are small integers, 0 = none).
class RemoteHosts {
 public:
  virtual ~RemoteHosts() = default;
  // The peer host that runs (tenant, addr) and is reachable now, or 0.
  virtual uint32_t Locate(uint32_t tenant, const proto::Endpoint& addr) = 0;
  // Whether (tenant, addr) is located on `host` (checks what a peer claims).
  virtual bool Runs(uint32_t host, uint32_t tenant, const proto::Endpoint& addr) = 0;
  // Sends a pairing frame on the authenticated control channel.
  virtual bool SendPairing(uint32_t host, const proto::FrameHeader& h, std::span<const uint8_t> payload) = 0;
  // The data link that carries connection `conn`'s frames to `host`, while
  // the host is up. A host pair may have several links (links_per_peer);
  // each connection sends on one of them, the same one for as long as the
  // host stays up, so its frames stay in order. Frames arrive on any.
  virtual fabric::Link* LinkTo(uint32_t host, uint64_t conn) = 0;
  // rdma fabric: registers [addr, addr+len) as its own memory region that
  // peer `host` may write one-sided (returns the rkey; in that host's
  // protection domain: no other host can write there), and drops it again.
  // Other fabrics: kFailedPrecondition (the link then places the bytes).
  virtual Status RegisterRemoteWritable(uint32_t /*host*/, void* /*addr*/, size_t /*len*/, uint32_t* /*rkey*/) {
    return Status(Code::kFailedPrecondition, "fabric has no one-sided writes");
  }
  virtual void UnregisterRemoteWritable(uint32_t /*host*/, void* /*addr*/) {}
  // rdma fabric: registers [addr, addr+len) for sends to `host` to read in
  // place (a guest TX ring: no copy on the sending host). Withdraw takes it
  // out of use at once and returns a token (unique across hosts); Release
  // drops it once no posted send can read it any more. Other fabrics:
  // kFailedPrecondition (sends copy).
  virtual Status RegisterSendable(uint32_t /*host*/, void* /*addr*/, size_t /*len*/) {
    return Status(Code::kFailedPrecondition, "fabric reads no memory in place");
  }
  virtual uint64_t WithdrawSendable(uint32_t /*host*/, void* /*addr*/) { return 0; }
  virtual void ReleaseSendable(uint64_t /*token*/) {}
};

}  // namespace vsocket::backend
