// libFuzzer target for what a peer host's frames reach after the framing:
// the control channel's messages (each checked by DecodeFrameHeader and its
// length as Peering::ServiceUp does, then PAIR_REQUEST/ACCEPT/REJECT/CANCEL
// into ConnManager::OnPairingFrame with their PairInfo bodies, RDMA_SETUP
// bodies into RdmaEndpointInfo::Decode) and the data links' frames into
// ConnManager's link sinks, from two peer hosts, interleaved.
//
// The manager has this host's VMs (tenant 7, 198.51.100.2 and 2001:db8::2)
// and believes peer host 1 runs 192.0.2.1 and 2001:db8::1 of tenant 7 (the
// addresses of proto/fuzz/fabric_samples.cc), but no registered connection:
// connections need a guest device (rte_vhost), which this target has not.
//
// Input: records of [u8 how][u16 little-endian length][that many bytes].
// how bit 0: 0 = a control-channel message, 1 = a frame on a data link;
// bit 1: the host (1 or 2); bits 2-3: the link; 0xff: the host goes down.
// Properties: no crash, no leak; an RDMA_SETUP body that decodes re-encodes
// to the same bytes; every pairing request is answered with at most one
// frame, and only on the control channel of the host that asked.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "base/log.h"
#include "host-backend/conn/conn_manager.h"
#include "host-backend/fabric/rdma_link.h"
#include "host-backend/remote/remote_hosts.h"
#include "proto/fabric.h"
#include "vhost/backend/vhost_backend.h"

namespace {

using vsocket::backend::ConnManager;
using vsocket::proto::Endpoint;
using vsocket::proto::FrameHeader;
using vsocket::proto::FrameType;
using vsocket::proto::kFrameHeaderSize;

constexpr uint32_t kTenant = 7;

Endpoint V4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  Endpoint e;
  e.family = vsocket::proto::Family::kIpv4;
  e.addr = {a, b, c, d};
  return e;
}
Endpoint V6(uint8_t last) {
  Endpoint e;
  e.family = vsocket::proto::Family::kIpv6;
  e.addr = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, last};
  return e;
}

class FakeHosts : public vsocket::backend::RemoteHosts {
 public:
  uint32_t Locate(uint32_t, const Endpoint&) override { return 0; }
  bool Runs(uint32_t host, uint32_t tenant, const Endpoint& addr) override {
    Endpoint a = addr;
    a.port = 0;
    return host == 1 && tenant == kTenant && (a == V4(192, 0, 2, 1) || a == V6(1));
  }
  bool SendPairing(uint32_t host, const FrameHeader& h, std::span<const uint8_t>) override {
    if (host != asking_) std::abort();  // an answer goes to the host that asked
    ++sent_;
    (void)h;
    return true;
  }
  vsocket::fabric::Link* LinkTo(uint32_t, uint64_t) override { return nullptr; }

  uint32_t asking_ = 0;
  int sent_ = 0;
};

std::vector<vsocket::vhost::PortConfig> LocalPorts() {
  vsocket::vhost::PortConfig p;
  p.path = "/nonexistent/vm.sock";
  p.vm_name = "vm";
  p.tenant_id = kTenant;
  p.addresses.push_back({4, V4(198, 51, 100, 2).addr});
  p.addresses.push_back({6, V6(2).addr});
  return {p};
}

void ControlMessage(ConnManager& cm, FakeHosts& hosts, uint32_t host, std::span<const uint8_t> m) {
  // Peering::ServiceUp: a message that is not one whole frame takes the
  // host down.
  if (m.size() < kFrameHeaderSize) return cm.OnHostDown(host);
  auto h = vsocket::proto::DecodeFrameHeader(m.first<kFrameHeaderSize>());
  if (!h.ok() || h->len != m.size() - kFrameHeaderSize) return cm.OnHostDown(host);
  std::span<const uint8_t> payload = m.subspan(kFrameHeaderSize);
  switch (h->type) {
    case FrameType::kRdmaSetup: {
      auto info = vsocket::fabric::RdmaEndpointInfo::Decode(payload);
      if (info.ok()) {
        auto again = info->Encode();
        if (payload.size() != again.size() || std::memcmp(again.data(), payload.data(), again.size()) != 0)
          std::abort();
      }
      return;
    }
    case FrameType::kPairRequest:
    case FrameType::kPairAccept:
    case FrameType::kPairReject:
    case FrameType::kPairCancel:
    case FrameType::kPairDecline: {
      hosts.asking_ = host;
      int before = hosts.sent_;
      cm.OnPairingFrame(host, *h, payload);
      if (hosts.sent_ - before > 1) std::abort();
      hosts.asking_ = 0;
      return;
    }
    default: return;
  }
}

void LinkFrame(ConnManager& cm, uint32_t host, uint32_t link, std::span<const uint8_t> m) {
  // What a link hands its sink (stream_link_fuzz covers how it gets there).
  if (m.size() < kFrameHeaderSize) return;
  auto h = vsocket::proto::DecodeFrameHeader(m.first<kFrameHeaderSize>());
  if (!h.ok()) return;
  vsocket::fabric::FrameSink& sink = cm.LinkSink(host, link);
  if (h->type == FrameType::kData) {
    vsocket::fabric::PayloadDest d = sink.OnHeader(*h);
    if (d.n != 0) std::abort();  // no connection: nowhere to land
    if (m.size() > kFrameHeaderSize) {
      d = sink.OnResume(*h, 0);
      if (d.n != 0) std::abort();
    }
    sink.OnFrame(*h, {});
    return;
  }
  std::span<const uint8_t> payload = m.subspan(kFrameHeaderSize);
  if (payload.size() != h->len) return;
  sink.OnFrame(*h, payload);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vsocket::SetLogLevel(vsocket::LogLevel::kError);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // One manager for the whole run, as in the daemon (building one costs
  // ~0.2 s under ASan): every input ends with both hosts down, which leaves
  // nothing of it behind but counters (no connection ever registers here).
  static const std::vector<vsocket::vhost::PortConfig> kPorts = LocalPorts();
  static FakeHosts hosts;
  static ConnManager& cm = *[] {
    auto* m = new ConnManager();
    m->SetRemoteHosts(&hosts);
    m->SetLocalPorts(&kPorts);
    return m;
  }();
  size_t pos = 0;
  while (size - pos >= 3) {
    uint8_t how = data[pos];
    size_t len = std::min<size_t>(data[pos + 1] | data[pos + 2] << 8, size - pos - 3);
    std::span<const uint8_t> m(data + pos + 3, len);
    pos += 3 + len;
    uint32_t host = 1 + ((how >> 1) & 1);
    if (how == 0xff) {
      cm.OnHostDown(host);
    } else if (how & 1) {
      LinkFrame(cm, host, (how >> 2) & 3, m);
    } else {
      ControlMessage(cm, hosts, host, m);
    }
  }
  cm.OnHostDown(1);
  cm.OnHostDown(2);
  return 0;
}
