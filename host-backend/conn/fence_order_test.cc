// A FENCE takes effect only once the guest can see it was taken (decision
// 124): ConnManager::Handle has the request returned and published
// (RequestTaker::TakeFirst) before anything the FENCE causes can reach the
// peer, its library or another host. A guest whose backend dies then knows
// from its own used ring whether its peer can have that FENCE.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "base/log.h"
#include "host-backend/conn/conn_manager.h"
#include "host-backend/conn/test_guests.h"
#include "vhost/backend/backend_device.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {
namespace {

using proto::Message;
using proto::MsgType;
using testing::Loopback;

constexpr uint64_t kBase = 1u << 20;
constexpr uint32_t kRing = 1u << 16;

class FenceOrderTest : public ::testing::Test {
 protected:
  // What the worker does at TakeFirst; here: what the FENCE had done by then.
  struct Taker final : RequestTaker {
    explicit Taker(FenceOrderTest* t) : test(t) {}
   protected:
    void TakeFirst() override {
      ++calls;
      kernel_out_then = test->KernelOut(1);
    }

   public:
    FenceOrderTest* test;
    int calls = 0;
    int64_t kernel_out_then = -1;
  };

  FenceOrderTest() : mem1_(2 * kRing), mem2_(2 * kRing) {
    SetLogLevel(LogLevel::kError);
    port_.vm_name = "vm";
    port_.tenant_id = 7;
    port_.prove_sockets = false;
    dev1_ = testing::AttachedDevice(cm_, 1, &port_, mem1_, kBase);
    dev2_ = testing::AttachedDevice(cm_, 2, &port_, mem2_, kBase);
    EXPECT_TRUE(testing::Register(cm_, *dev1_, 1, proto::Role::kClient, Loopback(40000), Loopback(80), kBase,
                                  kBase + kRing, kRing));
    EXPECT_TRUE(testing::Register(cm_, *dev2_, 2, proto::Role::kServer, Loopback(80), Loopback(40000), kBase,
                                  kBase + kRing, kRing));
  }
  // The kernel bytes the connection's FENCE said (0 before it), -1 if unknown.
  int64_t KernelOut(uint64_t device_id) {
    for (const ConnSnapshot& s : cm_.Snapshot())
      if (s.device_id == device_id) return static_cast<int64_t>(s.kernel_out);
    return -1;
  }

  vhost::PortConfig port_;
  std::vector<uint8_t> mem1_, mem2_;
  ConnManager cm_;
  std::shared_ptr<vhost::BackendDevice> dev1_, dev2_;
};

TEST_F(FenceOrderTest, AFenceIsTakenBeforeItDoesAnything) {
  Taker taker(this);
  Message reply;
  EXPECT_EQ(cm_.Handle(*dev1_, Message{MsgType::kFence, 0, proto::ConnCounter{1, 4096}}, &reply, &taker),
            RequestResult::kNoReply);
  EXPECT_EQ(taker.calls, 1);
  EXPECT_EQ(taker.kernel_out_then, 0) << "the FENCE acted before the guest could see it taken";
  EXPECT_EQ(KernelOut(1), 4096);
}

TEST_F(FenceOrderTest, OtherRequestsAreReturnedAfterTheyActAsBefore) {
  Taker taker(this);
  Message reply;
  (void)cm_.Handle(*dev1_, Message{MsgType::kFence, 0, proto::ConnCounter{1, 0}}, &reply);
  (void)cm_.Handle(*dev1_, Message{MsgType::kTxTail, 0, proto::ConnCounter{1, 100}}, &reply, &taker);
  (void)cm_.Handle(*dev1_, Message{MsgType::kPairingQuery, 9, proto::ConnCounter{1, 0}}, &reply, &taker);
  EXPECT_EQ(taker.calls, 0);
}

}  // namespace
}  // namespace vsocket::backend
