// Two threads, one driver and one device, over one queue, sleeping on
// eventfds with notification suppression exactly as the real endpoints do.
// Every request carries a random payload and its CRC; the device checks it
// and answers with the CRC, which the driver checks. A lost notification
// shows up as a hang, caught by the bounded wait.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "proto/control.h"
#include "vhost/ring/ring_test_util.h"
#include "vhost/ring/virtqueue_device.h"
#include "vhost/ring/virtqueue_driver.h"

namespace vsocket::vhost {
namespace {

using testing::RingArena;

constexpr int kMessages = 200000;
constexpr int kSlot = 256;  // bytes per request slot

bool WaitFd(int fd, std::atomic<bool>& stop) {
  pollfd p{fd, POLLIN, 0};
  while (!stop.load()) {
    int r = poll(&p, 1, 100);
    if (r > 0) {
      uint64_t v;
      (void)!read(fd, &v, sizeof(v));
      return true;
    }
  }
  return false;
}

void RunStress(bool event_idx, uint16_t qsize) {
  RingArena arena(qsize, size_t{kSlot} * 2 * qsize);
  int kick = eventfd(0, EFD_NONBLOCK), call = eventfd(0, EFD_NONBLOCK);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> device_errors{0}, kicks{0}, calls{0};

  // The driver initializes the ring before the device may look at it (as a
  // frontend does before SET_VRING_ADDR).
  VirtqueueDriver drv(arena.ring, event_idx);
  std::thread device([&] {
    VirtqueueDevice dev(arena.ring, &arena.guest, event_idx, 0, 0);
    int done = 0;
    while (done < kMessages && !stop.load()) {
      DescChain c;
      PopResult r = dev.Pop(&c);
      if (r == PopResult::kBroken) {
        device_errors++;
        return;
      }
      if (r == PopResult::kEmpty) {
        if (dev.PublishUsed()) {
          calls++;
          uint64_t one = 1;
          (void)!write(call, &one, 8);
        }
        if (dev.EnableNotify()) continue;
        if (!WaitFd(kick, stop)) return;
        dev.DisableNotify();
        continue;
      }
      uint8_t req[kSlot];
      size_t n = c.CopyOut(req);
      uint32_t want;
      std::memcpy(&want, req, 4);
      uint32_t got = proto::Crc32c({req + 4, n - 4});
      if (got != want) device_errors++;
      c.CopyIn({reinterpret_cast<uint8_t*>(&got), 4});
      dev.Push(c.head, 4);
      ++done;
      if ((done & 7) == 0 && dev.PublishUsed()) {
        calls++;
        uint64_t one = 1;
        (void)!write(call, &one, 8);
      }
    }
    if (dev.PublishUsed()) {
      uint64_t one = 1;
      (void)!write(call, &one, 8);
    }
  });

  std::mt19937 rng(event_idx ? 1 : 2);
  std::vector<uint32_t> expect(qsize);
  int sent = 0, received = 0, mismatches = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (received < kMessages && std::chrono::steady_clock::now() < deadline) {
    bool added = false;
    while (sent < kMessages && drv.num_free() >= 2) {
      // Slot per head is unknown before Add; use the send count modulo the
      // queue size, which never exceeds in-flight capacity.
      int slot = sent % qsize;
      uint8_t* req = arena.data + slot * 2 * kSlot;
      uint8_t* resp = req + kSlot;
      size_t len = 4 + rng() % (kSlot - 4);
      for (size_t i = 4; i < len; ++i) req[i] = static_cast<uint8_t>(rng());
      uint32_t crc = proto::Crc32c({req + 4, len - 4});
      std::memcpy(req, &crc, 4);
      expect[slot] = crc;
      VirtqueueDriver::Buf out{RingArena::Gpa(req), static_cast<uint32_t>(len)};
      VirtqueueDriver::Buf in{RingArena::Gpa(resp), 4};
      ASSERT_TRUE(drv.Add({&out, 1}, {&in, 1}, slot).ok());
      ++sent;
      added = true;
    }
    if (added && drv.Publish()) {
      kicks++;
      uint64_t one = 1;
      (void)!write(kick, &one, 8);
    }
    bool got_any = false;
    while (auto u = drv.PopUsed()) {
      uint32_t v;
      std::memcpy(&v, arena.data + u->cookie * 2 * kSlot + kSlot, 4);
      if (u->len != 4 || v != expect[u->cookie]) ++mismatches;
      ++received;
      got_any = true;
    }
    ASSERT_FALSE(drv.broken()) << drv.broken_reason();
    if (!got_any && received < kMessages) {
      if (drv.EnableInterrupts()) continue;
      pollfd p{call, POLLIN, 0};
      poll(&p, 1, 1000);
      uint64_t v;
      (void)!read(call, &v, 8);
      drv.DisableInterrupts();
    }
  }
  stop = true;
  device.join();
  close(kick);
  close(call);
  EXPECT_EQ(received, kMessages) << "lost notification or message";
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(device_errors.load(), 0u);
  // Suppression must actually suppress: far fewer kicks than messages.
  EXPECT_LT(kicks.load(), static_cast<uint64_t>(kMessages));
}

TEST(VirtqueueStressTest, EventIdxTwoThreadsChecksummed) { RunStress(true, 64); }
TEST(VirtqueueStressTest, FlagsTwoThreadsChecksummed) { RunStress(false, 64); }
TEST(VirtqueueStressTest, TinyQueueWrapsOften) { RunStress(true, 2); }

}  // namespace
}  // namespace vsocket::vhost
