// Migrations (decision 093): which dirty-log changes drain a VM for
// reason migration and which lift that drain; an operator's drain is never
// taken over. The worker's part is ConnManager::ApplyDrainRequests, run
// here by hand.
#include "host-backend/migration.h"

#include <gtest/gtest.h>

#include <memory>

#include "base/log.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {
namespace {

using proto::Reason;

class MigrationsTest : public ::testing::Test {
 protected:
  MigrationsTest() : migrations_(&cm_, &counters_) {
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

}  // namespace
}  // namespace vsocket::backend
