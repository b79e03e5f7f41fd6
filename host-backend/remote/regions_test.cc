// One-sided RDMA placement and live migration (decision 88, issue 36
// deliverable 1): a guest RX ring registered for a peer host's NIC to
// write into is taken out of use when the VM's dirty log goes on, and is
// not registered again while the VM is copied, since a NIC's write is
// marked only when its completion reaches vsocketd (and not at all after
// the switchover). In process, with a fabric that registers (as the rdma
// one does) but has no link: the guest's connection asks a peer host to
// pair and its RX ring is registered meanwhile.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "base/log.h"
#include "host-backend/conn/conn_manager.h"
#include "host-backend/conn/test_guests.h"
#include "host-backend/remote/frame.h"
#include "host-backend/remote/remote_hosts.h"
#include "proto/control.h"
#include "proto/fabric.h"
#include "vhost/backend/backend_device.h"

namespace vsocket::backend {
namespace {

constexpr uint32_t kTenant = 7;
constexpr uint32_t kPeerHost = 1;

class FakeRegistration : public MemoryRegistration {};

// Host 1 runs 192.0.2.0/24 of tenant 7; it registers (as rdma does) and
// has no link up.
class RegisteringHosts : public RemoteHosts {
 public:
  uint32_t Locate(uint32_t tenant, const proto::Endpoint& addr) override {
    return tenant == kTenant && addr.addr[0] == 192 ? kPeerHost : 0;
  }
  bool Runs(uint32_t host, uint32_t tenant, const proto::Endpoint& addr) override {
    return host == kPeerHost && Locate(tenant, addr) == kPeerHost;
  }
  bool SendPairing(uint32_t, const proto::FrameHeader& h, std::span<const uint8_t>) override {
    if (h.type == proto::FrameType::kPairRequest) requested = h.value;
    return true;
  }
  fabric::Link* LinkTo(uint32_t, uint64_t) override { return nullptr; }
  RegisterFn Registering(uint32_t, void*, size_t, bool remote_write) override {
    if (remote_write) rx_asked.fetch_add(1);
    return []() -> Result<Registration> { return Registration(std::make_unique<FakeRegistration>()); };
  }
  Status Adopt(uint32_t, Registration*, uint32_t* rkey) override {
    *rkey = 42;
    return Status::Ok();
  }
  std::atomic<int> rx_asked{0};  // RX registrations asked of the registrar
  uint64_t requested = 0;        // the handle of the last PAIR_REQUEST's connection
};

class RxRegistrationTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kBase = 1u << 20;
  static constexpr uint32_t kRing = 1u << 16;
  RxRegistrationTest() : mem_(2 * kRing) {
    SetLogLevel(LogLevel::kError);
    port_.vm_name = "vm";
    port_.tenant_id = kTenant;
    port_.prove_sockets = false;
    vhost::VmAddress a;
    a.addr = {198, 51, 100, 2};
    port_.addresses = {a};
    ports_.push_back(port_);
    cm_.SetRemoteHosts(&hosts_);
    cm_.SetLocalPorts(&ports_);
    dev_ = testing::AttachedDevice(cm_, 1, &ports_[0], mem_, kBase);
    (void)cm_.OnHello(*dev_, proto::kFeatureRingHold | proto::kFeatureCleanDowngrade | proto::kFeatureFenceDelivered);
  }
  ~RxRegistrationTest() override { cm_.OnHostDown(kPeerHost); }

  // The guest's client connection to 192.0.2.9:80 (on host 1), which
  // host 1 accepts (its connection 77).
  void Connect() {
    ASSERT_TRUE(testing::Register(cm_, *dev_, 1, proto::Role::kClient, testing::Ipv4({198, 51, 100, 2}, 40000),
                                  testing::Ipv4({192, 0, 2, 9}, 80), kBase, kBase + kRing, kRing));
    ASSERT_NE(hosts_.requested, 0u) << "no PAIR_REQUEST to host 1";
    proto::PairInfo info;
    info.local = testing::Ipv4({192, 0, 2, 9}, 80);
    info.peer = testing::Ipv4({198, 51, 100, 2}, 40000);
    info.role = proto::Role::kServer;
    std::array<uint8_t, proto::kPairInfoSize> body;
    proto::EncodePairInfo(info, body.data());
    proto::FrameHeader h = Frame(proto::FrameType::kPairAccept, kTenant, hosts_.requested, 77, kRing);
    h.len = proto::kPairInfoSize;
    cm_.OnPairingFrame(kPeerHost, h, body);
  }
  // The worker's passes until `done` (at most 5 s).
  template <typename F>
  bool PumpUntil(F done) {
    for (int i = 0; i < 5000 && !done(); ++i) {
      (void)cm_.PumpLinks();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return done();
  }
  uint64_t Registered() const { return cm_.counters().rdma_rx_regions.load(); }
  // A reconfiguration of the running device (QEMU's SET_FEATURES and
  // SET_LOG_BASE when a migration begins or ends), as VhostBackend's
  // OnPreMessage/OnPostMessage bracket it: detached, reloaded, attached.
  void Reconfigure(bool logging) {
    cm_.OnDetach(*dev_);
    dev_->SetLoggingForTesting(logging);
    cm_.OnAttach(*dev_);
  }

  RegisteringHosts hosts_;
  vhost::PortConfig port_;
  std::vector<vhost::PortConfig> ports_;
  std::vector<uint8_t> mem_;
  ConnManager cm_;
  std::shared_ptr<vhost::BackendDevice> dev_;
};

TEST_F(RxRegistrationTest, ALiveMigrationTakesTheRxRingOutOfOneSidedUseUntilItEnds) {
  Connect();
  ASSERT_EQ(hosts_.rx_asked.load(), 1) << "the RX ring is registered while the pairing request travels";
  ASSERT_TRUE(PumpUntil([&] { return Registered() == 1; }));
  // The migration begins: the registration goes (the next PLACEMENT would
  // withdraw it from the peer), and none is asked again while logging.
  Reconfigure(true);
  EXPECT_EQ(cm_.counters().rdma_rx_regions_dropped.load(), 1u);
  EXPECT_EQ(hosts_.rx_asked.load(), 1) << "an RX ring registered for one-sided writes while the VM is copied";
  for (int i = 0; i < 20; ++i) (void)cm_.PumpLinks();
  EXPECT_EQ(Registered(), 1u);
  // Another reconfiguration during the copy (the rings' log flag): still none.
  Reconfigure(true);
  EXPECT_EQ(hosts_.rx_asked.load(), 1);
  // Cancelled: the log goes off with the device running here; registered again.
  Reconfigure(false);
  EXPECT_EQ(hosts_.rx_asked.load(), 2);
  EXPECT_TRUE(PumpUntil([&] { return Registered() == 2; }));
}

TEST_F(RxRegistrationTest, ARegistrationUnderWayWhenTheLogGoesOnIsNotPutInUse) {
  Connect();
  ASSERT_EQ(hosts_.rx_asked.load(), 1);
  // The log goes on before the registrar's answers are applied (the jobs
  // may be done already: they wait for the worker's pass). Both rings'
  // registrations were made for the mapping before the reconfiguration:
  // discarded; the RX ring's is not asked for again while logging.
  Reconfigure(true);
  EXPECT_TRUE(PumpUntil([&] { return cm_.counters().rdma_reg_discarded.load() >= 1; }))
      << "discarded " << cm_.counters().rdma_reg_discarded.load() << ", registered " << Registered() << ", asked "
      << hosts_.rx_asked.load() << ", dropped " << cm_.counters().rdma_rx_regions_dropped.load();
  for (int i = 0; i < 20; ++i) (void)cm_.PumpLinks();
  EXPECT_EQ(Registered(), 0u) << "a registration made for the ring came into use while the VM is copied";
  EXPECT_EQ(hosts_.rx_asked.load(), 1) << "asked again while the VM is copied";
}

}  // namespace
}  // namespace vsocket::backend
