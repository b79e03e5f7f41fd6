// The other hosts as the connection manager sees them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "host-backend/fabric/link.h"
#include "host-backend/remote/registrar.h"
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
  // Whether the locator is a directory that cannot place (tenant, addr) now:
  // no host in its cache, and the directory itself cannot be asked (etcd
  // unreachable). Asked once per connection that stays on kernel TCP for it
  // (decision 95); the directory counts each.
  virtual bool DirectoryCannotPlace(uint32_t /*tenant*/, const proto::Endpoint& /*addr*/) { return false; }
  // Whether the locator is a directory each host follows by a watch (etcd):
  // its cache can be a moment behind another host's, so a pairing request
  // it does not place on its sender may be one it has not heard of yet
  // (a VM that just moved there). Such a request waits for the cache
  // instead of being refused (decision 104). A static file is as its
  // operator wrote it: false.
  virtual bool DirectoryMayLag() const { return false; }
  // The peer hosts whose control channel is up now (ids).
  virtual std::vector<uint32_t> HostsUp() const { return {}; }
  // Whether this fabric copies a stream more than kernel TCP does between
  // hosts (tcp: kernel TCP plus a copy at each end), so that a bulk stream
  // across it is slower than kernel TCP (decision 62).
  virtual bool BulkSlowerThanKernel() const { return false; }
  // Sends a pairing frame on the authenticated control channel.
  virtual bool SendPairing(uint32_t host, const proto::FrameHeader& h, std::span<const uint8_t> payload) = 0;
  // The data link that carries connection `conn`'s frames to `host`, while
  // the host is up. A host pair may have several links (links_per_peer);
  // each connection sends on one of them, the same one for as long as the
  // host stays up, so its frames stay in order. Frames arrive on any.
  virtual fabric::Link* LinkTo(uint32_t host, uint64_t conn) = 0;
  // rdma fabric: a function that registers [addr, addr+len) in `host`'s
  // protection domain without putting it in use: for that host to write
  // one-sided (remote_write: a guest RX ring; no other host can write
  // there) or for sends to it to read in place (a guest TX ring). It runs
  // on the registrar's thread (registration pins memory: milliseconds),
  // so it holds what it needs and touches nothing of the worker's. Empty:
  // this fabric registers nothing (its links place the bytes, sends copy).
  virtual RegisterFn Registering(uint32_t /*host*/, void* /*addr*/, size_t /*len*/, bool /*remote_write*/) {
    return {};
  }
  // Puts a registration made by such a function in use (the rkey for the
  // peer: RX). Fails, leaving it in *r, if the host's domain is not the one
  // it was made in any more or another registration holds its address.
  virtual Status Adopt(uint32_t /*host*/, Registration* /*r*/, uint32_t* /*rkey*/) {
    return Status(Code::kFailedPrecondition, "fabric registers nothing");
  }
  // Takes c's RX registration at addr out of use; the caller destroys it
  // (the registrar's thread: deregistering unpins, as slow as pinning).
  virtual Registration TakeRemoteWritable(uint32_t /*host*/, void* /*addr*/) { return nullptr; }
  // TX: Withdraw takes it out of use at once and returns a token (unique
  // across hosts); Release takes it back once no posted send can read it.
  virtual uint64_t WithdrawSendable(uint32_t /*host*/, void* /*addr*/) { return 0; }
  virtual Registration ReleaseSendable(uint64_t /*token*/) { return nullptr; }
};

}  // namespace vsocket::backend
