// A guest that speaks the control protocol with raw messages (registrations,
// fences, tails it chooses), for the red-team tests: what a hostile or
// buggy library could send.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "proto/control.h"
#include "vhost/region/shm_region.h"
#include "vhost/user/frontend.h"
#include "vhost/user/protocol.h"
#include "tests/integration/control_channel.h"
#include "tests/integration/daemon_fixture.h"

namespace vsocket::testing {

inline proto::Endpoint Ep(uint8_t last, uint16_t port) {
  proto::Endpoint e;
  e.addr = {192, 0, 2, last};
  e.port = port;
  return e;
}

// The registry's view of vm's connection from local_port (to peer_port, if
// given): "mode reason".
inline std::string RegistryState(Daemon& daemon, const std::string& vm, uint16_t local_port, uint16_t peer_port = 0) {
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // events are raised by the worker
  std::string json = daemon.Command("connections --json");
  std::string key = "\"vm\":\"" + vm + "\"";
  for (size_t p = json.find(key); p != std::string::npos; p = json.find(key, p + 1)) {
    size_t start = json.rfind('{', p), end = json.find('}', p);
    std::string row = json.substr(start, end - start);
    auto port_of = [&](const char* f) {
      size_t q = row.find(std::string("\"") + f + "\":\"");
      if (q == std::string::npos) return -1;
      size_t end = row.find('"', q + std::strlen(f) + 4), colon = row.rfind(':', end);
      return std::atoi(row.c_str() + colon + 1);
    };
    if (port_of("local") != local_port || (peer_port != 0 && port_of("peer") != peer_port)) continue;
    auto field = [&](const char* f) {
      size_t q = row.find(std::string("\"") + f + "\":\"");
      if (q == std::string::npos) return std::string("?");
      q += std::strlen(f) + 4;
      return row.substr(q, row.find('"', q) - q);
    };
    return field("mode") + " " + field("reason");
  }
  return "absent: " + json;
}

class RawGuest {
 public:
  explicit RawGuest(const std::string& sock, size_t region_bytes = 4u << 20) {
    guest::ChannelOptions o;
    o.frontend.socket_path = sock;
    o.frontend.region_bytes = region_bytes;
    o.frontend.timeout_ms = 2000;
    auto ch = guest::ControlChannel::Open(o);
    if (ch.ok()) ch_ = std::move(ch).value();
    else error_ = ch.status().ToString();
    scratch_.resize(proto::kMaxMessageSize);
  }
  // Whether the session opened (else why not).
  bool ok() const { return ch_ != nullptr; }
  const std::string& error() const { return error_; }

  // The port's proof socket, bound to this session's memory (process mode:
  // vhost/user/proof.h); then Prove(fd) before registering fd's 4-tuple.
  // "" on success, else the error.
  std::string OpenProofs() {
    if (!ch_) return "no session";
    Status st = ch_->frontend().OpenProofChannel();
    return st.ok() ? "" : st.ToString();
  }
  std::string Prove(int fd) {
    if (!ch_) return "no session";
    Status st = ch_->frontend().ProveSocket(fd);
    return st.ok() ? "" : st.ToString();
  }

  // Rings for a registration (nullptr: the region is full).
  uint8_t* Alloc(uint32_t bytes) { return ch_ ? ch_->frontend().allocator().Allocate(bytes, 64) : nullptr; }

  // REGISTER_CONN with the given rings; returns the ack's reason ("" when
  // there was no ack).
  std::string Register(uint64_t id, proto::Role role, proto::Endpoint local, proto::Endpoint peer, uint8_t* tx,
                       uint32_t tx_bytes, uint8_t* rx, uint32_t rx_bytes) {
    if (!ch_ || !tx || !rx) return "";
    rings_[id] = {tx, tx_bytes};
    proto::RegisterConn r{id,       role,    local, peer, reinterpret_cast<uint64_t>(tx), reinterpret_cast<uint64_t>(rx),
                          tx_bytes, rx_bytes};
    proto::Message resp;
    if (!ch_->Call({proto::MsgType::kRegisterConn, 0, r}, &resp, scratch_).ok()) return "";
    const auto* ack = std::get_if<proto::RegisterAck>(&resp.body);
    return ack ? proto::ToString(ack->reason) : "";
  }
  std::string Register(uint64_t id, proto::Role role, proto::Endpoint local, proto::Endpoint peer,
                       uint32_t tx_bytes = 64 * 1024, uint32_t rx_bytes = 64 * 1024) {
    uint8_t* tx = Alloc(tx_bytes);
    uint8_t* rx = Alloc(rx_bytes);
    return Register(id, role, local, peer, tx, tx_bytes, rx, rx_bytes);
  }

  // FENCE with no kernel bytes, then n pattern bytes into the TX ring and
  // their TX_TAIL.
  bool FenceAndWrite(uint64_t id, uint32_t n) {
    auto it = rings_.find(id);
    if (it == rings_.end() || n > it->second.bytes) return false;
    std::memset(it->second.tx, 0x5A, n);
    return Post({proto::MsgType::kFence, 0, proto::ConnCounter{id, 0}}) &&
           Post({proto::MsgType::kTxTail, 0, proto::ConnCounter{id, n}});
  }
  // SHUTDOWN(how) for id (fire and forget).
  bool Shutdown(uint64_t id, proto::ShutdownHow how) {
    return Post({proto::MsgType::kShutdown, 0, proto::Shutdown{id, how}});
  }
  // SET_MEM_TABLE on the running session: a second (sealed) region of
  // `extra_bytes`, listed first, beside the session's own. The daemon pauses
  // the device around the message and rte_vhost maps the guest's memory
  // anew (memory that changed is unmapped and mapped again, at another
  // address if the kernel likes): what a VM's memory hotplug does. Ring
  // addresses stay valid (the first region keeps its guest addresses).
  Status AddRegion(size_t extra_bytes) {
    if (!ch_) return Status(Code::kFailedPrecondition, "no session");
    auto extra = vhost::ShmRegion::Create("vsocket-hostile-extra", extra_bytes);
    if (!extra.ok()) return extra.status();
    extra_.push_back(std::move(extra).value());
    vhost::VhostUserFrontend& fe = ch_->frontend();
    vhost::user::Payload p{};
    p.memory.nregions = 1 + static_cast<uint32_t>(extra_.size());
    std::vector<int> fds;
    uint32_t i = 0;
    for (const auto& r : extra_) {
      // Guest addresses far above the session's region: never overlapping.
      uint64_t gpa = (1ull << 46) + i * (1ull << 40);
      p.memory.regions[i++] = {gpa, r->size(), gpa, 0};
      fds.push_back(r->fd());
    }
    auto base = reinterpret_cast<uint64_t>(fe.region().base());
    p.memory.regions[i] = {base, fe.region().size(), base, 0};
    fds.push_back(fe.region().fd());
    bool ack = (fe.protocol_features() & vhost::user::kProtoReplyAck) != 0;
    vhost::user::Message m{{static_cast<uint32_t>(vhost::user::Request::kSetMemTable),
                            vhost::user::kFlagVersion | (ack ? vhost::user::kFlagNeedReply : 0u),
                            static_cast<uint32_t>(8 + p.memory.nregions * sizeof(vhost::user::MemoryRegionDesc))},
                           p};
    VS_RETURN_IF_ERROR(fe.SendMessage(m, fds));
    if (!ack) return Status::Ok();
    auto reply = fe.ReceiveReply(vhost::user::Request::kSetMemTable);
    if (!reply.ok()) return reply.status();
    if (reply->payload.u64 != 0) return Status(Code::kInternal, "SET_MEM_TABLE refused");
    return Status::Ok();
  }

  // HELLO offering `features`; the features taken (~0 if no answer).
  uint64_t Hello(uint64_t features) {
    proto::Message resp;
    proto::Hello h;
    h.features = features;
    if (!ch_ || !ch_->Call({proto::MsgType::kHello, 0, h}, &resp, scratch_).ok()) return ~uint64_t{0};
    const auto* ack = std::get_if<proto::HelloAck>(&resp.body);
    return ack ? ack->features : ~uint64_t{0};
  }
  // DOWNGRADE(reason, bytes, flags) for id, as a library's fork sends it;
  // the answer: "ok <reason>", "<wire error> <reason>", "error" (an ERROR
  // message) or "" (no answer).
  std::string Downgrade(uint64_t id, proto::Reason why, uint64_t bytes, uint8_t flags) {
    proto::Message resp;
    if (!ch_ || !ch_->Call({proto::MsgType::kDowngrade, 0, proto::Downgrade{id, why, bytes, flags}}, &resp, scratch_).ok())
      return "";
    if (resp.type == proto::MsgType::kError) return "error";
    const auto* ack = std::get_if<proto::RegisterAck>(&resp.body);
    if (ack == nullptr) return "";
    return std::string(ack->status == proto::WireError::kOk ? "ok" : proto::ToString(ack->status)) + " " +
           proto::ToString(ack->reason);
  }

  // Process mode: guest-physical == virtual (decision 3), so the request
  // queue's descriptor table is where it is mapped here.
  uint64_t RequestRingGpa() {
    return ch_ ? reinterpret_cast<uint64_t>(ch_->frontend().queue(0).ring().desc()) : 0;
  }
  // Its session's memory region, [gpa, gpa + len) (process mode: gpa == address).
  proto::MemRange Region() {
    if (!ch_) return {};
    return {reinterpret_cast<uint64_t>(ch_->frontend().region().base()), ch_->frontend().region().size()};
  }
  // vsocketd's flag in its request ring: it waits for the agent's limit.
  bool NeedsLimit() { return ch_ && ch_->frontend().queue(0).DeviceNeedsLimit(); }
  // LIMIT_MEMORY (decision 130): "OK", the answer's wire error, or "".
  std::string LimitMemory(uint64_t device_ring_gpa, std::vector<proto::MemRange> ranges) {
    proto::LimitMemory l{device_ring_gpa, static_cast<uint32_t>(ranges.size()), {}};
    for (size_t i = 0; i < ranges.size() && i < proto::kLimitMaxRanges; ++i) l.ranges[i] = ranges[i];
    proto::Message resp;
    if (!ch_ || !ch_->Call({proto::MsgType::kLimitMemory, 0, l}, &resp, scratch_).ok()) return "";
    const auto* ack = std::get_if<proto::RegisterAck>(&resp.body);
    return ack ? proto::ToString(ack->status) : "";
  }
  // VOUCH (decision 100): "OK", the answer's wire error, or "" (no answer).
  std::string Vouch(uint64_t device_ring_gpa, proto::Endpoint local, proto::Endpoint peer) {
    proto::Message resp;
    if (!ch_ || !ch_->Call({proto::MsgType::kVouch, 0, proto::Vouch{device_ring_gpa, local, peer}}, &resp, scratch_).ok())
      return "";
    const auto* ack = std::get_if<proto::RegisterAck>(&resp.body);
    return ack ? proto::ToString(ack->status) : "";
  }

  std::string Unregister(uint64_t id) {
    proto::Message resp;
    if (!ch_ || !ch_->Call({proto::MsgType::kUnregister, 0, proto::Unregister{id}}, &resp, scratch_).ok()) return "";
    const auto* ack = std::get_if<proto::RegisterAck>(&resp.body);
    return ack ? proto::ToString(ack->reason) : "";
  }

 private:
  // A request without an answer: submitted, then its completion reaped.
  bool Post(const proto::Message& m) {
    if (!ch_ || !ch_->Submit(m, ++cookie_).ok()) return false;
    ch_->Flush();
    std::vector<guest::ControlChannel::Completion> done;
    for (int i = 0; i < 100; ++i) {
      done.clear();
      if (!ch_->Reap(&done, 50).ok()) continue;
      for (const auto& c : done)
        if (c.cookie == cookie_) return true;
    }
    return false;
  }

  struct Ring {
    uint8_t* tx;
    uint32_t bytes;
  };
  std::unique_ptr<guest::ControlChannel> ch_;
  std::vector<std::unique_ptr<vhost::ShmRegion>> extra_;  // AddRegion's
  std::string error_;
  std::vector<uint8_t> scratch_;
  std::map<uint64_t, Ring> rings_;
  uint64_t cookie_ = 0;
};

}  // namespace vsocket::testing
