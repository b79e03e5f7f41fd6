// Direct pairs in the library (decision 97, issue 37): a connection whose
// peer is a process of this host that vsocketd let share memory with us
// gets a ring pair of its own (direct_ring.h). Its bytes then never pass
// through vsocketd: we publish our counts in the pair's memory and wake the
// peer through its wake eventfd when it asked, and take its counts from
// there as vsocketd's RX_TAIL, CREDIT and SHUTDOWN events would bring them.
// Its control messages (FENCE, SHUTDOWN, UNREGISTER) still go to vsocketd.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "guest/core/conn.h"
#include "guest/core/transport.h"

namespace vsocket::guest {

// The DIRECT event (dispatch, under the session lock; before the UPGRADE):
// fetches the pair's memory with `token` and makes its rings c's.
Status AttachDirect(Conn& c, Transport& t, uint64_t token);

// Back on kernel TCP with its registration given back (c's setup, TX and
// RX locks held): the pair is over; a later registration may get a new
// one. The peer's wake fd is closed, the mapping kept (DirectSlot).
void RetireDirect(Conn& c);

// Any thread: takes what the peer published into c's counts, never
// backwards. True if anything changed (c's generation was bumped). A count
// that cannot be sets c.direct_broken instead; the session resets c.
bool PullDirect(Conn& c);

// Publishes our TX tail (produced) or our RX consumed count, and wakes the
// peer if it asked to be woken for it.
void AnnounceDirect(Conn& c, bool produced, uint64_t value);
// Our FENCE, in the pair's memory too. False if the peer left the pair
// before (it closed our fence word, decision 134): then we never switch,
// and our kernel stream simply goes on.
bool PublishDirectFence(Conn& c, uint64_t fence);
// Leaving the pair (every loss, ApplyLoss): the peer's FENCE as the pair's
// memory holds it becomes final; if it had none, it can never set one now.
// So the two ends agree whether a RESYNC header follows the peer's kernel
// bytes, whoever of them (or vsocketd) goes first.
void CloseDirectFence(Conn& c);
// Where our ring stream ends (a drain's SHUTDOWN ring end), in the pair's
// memory too: the peer's checks then refuse any count past it.
void PublishDirectRingEnd(Conn& c, uint64_t end);
// Our EOF, in the pair's memory (after the last byte's count).
void PublishDirectShutWr(Conn& c);
// Before this process sleeps: asks c's peer to wake it when it writes, and
// when it consumes if something here may wait for that (WaitsForConsumption).
// Asking for every consumption cost a request/response client two wake-ups
// per round trip: one when the server read the request, one for the answer.
// Then FenceDirectAsks, once for all the connections armed, and a last
// look at each.
void ArmDirect(Conn& c);
// After ArmDirect of each: a full fence, and a membarrier if any of their
// peers publishes without fences now (decision 114).
void FenceDirectAsks(const std::vector<std::shared_ptr<Conn>>& conns);
// Whether a wait of this process may be for c's peer to consume what c
// wrote: a ring half full or more (a writer waits only for room), or a
// connection leaving the rings (its drain or close waits for everything).
bool WaitsForConsumption(const Conn& c);

}  // namespace vsocket::guest
