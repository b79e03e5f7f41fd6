// The connection state machine: every (phase, event) pair against a table
// written out here independently of conn_state.cc, the history it keeps,
// the direction sub-states, concurrent events, and the diagram in
// docs/connection-lifecycle.md (which must say what the code does).
#include "guest/core/conn_state.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/clock.h"

namespace vsocket::guest {
namespace {

using E = ConnEvent;
using P = Phase;
using proto::Reason;

const P kPhases[] = {P::kUnprobed,  P::kKernel,    P::kPending, P::kUpgraded,
                     P::kResyncing, P::kLingering, P::kReset,   P::kClosed, P::kWithdrawn};
const E kEvents[] = {E::kRegistered,  E::kKernelForGood, E::kUpgrade,  E::kPeerWithdrew, E::kLinkLost, E::kFail,
                     E::kBackendLost, E::kForked,        E::kResynced, E::kLinger,       E::kClose,    E::kDrain,
                     E::kDrained,     E::kEndWithdrawn,  E::kHoldAgain};
static_assert(std::size(kPhases) == kPhaseCount && std::size(kEvents) == kEventCount);

// What each phase allows, written down from docs/connection-lifecycle.md's
// rules rather than copied from the implementation.
const std::map<std::pair<P, E>, P>& Expected() {
  static const std::map<std::pair<P, E>, P> m = {
      {{P::kUnprobed, E::kRegistered}, P::kPending},
      {{P::kUnprobed, E::kKernelForGood}, P::kKernel},
      {{P::kUnprobed, E::kBackendLost}, P::kUnprobed},
      {{P::kUnprobed, E::kForked}, P::kKernel},
      {{P::kPending, E::kUpgrade}, P::kUpgraded},
      {{P::kPending, E::kKernelForGood}, P::kKernel},
      {{P::kPending, E::kPeerWithdrew}, P::kWithdrawn},
      {{P::kPending, E::kBackendLost}, P::kUnprobed},
      {{P::kPending, E::kForked}, P::kKernel},
      {{P::kPending, E::kClose}, P::kClosed},
      {{P::kUpgraded, E::kLinkLost}, P::kResyncing},
      {{P::kUpgraded, E::kPeerWithdrew}, P::kReset},
      {{P::kUpgraded, E::kFail}, P::kReset},
      {{P::kUpgraded, E::kBackendLost}, P::kResyncing},
      {{P::kUpgraded, E::kForked}, P::kReset},
      {{P::kUpgraded, E::kLinger}, P::kLingering},
      {{P::kUpgraded, E::kClose}, P::kClosed},
      {{P::kUpgraded, E::kDrain}, P::kUpgraded},
      {{P::kUpgraded, E::kDrained}, P::kResyncing},
      {{P::kLingering, E::kLinkLost}, P::kResyncing},
      {{P::kLingering, E::kPeerWithdrew}, P::kReset},
      {{P::kLingering, E::kFail}, P::kReset},
      {{P::kLingering, E::kBackendLost}, P::kResyncing},
      {{P::kLingering, E::kClose}, P::kClosed},
      {{P::kResyncing, E::kResynced}, P::kUnprobed},
      {{P::kResyncing, E::kKernelForGood}, P::kKernel},
      {{P::kResyncing, E::kPeerWithdrew}, P::kReset},
      {{P::kResyncing, E::kFail}, P::kReset},
      {{P::kResyncing, E::kBackendLost}, P::kResyncing},
      {{P::kResyncing, E::kForked}, P::kReset},
      {{P::kResyncing, E::kClose}, P::kClosed},
      {{P::kReset, E::kFail}, P::kReset},
      {{P::kReset, E::kBackendLost}, P::kReset},
      {{P::kReset, E::kForked}, P::kReset},
      {{P::kReset, E::kClose}, P::kClosed},
      // Withdrawn: kernel TCP, the registration ours to end; a tentative
      // one (decision 83) held again, to qualify later.
      {{P::kWithdrawn, E::kEndWithdrawn}, P::kKernel},
      {{P::kWithdrawn, E::kHoldAgain}, P::kUnprobed},
      {{P::kWithdrawn, E::kBackendLost}, P::kKernel},
      {{P::kWithdrawn, E::kForked}, P::kKernel},
      {{P::kWithdrawn, E::kClose}, P::kClosed},
  };
  return m;
}

// Brings a fresh state to phase p through allowed events only.
void DriveTo(ConnState& s, P p) {
  auto apply = [&](E e) { ASSERT_TRUE(s.Apply(e)) << ToString(e) << " in " << ToString(s.phase()); };
  switch (p) {
    case P::kUnprobed: break;
    case P::kKernel: apply(E::kKernelForGood); break;
    case P::kPending: apply(E::kRegistered); break;
    case P::kUpgraded:
      apply(E::kRegistered);
      apply(E::kUpgrade);
      break;
    case P::kResyncing:
      DriveTo(s, P::kUpgraded);
      apply(E::kLinkLost);
      break;
    case P::kLingering:
      DriveTo(s, P::kUpgraded);
      apply(E::kLinger);
      break;
    case P::kReset:
      DriveTo(s, P::kUpgraded);
      apply(E::kFail);
      break;
    case P::kClosed:
      apply(E::kRegistered);
      apply(E::kClose);
      break;
    case P::kWithdrawn:
      apply(E::kRegistered);
      apply(E::kPeerWithdrew);
      break;
  }
  ASSERT_EQ(s.phase(), p);
}

TEST(ConnStateTest, EveryPhaseAndEventFollowsTheTable) {
  int allowed = 0;
  for (P from : kPhases) {
    for (E e : kEvents) {
      SCOPED_TRACE(std::string(ToString(from)) + " + " + ToString(e));
      ConnState s;
      DriveTo(s, from);
      auto it = Expected().find({from, e});
      uint64_t refused_before = ConnState::refused_total();
      bool ok = s.Apply(e, Reason::kProtocolError);
      if (it == Expected().end()) {
        EXPECT_FALSE(ok) << "an illegal event must be refused";
        EXPECT_EQ(s.phase(), from) << "a refused event changes nothing";
        EXPECT_EQ(ConnState::refused_total(), refused_before + 1) << "and is counted";
        EXPECT_FALSE(ConnState::Next(from, e).has_value());
      } else {
        ++allowed;
        EXPECT_TRUE(ok);
        EXPECT_EQ(s.phase(), it->second);
        EXPECT_EQ(ConnState::Next(from, e), it->second);
      }
    }
  }
  EXPECT_EQ(allowed, static_cast<int>(Expected().size()));
}

TEST(ConnStateTest, ReasonFollowsTheEvent) {
  ConnState s;
  EXPECT_EQ(s.reason(), Reason::kPending);
  ASSERT_TRUE(s.Apply(E::kRegistered));
  EXPECT_EQ(s.reason(), Reason::kPending) << "an event without a reason keeps the current one";
  ASSERT_TRUE(s.Apply(E::kUpgrade, Reason::kCrossTenant));
  EXPECT_EQ(s.reason(), Reason::kNone) << "an upgrade always clears the reason";
  ASSERT_TRUE(s.Apply(E::kFail, Reason::kProtocolError));
  EXPECT_EQ(s.reason(), Reason::kProtocolError);
  EXPECT_FALSE(s.Apply(E::kUpgrade, Reason::kFabricDown));
  EXPECT_EQ(s.reason(), Reason::kProtocolError) << "a refused event leaves the reason alone";
}

TEST(ConnStateTest, LosingTheBackendResyncsLikeLosingTheLink) {
  ConnState s;
  DriveTo(s, P::kUpgraded);
  ASSERT_TRUE(s.Apply(E::kBackendLost, Reason::kBackendUnavailable));
  EXPECT_EQ(s.phase(), P::kResyncing);
  EXPECT_TRUE(s.resynced()) << "the RESYNC rules apply";
  EXPECT_EQ(s.reason(), Reason::kBackendUnavailable);
  EXPECT_STREQ(s.ReportedMode(), "kernel");
  ConnState pending;
  DriveTo(pending, P::kPending);
  ASSERT_TRUE(pending.Apply(E::kBackendLost, Reason::kBackendUnavailable));
  EXPECT_EQ(pending.phase(), P::kUnprobed) << "registers again with the next backend";
  EXPECT_FALSE(pending.resynced()) << "nothing to resend: it never switched";
}

TEST(ConnStateTest, HistoryOfTheRegistration) {
  ConnState s;
  DriveTo(s, P::kUpgraded);
  EXPECT_TRUE(s.upgraded());
  EXPECT_FALSE(s.resynced());
  ASSERT_TRUE(s.Apply(E::kLinger));
  EXPECT_TRUE(s.lingered());
  ASSERT_TRUE(s.Apply(E::kLinkLost, Reason::kFabricDown));
  EXPECT_TRUE(s.resynced());
  EXPECT_EQ(s.phase(), P::kResyncing);
  ASSERT_TRUE(s.Apply(E::kResynced));
  // A fresh registration: nothing of the old one but the linger report.
  EXPECT_EQ(s.phase(), P::kUnprobed);
  EXPECT_FALSE(s.upgraded());
  EXPECT_FALSE(s.resynced());
  EXPECT_FALSE(s.tx_on_ring());
  EXPECT_FALSE(s.rx_on_ring());
  EXPECT_EQ(s.rx_resync(), RxResync::kRing);
  EXPECT_EQ(s.reason(), Reason::kPending);
  EXPECT_TRUE(s.lingered());
}

TEST(ConnStateTest, DerivedViews) {
  struct Row {
    P phase;
    bool registered, accelerated;
    Mode mode;
  };
  const Row rows[] = {
      {P::kUnprobed, false, false, Mode::kUnprobed}, {P::kKernel, false, false, Mode::kKernel},
      {P::kPending, true, false, Mode::kPending},    {P::kUpgraded, true, true, Mode::kAccel},
      {P::kResyncing, true, true, Mode::kAccel},     {P::kLingering, true, true, Mode::kAccel},
      {P::kReset, true, true, Mode::kAccel},         {P::kClosed, false, false, Mode::kKernel},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(ToString(r.phase));
    ConnState s;
    DriveTo(s, r.phase);
    EXPECT_EQ(s.registered(), r.registered);
    EXPECT_EQ(s.accelerated(), r.accelerated);
    EXPECT_EQ(s.mode(), r.mode);
    EXPECT_EQ(s.reset(), r.phase == P::kReset);
  }
  ConnState resyncing;
  DriveTo(resyncing, P::kResyncing);
  EXPECT_STREQ(resyncing.ReportedMode(), "kernel") << "after a link loss a report says kernel";
  ConnState pending;
  DriveTo(pending, P::kPending);
  EXPECT_STREQ(pending.ReportedMode(), "kernel-pending");
  ConnState up;
  DriveTo(up, P::kUpgraded);
  EXPECT_STREQ(up.ReportedMode(), "accelerated");
}

TEST(ConnStateTest, DirectionsSwitchOnceAndOnlyAfterTheUpgrade) {
  ConnState s;
  DriveTo(s, P::kPending);
  EXPECT_FALSE(s.SwitchTx()) << "no ring before the upgrade";
  EXPECT_FALSE(s.SwitchRx());
  ASSERT_TRUE(s.Apply(E::kUpgrade));
  EXPECT_TRUE(s.SwitchTx());
  EXPECT_TRUE(s.tx_on_ring());
  EXPECT_FALSE(s.SwitchTx()) << "a second switch is refused";
  EXPECT_FALSE(s.rx_on_ring()) << "the directions are independent";
  EXPECT_TRUE(s.SwitchRx());
  EXPECT_FALSE(s.SwitchRx());
}

TEST(ConnStateTest, RxResyncStepsInOrder) {
  ConnState fresh;
  DriveTo(fresh, P::kUpgraded);
  EXPECT_FALSE(fresh.AdvanceRxResync(RxResync::kHeader)) << "only after a link loss";

  ConnState s;
  DriveTo(s, P::kResyncing);
  EXPECT_FALSE(s.AdvanceRxResync(RxResync::kSkip)) << "the header comes before the skip";
  EXPECT_FALSE(s.AdvanceRxResync(RxResync::kRing));
  ASSERT_TRUE(s.AdvanceRxResync(RxResync::kHeader));
  EXPECT_FALSE(s.AdvanceRxResync(RxResync::kHeader));
  ASSERT_TRUE(s.AdvanceRxResync(RxResync::kSkip));
  EXPECT_FALSE(s.AdvanceRxResync(RxResync::kHeader)) << "never backwards";
  ASSERT_TRUE(s.AdvanceRxResync(RxResync::kKernel));
  EXPECT_FALSE(s.AdvanceRxResync(RxResync::kSkip));

  ConnState direct;  // the peer never switched: no header comes
  DriveTo(direct, P::kResyncing);
  EXPECT_TRUE(direct.AdvanceRxResync(RxResync::kKernel));
  ConnState no_skip;  // the header says nothing needs skipping
  DriveTo(no_skip, P::kResyncing);
  ASSERT_TRUE(no_skip.AdvanceRxResync(RxResync::kHeader));
  EXPECT_TRUE(no_skip.AdvanceRxResync(RxResync::kKernel));
}

// Event dispatch and a socket call racing: the outcome is always one the
// table allows from one order or the other, never a mix.
TEST(ConnStateTest, ConcurrentEventsEndInALegalPhase) {
  for (int round = 0; round < 2000; ++round) {
    ConnState s;
    DriveTo(s, P::kPending);
    std::thread a([&] { s.Apply(E::kUpgrade); });
    std::thread b([&] { s.Apply(E::kBackendLost, Reason::kBackendUnavailable); });
    a.join();
    b.join();
    // Upgrade then BackendLost: resyncing. BackendLost first: unprobed
    // again (the upgrade is then refused).
    P p = s.phase();
    ASSERT_TRUE(p == P::kResyncing || p == P::kUnprobed) << ToString(p);
    EXPECT_EQ(s.upgraded(), p == P::kResyncing) << "history matches the phase";
    EXPECT_EQ(s.resynced(), p == P::kResyncing);
  }
}

// The diagram in docs/connection-lifecycle.md, generated from the table.
std::string Diagram() {
  std::ostringstream o;
  o << "```mermaid\nstateDiagram-v2\n";
  for (P from : kPhases)
    for (E e : kEvents)
      if (auto to = ConnState::Next(from, e); to && *to != from)
        o << "    " << ToString(from) << " --> " << ToString(*to) << ": " << ToString(e) << "\n";
  o << "```\n\n| phase \\ event |";
  for (E e : kEvents) o << " " << ToString(e) << " |";
  o << "\n|---|";
  for (size_t i = 0; i < std::size(kEvents); ++i) o << "---|";
  o << "\n";
  for (P from : kPhases) {
    o << "| **" << ToString(from) << "** |";
    for (E e : kEvents) {
      auto to = ConnState::Next(from, e);
      o << " " << (to ? ToString(*to) : "·") << " |";
    }
    o << "\n";
  }
  return o.str();
}

// The report's downgrade history: each loss of the accelerated path is
// counted with its reason, and the time on kernel TCP after it runs until
// the connection is upgraded again; none of it is cleared by the fresh
// registration in between.
TEST(ConnStateTest, DowngradesAreCountedAndTimedUntilTheNextUpgrade) {
  ConnState s;
  EXPECT_EQ(s.downgrades(), 0u);
  EXPECT_EQ(s.kernel_ns_after_downgrades(MonotonicNs()), 0);
  ASSERT_TRUE(s.Apply(E::kRegistered));
  ASSERT_TRUE(s.Apply(E::kUpgrade));
  ASSERT_TRUE(s.Apply(E::kLinkLost, proto::Reason::kFabricDown));
  EXPECT_EQ(s.downgrades(), 1u);
  EXPECT_EQ(s.last_downgrade(), proto::Reason::kFabricDown);
  // Still resyncing when the backend goes too: the same downgrade.
  ASSERT_TRUE(s.Apply(E::kBackendLost, proto::Reason::kBackendUnavailable));
  EXPECT_EQ(s.downgrades(), 1u);
  int64_t t0 = MonotonicNs();
  EXPECT_GT(s.kernel_ns_after_downgrades(t0 + 5'000'000), 5'000'000 - 1);
  ASSERT_TRUE(s.Apply(E::kResynced));
  ASSERT_TRUE(s.Apply(E::kRegistered));
  ASSERT_TRUE(s.Apply(E::kUpgrade));
  // The clock stopped at the upgrade.
  int64_t frozen = s.kernel_ns_after_downgrades(MonotonicNs());
  EXPECT_GT(frozen, 0);
  EXPECT_EQ(s.kernel_ns_after_downgrades(MonotonicNs() + 1'000'000'000), frozen);
  ASSERT_TRUE(s.Apply(E::kBackendLost, proto::Reason::kBackendUnavailable));
  EXPECT_EQ(s.downgrades(), 2u);
  EXPECT_EQ(s.last_downgrade(), proto::Reason::kBackendUnavailable);
}

// The text between `<!-- TAG: generated by ... -->` and `<!-- TAG: end -->`
// in docs/connection-lifecycle.md.
std::string Documented(const std::string& tag) {
  std::ifstream f("docs/connection-lifecycle.md");
  EXPECT_TRUE(f.good()) << "docs/connection-lifecycle.md is a data dependency of this test";
  std::stringstream buf;
  buf << f.rdbuf();
  std::string doc = buf.str();
  const std::string begin = "<!-- " + tag + ": generated by guest/core/conn_state_test.cc -->\n";
  const std::string end = "<!-- " + tag + ": end -->";
  size_t b = doc.find(begin), e = doc.find(end);
  if (b == std::string::npos || e == std::string::npos) return "(no " + tag + " section)";
  return doc.substr(b + begin.size(), e - b - begin.size());
}

TEST(ConnStateTest, DocumentedDiagramIsTheCode) {
  EXPECT_EQ(Documented("conn_state"), Diagram()) << "update docs/connection-lifecycle.md with:\n" << Diagram();
}

// The drain's sub-machines (§9), generated from their tables.
const DrainEvent kDrainEvents[] = {DrainEvent::kTxRingEnd, DrainEvent::kPeerRingEnd, DrainEvent::kBreak};

std::string DrainDiagram() {
  std::ostringstream o;
  o << "```mermaid\nstateDiagram-v2\n";
  for (DrainTx from : {DrainTx::kOnRing, DrainTx::kRingEnded})
    for (DrainEvent e : kDrainEvents)
      if (auto to = ConnState::NextTx(from, e))
        o << "    " << ToString(from) << " --> " << ToString(*to) << ": " << ToString(e) << "\n";
  for (DrainRx from : {DrainRx::kOnRing, DrainRx::kPeerEnded, DrainRx::kBroken})
    for (DrainEvent e : kDrainEvents)
      if (auto to = ConnState::NextRx(from, e))
        o << "    " << ToString(from) << " --> " << ToString(*to) << ": " << ToString(e) << "\n";
  o << "```\n";
  return o.str();
}

TEST(ConnStateTest, DocumentedDrainDiagramIsTheCode) {
  EXPECT_EQ(Documented("drain_state"), DrainDiagram()) << "update docs/connection-lifecycle.md §9 with:\n"
                                                       << DrainDiagram();
}

TEST(ConnStateTest, DrainStepsAreTakenOnceAndOnlyWhileDraining) {
  ConnState s;
  // Before the upgrade: no step at all.
  EXPECT_FALSE(s.ApplyDrain(DrainEvent::kPeerRingEnd));
  ASSERT_TRUE(s.Apply(E::kRegistered));
  ASSERT_TRUE(s.Apply(E::kUpgrade));
  // Upgraded, not draining: our ring end and a break are refused; the
  // peer's ring end is taken (we follow it into a drain).
  EXPECT_FALSE(s.ApplyDrain(DrainEvent::kTxRingEnd));
  EXPECT_FALSE(s.ApplyDrain(DrainEvent::kBreak));
  EXPECT_TRUE(s.ring_final());
  ASSERT_TRUE(s.Apply(E::kDrain));
  EXPECT_FALSE(s.ring_final()) << "a drain's ring stream is not final before its end";
  EXPECT_TRUE(s.ApplyDrain(DrainEvent::kTxRingEnd));
  EXPECT_FALSE(s.ApplyDrain(DrainEvent::kTxRingEnd)) << "twice";
  EXPECT_TRUE(s.tx_ring_ended());
  EXPECT_TRUE(s.ApplyDrain(DrainEvent::kBreak));
  EXPECT_TRUE(s.drain_broken());
  EXPECT_TRUE(s.ring_final());
  EXPECT_FALSE(s.ApplyDrain(DrainEvent::kPeerRingEnd)) << "a broken drain's RX never ends by the ring";
  // A fresh registration starts the steps afresh.
  ASSERT_TRUE(s.Apply(E::kDrained, proto::Reason::kOperator));
  ASSERT_TRUE(s.Apply(E::kResynced));
  EXPECT_EQ(s.drain_tx(), DrainTx::kOnRing);
  EXPECT_EQ(s.drain_rx(), DrainRx::kOnRing);
  EXPECT_FALSE(s.draining());
}

}  // namespace
}  // namespace vsocket::guest
