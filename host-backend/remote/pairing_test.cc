// Pairing requests from peer hosts, in process (no guest device: none of
// them finds its connection registered yet, so each is kept until our
// guest registers or refused). Neither one peer host nor one tenant may
// crowd the table of kept requests so that others' are refused (issue 17,
// finding 6).
#include <gtest/gtest.h>

#include <array>
#include <span>
#include <vector>

#include "base/log.h"
#include "host-backend/conn/conn_manager.h"
#include "host-backend/remote/frame.h"
#include "host-backend/remote/remote_hosts.h"
#include "proto/fabric.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {
namespace {

using proto::Endpoint;
using proto::FrameHeader;
using proto::FrameType;

constexpr uint32_t kTenant = 7;

Endpoint V4(uint8_t last, uint16_t port) {
  Endpoint e;
  e.family = proto::Family::kIpv4;
  e.addr = {192, 0, 2, last};
  e.port = port;
  return e;
}

Endpoint Ours(uint16_t port) {
  Endpoint e = V4(0, port);
  e.addr = {198, 51, 100, 2};
  return e;
}

constexpr uint32_t kOtherTenant = 8;

// Peer hosts 1 to 4 all run tenants 7 and 8 at 192.0.2.x; every frame sent
// to a host is recorded.
class FakeHosts : public RemoteHosts {
 public:
  uint32_t Locate(uint32_t, const Endpoint&) override { return 0; }
  bool Runs(uint32_t host, uint32_t tenant, const Endpoint& addr) override {
    return host >= 1 && host <= 4 && (tenant == kTenant || tenant == kOtherTenant) && addr.addr[0] == 192;
  }
  bool SendPairing(uint32_t host, const FrameHeader& h, std::span<const uint8_t>) override {
    sent.push_back({host, h});
    return true;
  }
  fabric::Link* LinkTo(uint32_t, uint64_t) override { return nullptr; }
  // As a directory whose etcd is unreachable: no address it does not place
  // can be placed now.
  bool DirectoryCannotPlace(uint32_t, const Endpoint&) override { return directory_down; }
  // As an etcd directory, followed by a watch (decision 104).
  bool DirectoryMayLag() const override { return directory_lags; }

  std::vector<std::pair<uint32_t, FrameHeader>> sent;
  bool directory_down = false;
  bool directory_lags = false;
};

class PairingTest : public ::testing::Test {
 protected:
  PairingTest() {
    SetLogLevel(LogLevel::kError);
    vhost::PortConfig p;
    p.path = "/nonexistent/vm.sock";
    p.vm_name = "vm";
    p.tenant_id = kTenant;
    p.addresses.push_back({4, Ours(0).addr});
    ports_.push_back(p);
    // Tenant 8's VM has the same address (tenants may overlap).
    p.path = "/nonexistent/vm8.sock";
    p.vm_name = "vm8";
    p.tenant_id = kOtherTenant;
    p.index = 1;
    ports_.push_back(p);
    cm_.SetRemoteHosts(&hosts_);
    cm_.SetLocalPorts(&ports_);
  }
  ~PairingTest() override {
    for (uint32_t host = 1; host <= 4; ++host) cm_.OnHostDown(host);
  }

  // host asks to pair its connection from 192.0.2.<last>:port (its handle)
  // with our guest's 198.51.100.2:80; true if it was answered at once (a
  // PAIR_REJECT), false if the request was kept.
  bool Request(uint32_t host, uint8_t last, uint16_t port, uint32_t tenant = kTenant) {
    int64_t why = Ask(host, last, port, tenant);
    if (why < 0) return false;
    EXPECT_EQ(why, static_cast<int64_t>(proto::Reason::kResourceLimit));
    return true;
  }
  // The same; the reason of the PAIR_REJECT it was answered with at once,
  // -1 if the request was kept.
  int64_t Ask(uint32_t host, uint8_t last, uint16_t port, uint32_t tenant = kTenant) {
    proto::PairInfo info;
    info.local = V4(last, port);
    info.peer = Ours(80);
    info.role = proto::Role::kClient;
    std::array<uint8_t, proto::kPairInfoSize> body;
    proto::EncodePairInfo(info, body.data());
    FrameHeader h = Frame(FrameType::kPairRequest, tenant, 0, (uint64_t{host} << 32) | port, 1u << 16);
    h.len = proto::kPairInfoSize;
    size_t before = hosts_.sent.size();
    cm_.OnPairingFrame(host, h, body);
    if (hosts_.sent.size() == before) return -1;
    EXPECT_EQ(hosts_.sent.back().first, host);
    EXPECT_EQ(hosts_.sent.back().second.type, FrameType::kPairReject);
    return hosts_.sent.back().second.aux;
  }
  void Apply(ConnManager::VmOp op, proto::Reason why = proto::Reason::kOperator) {
    uint64_t seq = cm_.RequestVmOp(0, op, why);
    EXPECT_TRUE(cm_.ApplyDrainRequests());
    EXPECT_EQ(cm_.drains_applied(), seq);
  }

  FakeHosts hosts_;
  std::vector<vhost::PortConfig> ports_;
  ConnManager cm_;
};

TEST_F(PairingTest, OnePeerHostCannotCrowdOutAnother) {
  // Host 1 asks for 20,000 connections our guests never register, half of
  // each tenant (so no tenant reaches its own share).
  int refused = 0;
  for (int i = 0; i < 20000; ++i)
    refused += Request(1, 1, static_cast<uint16_t>(10000 + i / 2), i % 2 ? kOtherTenant : kTenant);
  EXPECT_EQ(refused, 20000 - 16384) << "one host keeps at most a quarter of the table";
  // Host 2's requests are still kept.
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(Request(2, 200, static_cast<uint16_t>(10000 + i))) << i;
  // Host 1 going down gives its share back.
  cm_.OnHostDown(1);
  EXPECT_FALSE(Request(1, 1, 40000));
}

// One tenant cannot crowd out another either, even with its requests spread
// over every peer host (each within its host's quarter).
TEST_F(PairingTest, OneTenantCannotCrowdOutAnother) {
  // Tenant 7 asks for 8,192 connections from each of the four hosts: the
  // first two fill its share, the other two's are all refused.
  int refused = 0;
  for (uint32_t host = 1; host <= 4; ++host)
    for (int i = 0; i < 8192; ++i)
      refused += Request(host, static_cast<uint8_t>(host), static_cast<uint16_t>(10000 + i));
  EXPECT_EQ(refused, 2 * 8192) << "one tenant keeps at most a quarter of the table";
  // Tenant 8's requests are still kept, from every host.
  for (uint32_t host = 1; host <= 4; ++host)
    for (int i = 0; i < 25; ++i)
      EXPECT_FALSE(Request(host, 100, static_cast<uint16_t>(10000 + i), kOtherTenant)) << host << " " << i;
  // A host going down gives its part of tenant 7's share back.
  EXPECT_TRUE(Request(3, 3, 40000));
  cm_.OnHostDown(1);
  EXPECT_FALSE(Request(3, 3, 40000));
}

// A guest that moves away (vsocketctl migrate begin): requests kept for it
// are refused "moved" when it leaves, so that their hosts ask again where
// their locators say. A VM away from here may be about to arrive (or a
// requester's locator is not updated yet): requests for it are kept, never
// refused as cross-tenant, and are there for its guest once it runs here
// (migrate end).
TEST_F(PairingTest, AVmThatLeavesRefusesWhatWasKeptForItAsMoved) {
  EXPECT_EQ(Ask(1, 1, 5000), -1);  // kept: our guest has not registered yet
  Apply(ConnManager::VmOp::kDrain, proto::Reason::kMigration);
  EXPECT_EQ(Ask(1, 1, 5001), -1);  // draining: still kept (it may undrain)
  hosts_.sent.clear();
  Apply(ConnManager::VmOp::kLeave);
  EXPECT_TRUE(cm_.away(0));
  ASSERT_EQ(hosts_.sent.size(), 2u) << "both kept requests refused as moved";
  for (const auto& [host, h] : hosts_.sent) {
    EXPECT_EQ(host, 1u);
    EXPECT_EQ(h.type, FrameType::kPairReject);
    EXPECT_EQ(h.aux, static_cast<uint32_t>(proto::Reason::kMigration));
  }
  EXPECT_EQ(cm_.counters().vms_left.load(), 1u);
  EXPECT_EQ(cm_.counters().pair_moved.load(), 2u);
  EXPECT_EQ(Ask(2, 200, 5002), -1);  // away: kept (it may be arriving)
  // Undrain does not bring a VM that left back; migrate end does.
  Apply(ConnManager::VmOp::kUndrain);
  EXPECT_TRUE(cm_.away(0));
  Apply(ConnManager::VmOp::kArrive);
  EXPECT_FALSE(cm_.away(0));
  EXPECT_EQ(cm_.draining(0), proto::Reason::kNone);
  EXPECT_EQ(Ask(2, 200, 5004), -1);
  EXPECT_EQ(cm_.counters().vms_arrived.load(), 1u);
  // An address no VM here has stays a cross-tenant refusal.
  proto::PairInfo info;
  info.local = V4(1, 6000);
  info.peer = V4(99, 80);
  info.role = proto::Role::kClient;
  std::array<uint8_t, proto::kPairInfoSize> body;
  proto::EncodePairInfo(info, body.data());
  FrameHeader h = Frame(FrameType::kPairRequest, kTenant, 0, 77, 1u << 16);
  h.len = proto::kPairInfoSize;
  hosts_.sent.clear();
  cm_.OnPairingFrame(1, h, body);
  ASSERT_EQ(hosts_.sent.size(), 1u);
  EXPECT_EQ(hosts_.sent[0].second.aux, static_cast<uint32_t>(proto::Reason::kCrossTenant));
}

// Decision 95: a request from an address the locator does not place on its
// host is refused as cross-tenant, unless the locator is a directory that
// cannot be asked now (etcd unreachable): then the refusal says
// directory-unavailable, so that the requester's guest reports why; for an
// address no VM here has it stays cross-tenant.
TEST_F(PairingTest, ARequesterTheDirectoryCannotPlaceIsRefusedDirectoryUnavailable) {
  // 10.0.0.x is placed on no host (FakeHosts::Runs: 192.x only).
  auto ask_from_unplaced = [&](Endpoint peer) {
    proto::PairInfo info;
    info.local = V4(1, 7000);
    info.local.addr = {10, 0, 0, 1};
    info.peer = peer;
    info.role = proto::Role::kClient;
    std::array<uint8_t, proto::kPairInfoSize> body;
    proto::EncodePairInfo(info, body.data());
    FrameHeader h = Frame(FrameType::kPairRequest, kTenant, 0, 91, 1u << 16);
    h.len = proto::kPairInfoSize;
    hosts_.sent.clear();
    cm_.OnPairingFrame(1, h, body);
    EXPECT_EQ(hosts_.sent.size(), 1u);
    return hosts_.sent.empty() ? -1 : static_cast<int64_t>(hosts_.sent.back().second.aux);
  };
  const auto cross = static_cast<int64_t>(proto::Reason::kCrossTenant);
  const auto dir = static_cast<int64_t>(proto::Reason::kDirectoryUnavailable);
  EXPECT_EQ(ask_from_unplaced(Ours(80)), cross);
  hosts_.directory_down = true;
  EXPECT_EQ(ask_from_unplaced(Ours(80)), dir);
  EXPECT_EQ(ask_from_unplaced(V4(99, 80)), cross) << "no VM here has 192.0.2.99";
  EXPECT_EQ(cm_.counters().pair_refused.load(), 3u);
}

// Decision 104: with a directory followed by a watch, a request whose
// requester our cache does not place on its host (yet: a VM that has just
// moved there) is kept, not refused, as one for a guest not registered yet;
// with a static file, or for an address no VM here has, it is refused.
TEST_F(PairingTest, ARequesterTheDirectoryDoesNotPlaceYetWaitsForIt) {
  auto ask_from_unplaced = [&](Endpoint peer, uint16_t port) {
    proto::PairInfo info;
    info.local = V4(1, port);
    info.local.addr = {10, 0, 0, 1};  // placed on no host (FakeHosts::Runs: 192.x only)
    info.peer = peer;
    info.role = proto::Role::kClient;
    std::array<uint8_t, proto::kPairInfoSize> body;
    proto::EncodePairInfo(info, body.data());
    FrameHeader h = Frame(FrameType::kPairRequest, kTenant, 0, port, 1u << 16);
    h.len = proto::kPairInfoSize;
    hosts_.sent.clear();
    cm_.OnPairingFrame(1, h, body);
    return hosts_.sent.empty() ? -1 : static_cast<int64_t>(hosts_.sent.back().second.aux);
  };
  const auto cross = static_cast<int64_t>(proto::Reason::kCrossTenant);
  EXPECT_EQ(ask_from_unplaced(Ours(80), 7001), cross) << "a static file is as its operator wrote it";
  hosts_.directory_lags = true;
  EXPECT_EQ(ask_from_unplaced(Ours(80), 7002), -1) << "kept until the directory places the requester";
  EXPECT_EQ(ask_from_unplaced(V4(99, 80), 7003), cross) << "no VM here has 192.0.2.99";
  EXPECT_EQ(cm_.counters().pair_unconfirmed.load(), 1u);
  EXPECT_EQ(cm_.counters().pair_refused.load(), 2u);
  // The directory unreachable as well: decision 95's answer, at once.
  hosts_.directory_down = true;
  EXPECT_EQ(ask_from_unplaced(Ours(80), 7004), static_cast<int64_t>(proto::Reason::kDirectoryUnavailable));
}

// What a guest's library is told: the new reason only if it said in HELLO
// that it knows it; an older library hears peer-not-registered (kernel TCP
// for good either way). Other reasons pass as they are.
TEST(ForGuest, DirectoryUnavailableOnlyToALibraryThatKnowsIt) {
  using proto::Reason;
  EXPECT_EQ(ForGuest(Reason::kDirectoryUnavailable, true), Reason::kDirectoryUnavailable);
  EXPECT_EQ(ForGuest(Reason::kDirectoryUnavailable, false), Reason::kPeerNotRegistered);
  EXPECT_EQ(ForGuest(Reason::kKernelFaster, false), Reason::kKernelFaster);
  EXPECT_EQ(ForGuest(Reason::kFabricDown, true), Reason::kFabricDown);
}

}  // namespace
}  // namespace vsocket::backend
