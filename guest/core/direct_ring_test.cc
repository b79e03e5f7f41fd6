// A direct pair's memory (decision 97) as two sides see it: counts and
// bytes across, the wake asks, the checks that keep a hostile peer's
// writes to its own connection, and a byte stream between two processes.
#include "guest/core/direct_ring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "base/asym_fence.h"
#include "proto/direct.h"

namespace vsocket::guest {
namespace {

constexpr uint32_t kRing = 64 * 1024;

struct Pair {
  UniqueFd fd;
  std::unique_ptr<DirectRing> a, b;  // side 0, side 1
  Pair() {
    auto m = proto::MakeDirectMemory(kRing, 11, 22);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    fd = std::move(*m);
    auto ra = DirectRing::Map(fd.get(), 0);
    auto rb = DirectRing::Map(fd.get(), 1);
    EXPECT_TRUE(ra.ok() && rb.ok());
    a = std::move(*ra);
    b = std::move(*rb);
  }
  proto::DirectSide* side(int s) const {
    // (What a hostile peer can reach: all of it.)
    return reinterpret_cast<proto::DirectSide*>(a->tx() - proto::DirectRingOffset(0, kRing) +
                                                proto::kDirectSideOffset[s]);
  }
};

// The fence after one ring's ask, as a sleeper on that ring alone.
void FenceAsk(DirectRing* r) {
  DirectRing::FenceAsks(&r, &r + 1, [](DirectRing* d) { return d; });
}

// Wakes whoever sleeps on eventfd efd.
void Poke(int efd) {
  uint64_t one = 1;
  (void)!write(efd, &one, sizeof one);
}

void Put(uint8_t* ring, uint64_t at, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) ring[(at + i) & (kRing - 1)] = p[i];
}
void Get(const uint8_t* ring, uint64_t at, uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = ring[(at + i) & (kRing - 1)];
}

TEST(DirectRing, BytesAndCountsCrossBothWays) {
  Pair p;
  const char msg[] = "hello across";
  Put(p.a->tx(), 0, reinterpret_cast<const uint8_t*>(msg), sizeof msg);
  EXPECT_FALSE(p.a->PublishProduced(sizeof msg)) << "nobody asked to be woken";
  auto seen = p.b->ReadPeer(0, 0, 0, 0);
  ASSERT_TRUE(seen.ok()) << seen.status().ToString();
  EXPECT_EQ(seen->produced, sizeof msg);
  EXPECT_FALSE(seen->shut_wr);
  EXPECT_EQ(seen->ring_end, proto::kDirectOpen);
  char got[sizeof msg];
  Get(p.b->rx(), 0, reinterpret_cast<uint8_t*>(got), sizeof got);
  EXPECT_STREQ(got, msg);
  p.b->PublishConsumed(sizeof msg);
  auto back = p.a->ReadPeer(0, 0, sizeof msg, 0);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->consumed, sizeof msg);
  p.a->PublishShutWr();
  EXPECT_TRUE(p.b->ReadPeer(sizeof msg, sizeof msg, 0, 0)->shut_wr);
}

TEST(DirectRing, AWakeIsOwedOnlyWhenTheOtherSideAskedAndOnlyOnce) {
  Pair p;
  p.b->WantProduced();
  EXPECT_TRUE(p.a->PublishProduced(1));
  EXPECT_FALSE(p.a->PublishProduced(2)) << "the ask was taken";
  p.a->WantConsumed();
  EXPECT_FALSE(p.b->PublishProduced(1)) << "asked for room, not bytes";
  EXPECT_TRUE(p.b->PublishConsumed(1));
  p.b->WantProduced();
  EXPECT_TRUE(p.a->PublishShutWr()) << "an EOF wakes a reader too";
}

// Decision 134: the fence word decides, once, whether a side switched onto
// the pair before the other left it. Whoever changes it first wins; the
// loser learns it (the sender does not switch, or the leaver takes the
// FENCE), so a RESYNC header is sent exactly where it is expected.
TEST(DirectRing, TheFenceWordIsDecidedOnceByWhoeverComesFirst) {
  {
    Pair p;  // the sender first: the leaver takes its FENCE
    bool wake;
    EXPECT_TRUE(p.a->PublishFence(46, &wake));
    uint64_t f = 0;
    EXPECT_TRUE(p.b->CloseFence(&f));
    EXPECT_EQ(f, 46u);
    EXPECT_TRUE(p.b->Load().fence_set);
  }
  {
    Pair p;  // the leaver first: the sender never switches
    uint64_t f = 0;
    EXPECT_FALSE(p.b->CloseFence(&f));
    bool wake = true;
    EXPECT_FALSE(p.a->PublishFence(46, &wake));
    EXPECT_FALSE(wake);
    EXPECT_FALSE(p.b->Load().fence_set);  // (closed, not a FENCE)
    EXPECT_FALSE(p.b->CloseFence(&f));    // (and stays so)
  }
  {
    Pair p;  // a value the peer made up is no FENCE
    p.side(0)->fence_set = 7;
    uint64_t f = 0;
    EXPECT_FALSE(p.b->CloseFence(&f));
    EXPECT_FALSE(p.b->Load().fence_set);
  }
}

// The attached word (decision 135): a side that mapped says so once; a
// side leaving the pair before its peer mapped it decides the peer never
// will, and the peer, mapping late, learns it must not use the pair. So a
// RESYNC of the leaver's ring stream has a header exactly when the peer
// reads the pair.
TEST(DirectRing, TheAttachedWordIsDecidedOnceByWhoeverComesFirst) {
  {
    Pair p;  // mapped first: the leaver resends with a header
    EXPECT_FALSE(p.a->PeerAttached());
    EXPECT_TRUE(p.b->Attach());
    EXPECT_TRUE(p.b->Attach());  // (again: still so)
    EXPECT_TRUE(p.a->PeerAttached());
    EXPECT_FALSE(p.a->ClosePeerAttach());
  }
  {
    Pair p;  // the leaver first: the late side never uses the pair
    EXPECT_TRUE(p.a->ClosePeerAttach());
    EXPECT_TRUE(p.a->ClosePeerAttach());  // (and stays so)
    EXPECT_FALSE(p.b->Attach());
    EXPECT_FALSE(p.a->PeerAttached());
  }
  {
    Pair p;  // a value the peer made up: not attached for our linger, no late map
    p.side(1)->attached = 7;
    EXPECT_FALSE(p.a->PeerAttached());
    EXPECT_FALSE(p.a->ClosePeerAttach());  // (the usual RESYNC, with a header)
    EXPECT_FALSE(p.b->Attach());
  }
}

TEST(DirectRing, MemoryWithoutItsSealsOrOfTheWrongShapeIsRefused) {
  UniqueFd plain(memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(ftruncate(plain.get(), proto::DirectBytes(kRing)), 0);
  auto r = DirectRing::Map(plain.get(), 0);
  EXPECT_EQ(r.status().code(), Code::kPermissionDenied);
  // Sealed but of the wrong size for the ring its header names.
  UniqueFd wrong(memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(ftruncate(wrong.get(), proto::DirectBytes(kRing) + 4096), 0);
  proto::DirectHeader h{proto::kDirectMagic, proto::kDirectVersion, 0, kRing, 0, {1, 2}, {}};
  ASSERT_EQ(pwrite(wrong.get(), &h, sizeof h, 0), static_cast<ssize_t>(sizeof h));
  ASSERT_EQ(fcntl(wrong.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  EXPECT_EQ(DirectRing::Map(wrong.get(), 0).status().code(), Code::kInvalidArgument);
  auto good = proto::MakeDirectMemory(kRing, 1, 2);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(DirectRing::Map(good->get(), 2).status().code(), Code::kInvalidArgument);
  // The peer cannot shrink it under us (SIGBUS) nor seal it against writes.
  EXPECT_NE(ftruncate(good->get(), 4096), 0);
  EXPECT_NE(fcntl(good->get(), F_ADD_SEALS, F_SEAL_WRITE), 0);
}

TEST(DirectRing, EveryImpossibleCountOfThePeerIsDataLoss) {
  Pair p;
  proto::DirectSide* a = p.side(0);
  // b has taken 100 bytes of a's (rx_tail 100) and consumed 40; b wrote 30.
  struct Case {
    const char* what;
    uint64_t produced, consumed, ring_end;
  } cases[] = {
      {"produced went back", 99, 0, proto::kDirectOpen},
      {"produced overfills the ring", 40 + kRing + 1, 0, proto::kDirectOpen},
      {"consumed beyond what b wrote", 100, 31, proto::kDirectOpen},
      {"ring end before what b took", 100, 0, 50},
      {"produced beyond its ring end", 120, 0, 110},
  };
  for (const Case& c : cases) {
    a->produced = c.produced;
    a->consumed = c.consumed;
    a->ring_end = c.ring_end;
    auto r = p.b->ReadPeer(/*rx_head=*/40, /*rx_tail=*/100, /*tx_tail=*/30, /*credit=*/0);
    EXPECT_EQ(r.status().code(), Code::kDataLoss) << c.what;
  }
  a->produced = 40 + kRing;  // exactly full: fine
  a->consumed = 30;
  a->ring_end = proto::kDirectOpen;
  EXPECT_TRUE(p.b->ReadPeer(40, 100, 30, 0).ok());
  // The header is read once: a rewritten ring size changes nothing.
  auto* h = reinterpret_cast<proto::DirectHeader*>(p.a->tx() - proto::kDirectRingsOffset);
  h->ring_bytes = 1u << 30;
  EXPECT_EQ(p.b->ring_bytes(), kRing);
}

// One process writes a stream into its ring, the other reads and checks it,
// each sleeping on an eventfd when it must wait and woken only when it asked.
TEST(DirectRing, AByteStreamBetweenTwoProcessesIsExact) {
  Pair p;
  UniqueFd wake_reader(eventfd(0, EFD_CLOEXEC)), wake_writer(eventfd(0, EFD_CLOEXEC));
  constexpr uint64_t kTotal = 16u << 20;
  auto byte = [](uint64_t i) { return static_cast<uint8_t>((i * 2654435761u) >> 13); };
  auto sleep_on = [](int efd) {
    pollfd pf{efd, POLLIN, 0};
    if (poll(&pf, 1, 1000) == 1) {
      uint64_t v;
      (void)!read(efd, &v, sizeof v);
    }
  };
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The writer: side 0.
    std::mt19937 rng(7);
    uint64_t tail = 0, credit = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (tail < kTotal && std::chrono::steady_clock::now() < deadline) {
      auto peer = p.a->ReadPeer(0, 0, tail, credit);
      if (!peer.ok()) _exit(2);
      credit = peer->consumed;
      uint64_t room = kRing - (tail - credit);
      if (room == 0) {
        p.a->WantConsumed();
        FenceAsk(p.a.get());
        if (p.a->ReadPeer(0, 0, tail, credit)->consumed == credit) sleep_on(wake_writer.get());
        continue;
      }
      uint64_t n = std::min<uint64_t>({room, 1 + rng() % 9000, kTotal - tail});
      for (uint64_t i = 0; i < n; ++i) p.a->tx()[(tail + i) & (kRing - 1)] = byte(tail + i);
      tail += n;
      if (p.a->PublishProduced(tail)) Poke(wake_reader.get());
    }
    if (p.a->PublishShutWr()) Poke(wake_reader.get());
    _exit(tail == kTotal ? 0 : 1);
  }
  // The reader: side 1.
  uint64_t head = 0, rx_tail = 0, wrong = 0, sleeps = 0;
  bool eof = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!eof && std::chrono::steady_clock::now() < deadline) {
    auto peer = p.b->ReadPeer(head, rx_tail, 0, 0);
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    rx_tail = peer->produced;
    if (rx_tail == head) {
      if (peer->shut_wr) {
        eof = true;
        break;
      }
      p.b->WantProduced();
      FenceAsk(p.b.get());
      auto again = p.b->ReadPeer(head, rx_tail, 0, 0);
      if (again.ok() && again->produced == rx_tail && !again->shut_wr) {
        ++sleeps;
        sleep_on(wake_reader.get());
      }
      continue;
    }
    for (uint64_t i = head; i < rx_tail; ++i) wrong += p.b->rx()[i & (kRing - 1)] != byte(i);
    head = rx_tail;
    if (p.b->PublishConsumed(head)) Poke(wake_writer.get());
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "writer status " << status;
  EXPECT_TRUE(eof);
  EXPECT_EQ(head, kTotal);
  EXPECT_EQ(wrong, 0u);
  RecordProperty("reader_sleeps", static_cast<int>(sleeps));
}

// A writer process publishes a byte at a time, a microsecond or so apart,
// and wakes the reader whenever it asked; the reader reads what is there
// and asks and sleeps as soon as nothing is: its ask and its last look race
// the writer's count and its look at the ask, hundreds of thousands of
// times. A wake-up that does not come (each missed the other's store) shows
// as a sleep that lasts its whole timeout while the writer is still
// writing. With light publishes (both sides promised heavy asks: the
// writer goes light after 64 publishes that found no ask, the reader's
// asks then fence with membarrier) and with full fences.
class DirectRingRace : public ::testing::TestWithParam<bool> {};

TEST_P(DirectRingRace, NoWakeUpIsLost) {
  bool light = GetParam();
  if (light && !AsymFenceReady()) GTEST_SKIP() << "no membarrier(GLOBAL_EXPEDITED) here";
  Pair p;
  if (light) {
    p.a->PromiseHeavyAsks();
    p.b->PromiseHeavyAsks();
  }
  UniqueFd wake_reader(eventfd(0, EFD_CLOEXEC)), wake_writer(eventfd(0, EFD_CLOEXEC));
  constexpr uint64_t kBytes = 300000;
  auto busy = [](uint32_t n) {
    for (volatile uint32_t i = 0; i < n; ++i) {
    }
  };
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The writer: side 0.
    std::mt19937 rng(11);
    uint64_t tail = 0, credit = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (tail < kBytes && std::chrono::steady_clock::now() < deadline) {
      if (tail - credit == kRing) {
        auto peer = p.a->ReadPeer(0, 0, tail, credit);
        if (!peer.ok()) _exit(2);
        credit = peer->consumed;
        continue;
      }
      p.a->tx()[tail & (kRing - 1)] = static_cast<uint8_t>(tail);
      if (p.a->PublishProduced(++tail)) Poke(wake_reader.get());
      busy(rng() % 400);
    }
    if (p.a->PublishShutWr()) Poke(wake_reader.get());
    // (Light: it must have published without fences at some time.)
    _exit(tail != kBytes ? 1 : light && !p.a->went_light() ? 3 : 0);
  }
  // The reader: side 1.
  uint64_t head = 0, asks = 0, lost = 0, wrong = 0;
  bool eof = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!eof && std::chrono::steady_clock::now() < deadline) {
    auto peer = p.b->ReadPeer(head, head, 0, 0);
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    if (peer->produced == head) {
      if (peer->shut_wr) {
        eof = true;
        break;
      }
      p.b->WantProduced();
      FenceAsk(p.b.get());
      ++asks;
      auto again = p.b->ReadPeer(head, head, 0, 0);
      if (again->produced != head || again->shut_wr) continue;
      pollfd pf{wake_reader.get(), POLLIN, 0};
      if (poll(&pf, 1, 50) == 0) ++lost;
      uint64_t v;
      (void)!read(wake_reader.get(), &v, sizeof v);
      continue;
    }
    for (uint64_t i = head; i < peer->produced; ++i) wrong += p.b->rx()[i & (kRing - 1)] != static_cast<uint8_t>(i);
    head = peer->produced;
    (void)p.b->PublishConsumed(head);  // (the writer never sleeps: it polls for room)
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "writer status " << status << " (exit 3: never published lightly)";
  EXPECT_TRUE(eof);
  EXPECT_EQ(head, kBytes);
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(lost, 0u) << "of " << asks << " asks, " << lost << " slept out their timeout: wake-ups lost";
  RecordProperty("asks", static_cast<int>(asks));
}

INSTANTIATE_TEST_SUITE_P(Fences, DirectRingRace, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "Light" : "Full"; });

// A peer process that scribbles over everything it can reach while this
// side reads: every read is a stream or a kDataLoss, never a crash or a
// read outside the mapping.
TEST(DirectRing, AScribblingPeerBreaksOnlyItsOwnConnection) {
  Pair p;
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::mt19937_64 rng(99);
    auto* page = p.a->tx() - proto::DirectRingOffset(0, kRing);
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    while (std::chrono::steady_clock::now() < end)
      for (int i = 0; i < 4096; ++i) page[rng() % proto::DirectBytes(kRing)] = static_cast<uint8_t>(rng());
    _exit(0);
  }
  uint64_t head = 0, rx_tail = 0, errors = 0, reads = 0, bytes = 0;
  std::vector<uint8_t> buf(kRing);
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(400);
  while (std::chrono::steady_clock::now() < end && reads < 2000000) {
    ++reads;
    auto peer = p.b->ReadPeer(head, rx_tail, 0, 0);
    if (!peer.ok()) {
      ++errors;
      continue;
    }
    rx_tail = peer->produced;
    uint64_t n = rx_tail - head;  // checked: at most a ring
    ASSERT_LE(n, kRing);
    Get(p.b->rx(), head, buf.data(), n);
    bytes += n;
    head = rx_tail;
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_GT(errors, 0u) << "the scribbles never produced an impossible count";
  RecordProperty("reads", static_cast<int>(reads));
}

}  // namespace
}  // namespace vsocket::guest
