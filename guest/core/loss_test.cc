// DecideLoss's whole table: every way a connection can lose the accelerated
// path, in every state that matters, and what it must come to.
#include "guest/core/loss.h"

#include <gtest/gtest.h>

#include <vector>

#include "guest/core/busy_loop.h"
#include "guest/core/registration.h"

namespace vsocket::guest {
namespace {

LossFacts Facts(Phase phase, bool upgraded, bool resynced = false, bool draining = false) {
  LossFacts f;
  f.phase = phase;
  f.upgraded = upgraded;
  f.resynced = resynced;
  f.draining = draining;
  f.fence_known = true;
  return f;
}

LossOutcome Out(std::optional<ConnEvent> ev, bool break_drain = false, bool record = false, bool lost = false,
                bool owe = false) {
  LossOutcome o;
  o.event = ev;
  o.break_drain = break_drain;
  o.record_landed = record;
  o.mark_lost_backend = lost;
  o.owe_unregister = owe;
  return o;
}

struct Row {
  const char* what;
  LossKind kind;
  LossFacts facts;
  LossOutcome want;
};

LossFacts With(LossFacts f, void (*change)(LossFacts&)) {
  change(f);
  return f;
}

TEST(DecideLoss, EveryRowOfTheTable) {
  const Row rows[] = {
      // A lost link (or a peer that never upgraded) while upgraded: RESYNC.
      {"link down, upgraded, counts agree", LossKind::kLinkDown, Facts(Phase::kUpgraded, true),
       Out(ConnEvent::kLinkLost, false, true)},
      {"link down, lingering", LossKind::kLinkDown, Facts(Phase::kLingering, true),
       Out(ConnEvent::kLinkLost, false, true)},
      {"link down, upgraded, the backend counts other bytes landed: reset", LossKind::kLinkDown,
       With(Facts(Phase::kUpgraded, true), [](LossFacts& f) { f.landed_matches = false; }), Out(ConnEvent::kFail)},
      {"link down, bytes landed before the peer's fence reached us: reset", LossKind::kLinkDown,
       With(Facts(Phase::kUpgraded, true),
            [](LossFacts& f) {
              f.fence_known = false;
              f.any_landed = true;
            }),
       Out(ConnEvent::kFail)},
      {"link down, no fence yet and nothing landed: RESYNC", LossKind::kLinkDown,
       With(Facts(Phase::kUpgraded, true), [](LossFacts& f) { f.fence_known = false; }),
       Out(ConnEvent::kLinkLost, false, true)},
      {"link down during a drain before TX moved: RESYNC, the drain's count final", LossKind::kLinkDown,
       Facts(Phase::kUpgraded, true, false, true), Out(ConnEvent::kLinkLost, true, true)},
      {"link down during a drain whose TX moved: the drain's count final", LossKind::kLinkDown,
       Facts(Phase::kResyncing, true, true, true), Out(std::nullopt, true)},
      {"link down during a drain whose TX moved, counts disagree: reset", LossKind::kLinkDown,
       With(Facts(Phase::kResyncing, true, true, true), [](LossFacts& f) { f.landed_matches = false; }),
       Out(ConnEvent::kFail)},
      {"link down after the peer's ring end: nothing missing", LossKind::kLinkDown,
       With(Facts(Phase::kResyncing, true, true, true), [](LossFacts& f) { f.peer_ring_end = true; }),
       Out(std::nullopt)},
      {"link down after a drain already broke: nothing more", LossKind::kLinkDown,
       With(Facts(Phase::kResyncing, true, true, true), [](LossFacts& f) { f.drain_broken = true; }),
       Out(std::nullopt)},
      {"link down while pending: the peer is not coming, the registration ours to end", LossKind::kLinkDown,
       Facts(Phase::kPending, false), Out(ConnEvent::kPeerWithdrew, false, false, false, true)},
      {"link down after a RESYNC already (not draining): withdrawn", LossKind::kLinkDown,
       Facts(Phase::kResyncing, true, true), Out(ConnEvent::kPeerWithdrew)},
      // The peer aborted / the backend refused.
      {"peer aborted while pending", LossKind::kPeerAborted, Facts(Phase::kPending, false),
       Out(ConnEvent::kPeerWithdrew, false, false, false, true)},
      {"peer aborted while upgraded", LossKind::kPeerAborted, Facts(Phase::kUpgraded, true),
       Out(ConnEvent::kPeerWithdrew)},
      // vsocketd went away.
      {"backend gone, upgraded", LossKind::kBackendGone, Facts(Phase::kUpgraded, true),
       Out(ConnEvent::kBackendLost, false, true, true)},
      {"backend gone, lingering", LossKind::kBackendGone, Facts(Phase::kLingering, true),
       Out(ConnEvent::kBackendLost, false, true, true)},
      {"backend gone, pending: registers again later", LossKind::kBackendGone, Facts(Phase::kPending, false),
       Out(ConnEvent::kBackendLost, false, false, true)},
      {"backend gone, resyncing already", LossKind::kBackendGone, Facts(Phase::kResyncing, true, true),
       Out(ConnEvent::kBackendLost, false, false, true)},
      {"backend gone during a drain", LossKind::kBackendGone, Facts(Phase::kResyncing, true, true, true),
       Out(ConnEvent::kBackendLost, true, false, true)},
      {"backend gone during a drain, peer's ring end came", LossKind::kBackendGone,
       With(Facts(Phase::kResyncing, true, true, true), [](LossFacts& f) { f.peer_ring_end = true; }),
       Out(ConnEvent::kBackendLost, false, false, true)},
      // vsocketd broke the protocol; an ERROR event.
      {"backend broken, upgraded: reset", LossKind::kBackendBroken, Facts(Phase::kUpgraded, true),
       Out(ConnEvent::kFail)},
      {"backend broken, pending: kernel for good", LossKind::kBackendBroken, Facts(Phase::kPending, false),
       Out(ConnEvent::kKernelForGood)},
      {"error event, upgraded: reset", LossKind::kProtocolError, Facts(Phase::kUpgraded, true),
       Out(ConnEvent::kFail)},
      {"error event, pending: kernel (nothing owed)", LossKind::kProtocolError, Facts(Phase::kPending, false),
       Out(ConnEvent::kPeerWithdrew)},
  };
  for (const Row& r : rows) {
    LossOutcome got = DecideLoss(r.kind, r.facts);
    EXPECT_EQ(got, r.want) << r.what << " (" << ToString(r.kind) << "): got event "
                           << (got.event ? ToString(*got.event) : "none") << " break " << got.break_drain
                           << " record " << got.record_landed << " lost " << got.mark_lost_backend << " owe "
                           << got.owe_unregister;
  }
}

std::shared_ptr<Conn> Upgraded(uint64_t rx_tail) {
  auto c = std::make_shared<Conn>();
  EXPECT_TRUE(c->state.Apply(ConnEvent::kRegistered));
  EXPECT_TRUE(c->state.Apply(ConnEvent::kUpgrade));
  c->peer_fence_known.store(true);
  c->rx_tail.store(rx_tail);
  return c;
}

int g_handed = 0;
void CountHandoff(const std::shared_ptr<Conn>&) { ++g_handed; }

TEST(ApplyLoss, ALostLinkRecordsTheCountsAndHandsTheResendOverOnce) {
  g_handed = 0;
  auto c = Upgraded(4096);
  ApplyLoss(c, LossKind::kLinkDown, 4096, true, proto::Reason::kFabricDown, CountHandoff);
  EXPECT_EQ(c->state.phase(), Phase::kResyncing);
  EXPECT_EQ(c->resync_landed.load(), 4096u);
  EXPECT_TRUE(c->resync_fence_acked.load());
  EXPECT_EQ(g_handed, 1);
  // The backend going as well changes nothing more: no second hand-off.
  ApplyLoss(c, LossKind::kBackendGone, 4096, true, proto::Reason::kBackendUnavailable, CountHandoff);
  EXPECT_EQ(c->state.phase(), Phase::kResyncing);
  EXPECT_EQ(g_handed, 1);
}

TEST(ApplyLoss, APendingConnectionWithdrawnOwesItsUnregister) {
  auto c = std::make_shared<Conn>();
  ASSERT_TRUE(c->state.Apply(ConnEvent::kRegistered));
  ApplyLoss(c, LossKind::kPeerAborted, 0, false, proto::Reason::kPeerNotRegistered, nullptr);
  EXPECT_EQ(c->state.phase(), Phase::kWithdrawn) << "kernel TCP, the registration ours to end";
  EXPECT_EQ(c->state.reason(), proto::Reason::kPeerNotRegistered);
}

// The end of a withdrawn registration (EndWithdrawnLocked, no session
// here): kernel TCP for good, or, for a tentative one of a busy loop
// (decision 83), held again with a pause before it may qualify again.
TEST(ApplyLoss, AWithdrawnRegistrationEndsOnKernelTcpOrHeldAgain) {
  auto plain = std::make_shared<Conn>();
  ASSERT_TRUE(plain->state.Apply(ConnEvent::kRegistered));
  ApplyLoss(plain, LossKind::kPeerAborted, 0, false, proto::Reason::kPeerNotRegistered, nullptr);
  {
    MutexLock lock(plain->setup_mu);
    EndWithdrawnLocked(*plain);
  }
  EXPECT_EQ(plain->state.phase(), Phase::kKernel);

  auto busy = std::make_shared<Conn>();
  busy->held.store(true);
  BusyLoop loop(2);
  std::vector<std::atomic<uint32_t>> marks(32);
  loop.set_epoch_for_testing(BusyLoop::Epoch());
  for (auto& m : marks) loop.NoteTurnAt(m, BusyLoop::Epoch());
  for (uint32_t i = 0; i < kBusyWindowWaits; ++i) loop.NoteWait(4);
  ASSERT_TRUE(loop.busy());
  bool q = false;
  for (int i = 0; i < 100 && !q; ++i) q = busy->stream.Note(i % 2 ? StreamDetector::Dir::kIn : StreamDetector::Dir::kOut, 10, 1 << 20, &loop);
  ASSERT_EQ(busy->stream.cause(), StreamDetector::Cause::kBusyLoop);
  ASSERT_TRUE(busy->state.Apply(ConnEvent::kRegistered));
  ApplyLoss(busy, LossKind::kPeerAborted, 0, false, proto::Reason::kPeerNotRegistered, nullptr);
  {
    MutexLock lock(busy->setup_mu);
    EndWithdrawnLocked(*busy);
  }
  EXPECT_EQ(busy->state.phase(), Phase::kUnprobed) << "held again";
  EXPECT_TRUE(busy->HeldQuiet());
  EXPECT_EQ(busy->stream.withdrawals(), 1u);
  // Busy and long-lived as before, but within its pause: not yet.
  for (int i = 0; i < 200; ++i)
    EXPECT_FALSE(busy->stream.Note(i % 2 ? StreamDetector::Dir::kIn : StreamDetector::Dir::kOut, 10, 1 << 20, &loop));
}

TEST(ApplyLoss, CountsThatDisagreeResetAndHandNothingOver) {
  g_handed = 0;
  auto c = Upgraded(100);
  ApplyLoss(c, LossKind::kLinkDown, 200, true, proto::Reason::kFabricDown, CountHandoff);
  EXPECT_EQ(c->state.phase(), Phase::kReset);
  EXPECT_EQ(g_handed, 0);
}

}  // namespace
}  // namespace vsocket::guest
