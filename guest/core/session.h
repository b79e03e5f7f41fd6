// The process's session with vsocketd: a request queue and an event queue on
// a device the transport provides (transport.h: in process mode our own
// vhost-user frontend), shared by every thread.
//
// Requests with responses (REGISTER_CONN, UNREGISTER) use Call(); the
// counters of the data path (FENCE, TX_TAIL, CONSUMED, SHUTDOWN) are posted
// fire-and-forget. Events (UPGRADE, RX_TAIL, CREDIT, ...) are drained by
// whichever thread is in the library, and every sleeping thread is woken
// when something changed (Waiters).
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "guest/core/conn.h"
#include "guest/core/loss.h"
#include "proto/control.h"
#include "guest/core/transport.h"

namespace vsocket::guest {

class Session {
 public:
  // The session, connecting on first use; nullptr if acceleration is off or
  // the backend is unreachable (then `*why` says which).
  static Session* Get(proto::Reason* why);
  // The process's session if it is up; never connects.
  static Session* Existing();
  // After fork(), in the child: the parent's session is not ours to use.
  static void ForgetAfterFork();
  // Unit tests, with no other thread in the library: ends the process's
  // session and frees it (a process never does: a thread may still hold it).
  static void DestroyForTesting();

  Status Call(const proto::Message& request, proto::Message* response, int timeout_ms = 3000);
  // Fire-and-forget; waits only if every request slot is in flight.
  // `seq`, if given: where the message stands among the session's
  // requests (1, 2, ...), stored under the session lock; the backend took
  // it once it returned that many requests (taken_: it returns them in
  // order).
  Status Post(const proto::Message& msg, std::atomic<uint64_t>* seq = nullptr);

  // Byte rings for one connection (two of ring_bytes each).
  Status AllocRings(Conn& c, uint32_t ring_bytes);
  void FreeRings(Conn& c);
  // UNREGISTER for a registered connection, untracks it and gives up its
  // rings: freed at once, or (kFeatureRingHold, answer rings-held) once
  // RINGS_RELEASED names it, because the backend's fabric still reads or
  // writes them. Not answered: an error, and the rings are never reused.
  Status Unregister(Conn& c);
  // Closed connections whose rings are not free yet: their UNREGISTER is
  // on its way, or the backend holds them until RINGS_RELEASED.
  size_t returning_rings() const;
  // The address the backend knows p (in the session's ring memory) by.
  uint64_t Gpa(const void* p) const { return transport_->Gpa(p); }

  void Track(const std::shared_ptr<Conn>& c);
  // A registration about to be sent: c is tracked and made pending in one
  // step under the session lock, so BackendLost (under the same lock) either
  // sees it pending and moves it on, or came first: then false, and c stays
  // as it was (unprobed).
  bool TrackPending(const std::shared_ptr<Conn>& c);
  void Untrack(uint64_t conn_id);
  // The tracked connections, copied.
  std::vector<std::shared_ptr<Conn>> Tracked() const;

  // Drains both queues and dispatches events. Non-blocking; returns true if
  // anything changed.
  bool Drain();
  bool TryDrain();

  // Sleep support: a waiter is an eventfd written whenever an event was
  // dispatched. Prepare() enables interrupts and returns false if there is
  // already work (drain and re-check instead of sleeping).
  // Wakes every sleeping thread so it re-checks its condition.
  void WakeWaiters();
  void AddWaiter(int efd);
  void RemoveWaiter(int efd);
  bool PrepareSleep();
  void DoneSleeping();
  // A sleep (interrupts on) that ended by its timeout: if the backend had
  // published to a queue meanwhile, its wake-up never came (logged with the
  // queues' event-index state the first time, counted: missed_wakeups()).
  // kMissedWakeupsLost of them in a row, with no wake-up between, and the
  // backend's wake-ups are taken for lost for good: logged (decision 128).
  void NoteTimedOutSleep();
  static constexpr int kMissedWakeupsLost = 3;
  uint64_t missed_wakeups() const { return missed_wakeups_.load(std::memory_order_relaxed); }
  // kMissedWakeupsLost or more in a row now.
  bool WakeUpsLost();
  // Sleeps until a response or an event arrives, the backend hangs up
  // (then BackendLost) or timeout_ms passed; at once if work is pending.
  void AwaitEvent(int timeout_ms);
  int event_fd() const;    // call eventfd of the event queue
  int request_fd() const;  // call eventfd of the request queue
  bool alive() const { return alive_.load(std::memory_order_acquire); }
  // Proves to the backend that this process holds connected TCP socket fd,
  // before its REGISTER_CONN (nothing to do for a port that does not ask).
  Status ProveSocket(int fd);
  // The process that opened it: only that one may use it (not a vfork
  // child, which runs on its parent's memory without fork's handlers).
  pid_t owner_pid() const { return owner_pid_; }
  // False from a request that went unanswered (a Call timed out) until the
  // backend completes it or a later one: a stopped or wedged vsocketd. Then new
  // connections stay on kernel TCP at once, rather than each waiting out its
  // own registration, and a close does not wait for an answer.
  bool answering() const { return unanswered_since_ns_.load(std::memory_order_acquire) == 0; }
  // Notices a backend that went away (the transport says so: a crash,
  // kill -9, a restart) and then does what losing it means
  // (BackendLost). One look at the transport; true while the backend is there.
  bool CheckBackend();
  // A lost session gives its memory back (Transport::ReleaseMemory) once no
  // connection of it is on its rings any more: none still resyncing from
  // them (reading what landed in its RX ring, copying its resend out of its
  // TX ring). BackendLost looks at once; the places a connection leaves a
  // lost session (its close, its RESYNC's end) look again. Nothing for a
  // live session.
  void ReleaseIfUnused() EXCLUDES(mu_);
  // The transport's liveness fd: every sleeper watches it, so that a backend
  // that goes away wakes it (then CheckBackend()).
  int liveness_fd() const;
  // Both queues as the driver sees them (avail, used in memory, used seen,
  // the used_event we asked to be woken at, avail flags, free
  // descriptors), for a stalled wait's diagnosis (wait.h).
  std::string QueueStates();
  // Blocked calls sleep at once: the current backend runs on every one of
  // this process's few CPUs (cpu_share.h; VSOCKET_POLL_AUTO=0: never).
  static bool SleepAtOnce();
  // Connections register only once they stream (decision 51): the policy is
  // auto (VSOCKET_UPGRADE) and the current backend runs on every one of this
  // process's few CPUs, where a request/response on the rings costs two
  // wake-ups for kernel TCP's one.
  static bool RegistersStreamsOnly();
  // Held connections of a busy event loop register too, tentatively
  // (decision 83): RegistersStreamsOnly() and the backend withdraws
  // tentative registrations whose peer does not come (kFeatureTentative).
  static bool BusyLoopRule();
  // Held connections whose peer may be a direct pair's register too, once
  // they have turned kDirectTurns times, tentatively (decision 98):
  // RegistersStreamsOnly() and the backend offered direct pairs to this
  // session's VM (kFeatureDirect) and takes tentative registrations.
  static bool DirectPeerRule();
  // The rules above come from a backend this process, or the process it
  // was forked from, had a session with (and, in this process, the session
  // is not lost): a connection may be held by them without a session of
  // its own (decision 132). A forked worker inherits its parent's.
  static bool PolicyKnown();
  // Learns the rules where they may hold connections (VSOCKET_UPGRADE=auto)
  // and are not known yet: opens the session now (listen(): a server's
  // forked workers then hold their connections without one each).
  static void LearnPolicy();
  // What to do (under the session lock) with an upgraded connection whose
  // accelerated path was lost (its state just went resyncing): the socket
  // layer hands its resend to the background writer (resync.cc). Set once
  // at start-up; the session itself knows nothing of sockets.
  using LinkLostHandler = guest::LinkLostHandler;
  static void SetLinkLostHandler(LinkLostHandler h);

  // The backend polls connections' doorbell blocks (kFeatureDoorbell).
  bool doorbell() const { return doorbell_; }
  bool ring_hold() const { return ring_hold_; }
  bool bulk_hint() const { return bulk_hint_; }
  bool tentative() const { return tentative_; }
  bool direct() const { return direct_; }
  bool fork_resync() const { return fork_resync_; }
  bool move_back() const { return move_back_; }

  // The backend naps between passes, our kicks off (kFeatureNaps, decision
  // 67): what we did since our last kick waits for its next pass unless we
  // kick before we wait. Produced: bytes into a TX ring (or a message
  // posted); consumed: bytes taken from an RX ring, room a stalled sender
  // may wait for (a kick once a quarter ring's worth has gathered).
  void NoteProduced() {
    if (naps_ && !owe_kick_.load(std::memory_order_relaxed)) owe_kick_.store(true, std::memory_order_relaxed);
  }
  void NoteConsumed(uint64_t n, uint32_t ring_bytes) {
    if (naps_ && consumed_since_kick_.fetch_add(n, std::memory_order_relaxed) + n >= ring_bytes / 4) NoteProduced();
  }
  // Before a wait that may last (a block, a poll, a sleep): kicks the
  // backend if we owe it one.
  void KickIfOwed() {
    if (owe_kick_.load(std::memory_order_relaxed)) KickOwed();
  }
  bool naps() const { return naps_; }

 private:
  Session() = default;
  Status Open();
  Status Negotiate();
  bool DrainLocked() REQUIRES(mu_);
  // A request submitted at submitted_ns was done: answering() again if it
  // is not older than the one that went unanswered.
  void Answered(int64_t submitted_ns);
  void Dispatch(const proto::Message& m) REQUIRES(mu_);
  void NotifyWaitersLocked() REQUIRES(mu_);
  Status SubmitLocked(const proto::Message& m, bool want_response, uint32_t* slot,
                      std::atomic<uint64_t>* seq = nullptr) REQUIRES(mu_);
  void KickOwed();
  void BackendLost() REQUIRES(mu_);
  std::string QueueStatesLocked() REQUIRES(mu_);
  void ReleaseIfUnusedLocked() REQUIRES(mu_);

  struct Slot {
    uint8_t* req;
    uint8_t* resp;
    bool in_flight = false;
    bool want_response = false;
    bool done = false;
    uint32_t resp_len = 0;
    int64_t submitted_ns = 0;
  };

  // Lock order: a connection's tx_mu/rx_mu/setup_mu, an epoll set's mu,
  // then this.
  mutable Mutex mu_;
  std::unique_ptr<Transport> transport_;
  std::vector<Slot> slots_ GUARDED_BY(mu_);
  std::vector<uint32_t> free_slots_ GUARDED_BY(mu_);
  // Requests posted, and taken by the backend (its used entries, which it
  // returns in the order it took them; decision 124).
  uint64_t posted_ GUARDED_BY(mu_) = 0;
  uint64_t taken_ GUARDED_BY(mu_) = 0;
  std::vector<uint8_t*> event_bufs_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, std::shared_ptr<Conn>> conns_ GUARDED_BY(mu_);
  std::vector<int> waiters_ GUARDED_BY(mu_);
  int sleepers_ GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> missed_wakeups_{0};
  int missed_in_a_row_ GUARDED_BY(mu_) = 0;
  std::atomic<bool> alive_{false};
  std::atomic<int64_t> unanswered_since_ns_{0};
  pid_t owner_pid_ = 0;
  bool lost_ GUARDED_BY(mu_) = false;  // BackendLost ran
  bool released_ GUARDED_BY(mu_) = false;  // ReleaseIfUnused gave the memory back
  bool session_unknown_ GUARDED_BY(mu_) = false;  // the backend said so (Dispatch; decision 094)
  bool doorbell_ = false;   // set once, before the session is handed out
  bool ring_hold_ = false;  // likewise: kFeatureRingHold
  bool direct_ = false;     // likewise: kFeatureDirect (decision 97)
  bool direct_resend_ = false;  // likewise: kFeatureDirectResend (decision 135)
  // Direct connections (direct.h): their counts are pulled at every drain
  // and their peers asked to wake us before any sleep.
  std::vector<std::shared_ptr<Conn>> direct_conns_ GUARDED_BY(mu_);
  bool PullDirectLocked() REQUIRES(mu_);
  // A direct connection whose pair's memory could not be had or held an
  // impossible count: reset, as an ERROR from the backend would.
  void ResetDirectLocked(const std::shared_ptr<Conn>& c) REQUIRES(mu_);
  // A DIRECT whose memory could not be fetched or mapped (decision 135).
  void UnmappedDirectLocked(const std::shared_ptr<Conn>& c, const Status& why) REQUIRES(mu_);
  void PostUnmappedLocked() REQUIRES(mu_);
  std::vector<uint64_t> unmapped_owed_ GUARDED_BY(mu_);  // DOWNGRADE(direct-unavailable) still to post
  bool bulk_hint_ = false;  // likewise: kFeatureBulkHint
  bool naps_ = false;       // likewise: kFeatureNaps
  bool tentative_ = false;  // likewise: kFeatureTentative
  bool fork_resync_ = false;  // likewise: kFeatureForkResync
  bool move_back_ = false;    // likewise: kFeatureMoveBack
  std::atomic<bool> owe_kick_{false};
  std::atomic<uint64_t> consumed_since_kick_{0};
  // Rings of connections being unregistered or held (by conn id); guarded
  // by mu_. RINGS_RELEASED may come before UNREGISTER's answer is seen.
  struct Closing {
    uint8_t* tx;
    uint8_t* rx;
    bool answered_held = false;  // the answer said rings-held: freed at RINGS_RELEASED
    bool released = false;       // RINGS_RELEASED already came
  };
  std::unordered_map<uint64_t, Closing> closing_ GUARDED_BY(mu_);
  size_t held_ GUARDED_BY(mu_) = 0;
  uint64_t next_request_id_ GUARDED_BY(mu_) = 1;
};

}  // namespace vsocket::guest
