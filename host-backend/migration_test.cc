// Migrations (decision 093): which dirty-log changes drain a VM for
// reason migration and which lift that drain; an operator's drain is never
// taken over. The worker's part is ConnManager::ApplyDrainRequests, run
// here by hand. And ConnManager::LeaveWithVm (decisions 106, 110): what a
// device that stops with its log on says to its VM's other devices, and to
// a peer in another VM.
#include "host-backend/migration.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/log.h"
#include "host-backend/conn/test_guests.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {
namespace {

using proto::Reason;

class MigrationsTest : public ::testing::Test {
 protected:
  MigrationsTest()
      : migrations_(&cm_, &counters_, [this](const vhost::PortConfig& vm, bool here) {
          presence_.push_back((here ? "here " : "left ") + vm.vm_name);
        }) {
    SetLogLevel(LogLevel::kError);
    port_.vm_name = "vm";
    port_.index = 3;
    dev1_ = std::make_shared<vhost::BackendDevice>(-1, 1, &port_);
    dev2_ = std::make_shared<vhost::BackendDevice>(-1, 2, &port_);
  }
  Reason Applied() {
    (void)cm_.ApplyDrainRequests();
    return cm_.draining(port_.index);
  }

  ConnManager cm_;
  MigrationCounters counters_;
  Migrations migrations_;
  vhost::PortConfig port_;
  std::shared_ptr<vhost::BackendDevice> dev1_, dev2_;
  std::vector<std::string> presence_;  // what the directory was told
};

TEST_F(MigrationsTest, TheFirstLogOnDrainsTheVmAndTheLastLogOffLiftsIt) {
  migrations_.DirtyLogChanged(*dev1_, true);
  EXPECT_EQ(Applied(), Reason::kMigration);
  migrations_.DirtyLogChanged(*dev2_, true);
  migrations_.DirtyLogChanged(*dev1_, false);
  EXPECT_EQ(Applied(), Reason::kMigration);  // dev2 still logs: still copied
  migrations_.DirtyLogChanged(*dev2_, false);
  EXPECT_EQ(Applied(), Reason::kNone);  // cancelled: the connections pair again
  EXPECT_EQ(counters_.drains.load(), 1u);
  EXPECT_EQ(counters_.undrains.load(), 1u);
}

TEST_F(MigrationsTest, DevicesStoppingWithTheirLogOnLiftTheDrainOnceAllStopped) {
  migrations_.DirtyLogChanged(*dev1_, true);
  migrations_.DirtyLogChanged(*dev2_, true);
  dev1_->set_stopping();
  migrations_.DirtyLogChanged(*dev1_, false);  // the switchover, one device at a time
  EXPECT_EQ(Applied(), Reason::kMigration);
  dev2_->set_stopping();
  migrations_.DirtyLogChanged(*dev2_, false);
  EXPECT_EQ(Applied(), Reason::kNone);  // a VM that comes back starts undrained
}

TEST_F(MigrationsTest, AnOperatorsDrainIsNeitherTakenOverNorLifted) {
  (void)cm_.RequestDrain(port_.index, true, Reason::kOperator);
  EXPECT_EQ(Applied(), Reason::kOperator);
  migrations_.DirtyLogChanged(*dev1_, true);
  EXPECT_EQ(Applied(), Reason::kOperator);
  migrations_.DirtyLogChanged(*dev1_, false);
  EXPECT_EQ(Applied(), Reason::kOperator);
  EXPECT_EQ(counters_.drains.load(), 0u);
  EXPECT_EQ(counters_.undrains.load(), 0u);
}

TEST_F(MigrationsTest, ALogTurnedOnTwiceCountsOnce) {
  migrations_.DirtyLogChanged(*dev1_, true);
  migrations_.DirtyLogChanged(*dev1_, true);
  migrations_.DirtyLogChanged(*dev1_, false);
  EXPECT_EQ(Applied(), Reason::kNone);
  EXPECT_EQ(counters_.drains.load(), 1u);
}

// Decision 116: the directory follows a QEMU migration. The destination's
// VM (incoming) is published when its first device starts, once.
TEST_F(MigrationsTest, AnIncomingVmIsPublishedWhenItsFirstDeviceStarts) {
  port_.incoming = true;
  EXPECT_TRUE(presence_.empty());
  migrations_.OnAttach(*dev1_);
  migrations_.OnAttach(*dev2_);
  migrations_.OnAttach(*dev1_);  // (again after a reconfiguration)
  EXPECT_EQ(presence_, std::vector<std::string>{"here vm"});
  EXPECT_EQ(counters_.published.load(), 1u);
}

// The source: the last logging device's stop (the switchover) withdraws the
// VM, once; a device of it that starts here again (the migration failed
// after the switchover, or the VM came back) publishes it again.
TEST_F(MigrationsTest, TheSwitchoverWithdrawsTheVmAndADeviceThatStartsAgainPublishesIt) {
  migrations_.OnAttach(*dev1_);
  migrations_.OnAttach(*dev2_);
  EXPECT_TRUE(presence_.empty());  // configured here: published at vsocketd's start
  migrations_.DirtyLogChanged(*dev1_, true);
  migrations_.DirtyLogChanged(*dev2_, true);
  dev1_->set_stopping();
  migrations_.DirtyLogChanged(*dev1_, false);
  EXPECT_TRUE(presence_.empty());  // dev2 still runs: not switched over yet
  dev2_->set_stopping();
  migrations_.DirtyLogChanged(*dev2_, false);
  EXPECT_EQ(presence_, std::vector<std::string>{"left vm"});
  EXPECT_EQ(counters_.withdrawn.load(), 1u);
  auto dev3 = std::make_shared<vhost::BackendDevice>(-1, 3, &port_);
  migrations_.OnAttach(*dev3);
  EXPECT_EQ(presence_, (std::vector<std::string>{"left vm", "here vm"}));
  EXPECT_EQ(counters_.published.load(), 1u);
}

// A cancelled migration (the log off with the devices running) and a stop
// without the log (a guest process that exits) change nothing.
TEST_F(MigrationsTest, ACancelledMigrationOrAStopWithoutTheLogLeavesTheDirectoryAlone) {
  migrations_.DirtyLogChanged(*dev1_, true);
  migrations_.DirtyLogChanged(*dev1_, false);
  dev2_->set_stopping();
  migrations_.OnDetach(*dev2_);
  EXPECT_TRUE(presence_.empty());
  EXPECT_EQ(counters_.withdrawn.load(), 0u);
}

// Decision 106: a same-VM pair on the rings whose devices stop with their
// log on (the switchover). Two functions of one VM, a client on the first
// and a server on the second, paired and streaming through the worker.
// Decision 110 (peer_elsewhere): the server in another VM of this host,
// and the moving VM with a second, idle function (dev3).
class LeaveWithVmTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kBase = 1u << 20;
  static constexpr uint32_t kRing = 1u << 16;
  explicit LeaveWithVmTest(bool peer_elsewhere = false) : mem1_(2 * kRing), mem2_(2 * kRing), mem3_(2 * kRing) {
    SetLogLevel(LogLevel::kError);
    port_.vm_name = "vm";
    port_.index = 3;
    port_.tenant_id = 7;
    port_.prove_sockets = false;
    if (peer_elsewhere) {
      port_.addresses = {Vm(1)};
      port2_ = port_;
      port2_.vm_name = "vm2";
      port2_.index = 4;
      port2_.addresses = {Vm(2)};
    }
    dev1_ = Device(1, mem1_, &port_);
    dev2_ = Device(2, mem2_, peer_elsewhere ? &port2_ : &port_);
    if (peer_elsewhere) dev3_ = Device(3, mem3_, &port_);
    uint8_t a = peer_elsewhere ? 1 : 0, b = peer_elsewhere ? 2 : 0;
    EXPECT_TRUE(Register(*dev1_, 1, proto::Role::kClient, Addr(40000, a), Addr(80, b)));
    EXPECT_TRUE(Register(*dev2_, 2, proto::Role::kServer, Addr(80, b), Addr(40000, a)));
    Count(*dev1_, proto::MsgType::kFence, 1, 0);
    Count(*dev2_, proto::MsgType::kFence, 2, 0);
    // 4 KiB moved to the server; 4 KiB more written, not moved yet.
    Count(*dev1_, proto::MsgType::kTxTail, 1, 4096);
    Pass();
    Count(*dev1_, proto::MsgType::kTxTail, 1, 8192);
  }
  std::shared_ptr<vhost::BackendDevice> Device(uint64_t id, std::vector<uint8_t>& mem, vhost::PortConfig* port) {
    return testing::AttachedDevice(cm_, id, port, mem, kBase);
  }
  // 127.0.0.1, or 192.0.2.VM (a VM's own address).
  static proto::Endpoint Addr(uint16_t port, uint8_t vm = 0) {
    return vm == 0 ? testing::Loopback(port) : testing::Ipv4({192, 0, 2, vm}, port);
  }
  static vhost::VmAddress Vm(uint8_t vm) {
    vhost::VmAddress a;
    a.addr = {192, 0, 2, vm};
    return a;
  }
  bool Register(vhost::BackendDevice& d, uint64_t id, proto::Role role, proto::Endpoint local, proto::Endpoint peer) {
    return testing::Register(cm_, d, id, role, local, peer, kBase, kBase + kRing, kRing);
  }
  void Count(vhost::BackendDevice& d, proto::MsgType type, uint64_t id, uint64_t bytes) {
    proto::Message reply;
    (void)cm_.Handle(d, proto::Message{type, 0, proto::ConnCounter{id, bytes}}, &reply);
  }
  void Pass() {
    (void)cm_.ApplyDrainRequests();
    (void)cm_.MoveData();
  }
  // A device stopping, as VhostBackend::OnDestroyDevice hands it over.
  void Stop(vhost::BackendDevice& d, bool logging) {
    d.SetLoggingForTesting(logging);
    d.set_stopping();
    cm_.OnDetach(d);
    Pass();
  }
  // The server's bytes in (moved into its RX ring), -1 once it is gone.
  int64_t ServerIn() {
    for (const ConnSnapshot& s : cm_.Snapshot())
      if (s.device_id == 2) return static_cast<int64_t>(s.accel_in);
    return -1;
  }
  // The reason the server's end was last given (its DOWNGRADE's).
  Reason ServerReason() {
    for (const ConnSnapshot& s : cm_.Snapshot())
      if (s.device_id == 2) return s.reason;
    return Reason::kNone;
  }

  vhost::PortConfig port_, port2_;
  std::vector<uint8_t> mem1_, mem2_, mem3_;
  ConnManager cm_;
  std::shared_ptr<vhost::BackendDevice> dev1_, dev2_, dev3_;
};

class PeerOutsideTheVmTest : public LeaveWithVmTest {
 protected:
  PeerOutsideTheVmTest() : LeaveWithVmTest(true) {}
};

TEST_F(LeaveWithVmTest, ASwitchoverTellsTheVmsOwnPeerNothing) {
  ASSERT_EQ(ServerIn(), 4096);
  Stop(*dev1_, true);
  EXPECT_EQ(ServerIn(), 4096);  // its last 4 KiB stay in the guest's TX ring, which moved
  EXPECT_FALSE(cm_.ExpireLeftWithVm());
  Stop(*dev2_, true);
  EXPECT_EQ(ServerIn(), -1);
  EXPECT_EQ(cm_.counters().migration_leaves.load(), 2u);
  EXPECT_EQ(cm_.counters().orphan_bytes.load(), 0u);
}

TEST_F(LeaveWithVmTest, AProcessThatExitsDuringThePreCopyIsAClose2sLater) {
  Stop(*dev1_, true);
  EXPECT_EQ(ServerIn(), 4096);
  EXPECT_EQ(cm_.counters().orphan_bytes.load(), 4096u);  // kept, as for any close
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));  // (kLeftWithVmMs: its peer's device still runs)
  EXPECT_TRUE(cm_.ExpireLeftWithVm());
  Pass();
  EXPECT_EQ(ServerIn(), 8192);  // then delivered, as after any exit
  EXPECT_EQ(cm_.counters().migration_leaves.load(), 0u);
}

TEST_F(LeaveWithVmTest, AStopWithoutTheLogIsAnExitAsBefore) {
  Stop(*dev1_, false);
  EXPECT_EQ(ServerIn(), 8192);
  EXPECT_FALSE(cm_.ExpireLeftWithVm());
  EXPECT_EQ(cm_.counters().migration_leaves.load(), 0u);
}

// Decision 110: the server, in another VM, is told the accelerated path
// is gone (fabric-down: it resyncs on kernel TCP) once the moving VM's last
// device stopped; the 4 KiB not moved stay in the guest's TX ring (resent
// where it runs now), never delivered, and no close reaches the server.
TEST_F(PeerOutsideTheVmTest, ASwitchoverTellsAPeerInAnotherVmToResync) {
  ASSERT_EQ(ServerIn(), 4096);
  ASSERT_EQ(ServerReason(), Reason::kNone);
  Stop(*dev1_, true);
  EXPECT_EQ(ServerReason(), Reason::kNone);  // dev3 still runs: not known to be a move yet
  Stop(*dev3_, true);                        // the VM's last device: it moved
  EXPECT_EQ(ServerIn(), 4096);
  EXPECT_EQ(ServerReason(), Reason::kFabricDown);
  EXPECT_EQ(cm_.counters().migration_leaves.load(), 1u);
  EXPECT_EQ(cm_.counters().migration_peers_resynced.load(), 1u);
  EXPECT_EQ(cm_.counters().orphan_bytes.load(), 0u);
  EXPECT_FALSE(cm_.ExpireLeftWithVm());
}

// A device of the moving VM that stops with its log on while the VM's other
// device runs on for 2 s was a process that exited during the pre-copy: its
// peer in the other VM gets its last bytes, then its close, as before.
TEST_F(PeerOutsideTheVmTest, AProcessThatExitsDuringThePreCopyIsAClose2sLater) {
  Stop(*dev1_, true);
  EXPECT_EQ(ServerIn(), 4096);
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));  // (kLeftWithVmMs)
  EXPECT_TRUE(cm_.ExpireLeftWithVm());
  Pass();
  EXPECT_EQ(ServerIn(), 8192);
  EXPECT_NE(ServerReason(), Reason::kFabricDown);
  EXPECT_EQ(cm_.counters().migration_peers_resynced.load(), 0u);
}

}  // namespace
}  // namespace vsocket::backend
