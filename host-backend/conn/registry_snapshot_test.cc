// ConnManager::Snapshot() taken on another thread (the control socket's)
// while the worker registers, pairs, moves bytes between and closes
// connections. Run it under ThreadSanitizer too (tests/run_all.sh: bazel
// test --config=tsan): a report there is a data race between reporting and
// the data path.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <thread>
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

constexpr uint64_t kBase = 1u << 20;       // guest-physical start of its memory
constexpr uint32_t kRingBytes = 1u << 16;  // every ring
constexpr uint64_t kChunk = 4096;          // bytes per TX_TAIL

using testing::Loopback;

// One guest (one device, no queues: requests go straight to Handle) whose
// connections to itself the worker pairs on this host.
class SnapshotTest : public ::testing::Test {
 protected:
  SnapshotTest() : memory_(4 * kRingBytes) {
    SetLogLevel(LogLevel::kError);
    port_.path = "/nonexistent/vm.sock";
    port_.vm_name = "vm";
    port_.tenant_id = 7;
    port_.prove_sockets = false;
    device_ = testing::AttachedDevice(cm_, 1, &port_, memory_, kBase);
  }
  ~SnapshotTest() override { cm_.OnDetach(*device_); }

  Message Call(const Message& m) {
    Message reply;
    (void)cm_.Handle(*device_, m, &reply);
    return reply;
  }
  // Registers conn `id`; its rings are ring slots tx and rx of the memory.
  bool Register(uint64_t id, proto::Role role, uint16_t local, uint16_t peer, int tx, int rx) {
    return testing::Register(cm_, *device_, id, role, Loopback(local), Loopback(peer),
                             kBase + uint64_t(tx) * kRingBytes, kBase + uint64_t(rx) * kRingBytes, kRingBytes);
  }
  void Count(MsgType type, uint64_t id, uint64_t bytes) { Call(Message{type, 0, proto::ConnCounter{id, bytes}}); }
  void Unregister(uint64_t id) { Call(Message{MsgType::kUnregister, id, proto::Unregister{id}}); }
  // What the worker does with the connections between requests
  // (RequestService::Poll).
  void Pass() {
    (void)cm_.ApplyDrainRequests();
    (void)cm_.MoveData();
    cm_.ServeSnapshots();
  }

  // The worker's side, pair number `round`: connected, fenced, `steps`
  // chunks each way, closed.
  void RunPair(int round, int steps) {
    uint64_t client = 2 * uint64_t(round) + 1, server = client + 1;
    uint16_t eph = static_cast<uint16_t>(10000 + round % 50000);
    ASSERT_TRUE(Register(client, proto::Role::kClient, eph, 80, 0, 1));
    ASSERT_TRUE(Register(server, proto::Role::kServer, 80, eph, 2, 3));  // pairs with client
    Count(MsgType::kFence, client, 0);
    Count(MsgType::kFence, server, 0);
    for (int step = 1; step <= steps; ++step) {
      uint64_t total = step * kChunk;
      Count(MsgType::kTxTail, client, total);
      Count(MsgType::kTxTail, server, total);
      Pass();
      Count(MsgType::kConsumed, client, total);
      Count(MsgType::kConsumed, server, total);
      Pass();
    }
    Unregister(client);
    Unregister(server);
    Pass();
  }

  vhost::PortConfig port_;
  std::vector<uint8_t> memory_;
  std::shared_ptr<vhost::BackendDevice> device_;
  ConnManager cm_;
};

// Every snapshot is one moment of the worker: of a pair, what one side
// sent is what the other received, whenever it is taken.
TEST_F(SnapshotTest, TakenWhileTheWorkerMovesBytesShowsOneMomentOfIt) {
  constexpr int kSteps = 16;
  std::atomic<bool> done{false};
  std::atomic<int> pairs_seen{0};
  int snapshots = 0, torn = 0;
  // As the daemon runs it: a worker thread (woken by its passes alone here)
  // makes the snapshots.
  cm_.SetWorker([] {});
  std::thread control([&] {
    while (!done.load()) {
      std::vector<ConnSnapshot> s = cm_.Snapshot();
      ++snapshots;
      if (s.size() != 2 || s[0].state != ConnState::kUpgraded || s[1].state != ConnState::kUpgraded) continue;
      ++pairs_seen;
      if (s[0].accel_out != s[1].accel_in || s[1].accel_out != s[0].accel_in) ++torn;
      EXPECT_LE(s[0].tx_unacked, s[0].window);
      EXPECT_LE(s[1].tx_unacked, s[1].window);
    }
  });
  int rounds = 0;
  std::thread worker([&] {
    // 200 pairs at least, and on until the control thread caught 500 live
    // (it may get a CPU late on a busy machine), 20,000 at most.
    for (; rounds < 20000 && (rounds < 200 || pairs_seen.load() < 500); ++rounds) RunPair(rounds, kSteps);
  });
  worker.join();
  done.store(true);
  cm_.SetWorker(nullptr);  // stopped: a snapshot asked meanwhile is made by whoever asked
  control.join();
  EXPECT_EQ(torn, 0) << "of " << pairs_seen.load() << " snapshots of a pair";
  EXPECT_GT(pairs_seen.load(), 0) << "no snapshot caught a pair: the test proves nothing";
  std::printf("%d pairs, %d snapshots, %d of them of a live pair\n", rounds, snapshots, pairs_seen.load());
  EXPECT_TRUE(cm_.Snapshot().empty());
  EXPECT_EQ(cm_.counters().accel_bytes.load(), uint64_t(rounds) * kSteps * kChunk * 2);
}

}  // namespace
}  // namespace vsocket::backend
