// One TCP connection as libvsocket sees it. The application's fd is the
// kernel socket; this object adds the upgrade state and, once upgraded, the
// two byte rings in the shared region.
//
// Locking: `tx_mu` serializes senders, `rx_mu` receivers (a blocked sender
// never blocks a receiver). Lock order: tx_mu/rx_mu, then the session lock.
// Fields written by event dispatch (under the session lock) are atomics.
// The compiler checks the rest (-Wthread-safety): a field only ever touched
// with a lock held says GUARDED_BY, a function that needs one REQUIRES it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/mutex.h"
#include "base/own_fd.h"
#include "guest/core/conn_state.h"
#include "guest/core/direct_ring.h"
#include "guest/core/stream_detector.h"
#include "proto/control.h"

namespace vsocket::guest {

class Session;

// A Session* read and written by several threads without a lock.
class SessionRef {
 public:
  SessionRef() = default;
  SessionRef(const SessionRef&) = delete;
  SessionRef& operator=(const SessionRef&) = delete;
  SessionRef& operator=(Session* s) {
    p_.store(s, std::memory_order_release);
    return *this;
  }
  operator Session*() const { return p_.load(std::memory_order_acquire); }  // NOLINT: used as the pointer
  Session* operator->() const { return p_.load(std::memory_order_acquire); }

 private:
  std::atomic<Session*> p_{nullptr};
};

// A connection's direct pair's memory (decision 97), read without a lock
// by readiness checks (poll, epoll) while the connection's owner may retire
// it. A retired pair's mapping stays until the connection is destroyed, so
// such a reader never touches unmapped memory; the slot itself says null at
// once. (Each move away from the rings and back costs one mapping of a
// pair's rings; moves are paced by the drain and hold-again rules.)
class DirectSlot {
 public:
  DirectSlot() = default;
  DirectSlot(const DirectSlot&) = delete;
  DirectSlot& operator=(const DirectSlot&) = delete;
  // Requires the connection's setup (registration) path.
  void Set(std::unique_ptr<DirectRing> ring) {
    maps_.push_back(std::move(ring));
    p_.store(maps_.back().get(), std::memory_order_release);
  }
  void Retire() { p_.store(nullptr, std::memory_order_release); }
  DirectRing* get() const { return p_.load(std::memory_order_acquire); }
  DirectRing* operator->() const { return get(); }
  explicit operator bool() const { return get() != nullptr; }

 private:
  std::atomic<DirectRing*> p_{nullptr};
  std::vector<std::unique_ptr<DirectRing>> maps_;
};

struct Conn {
  // Identity (set once at registration).
  int family = 0;
  proto::Endpoint local, peer;
  std::atomic<bool> addressed{false};  // local and peer were read (ReadAddresses)
  proto::Role role = proto::Role::kClient;
  uint64_t id = 0;

  // Lock order: setup_mu, tx_mu, rx_mu (a thread that holds a later one
  // never waits for an earlier one), then the session lock. Stated for the
  // analysis below; clang 14 checks it with -Wthread-safety-beta only.
  Mutex tx_mu ACQUIRED_AFTER(setup_mu);
  Mutex rx_mu ACQUIRED_AFTER(setup_mu, tx_mu);
  // Registration and teardown. It guards no field by itself: what a
  // registration sets (session, the rings, eligible, fd_hint, ...) is read
  // by the I/O paths without it, published by the state's phase.
  Mutex setup_mu;
  // Phase, reason, history and each direction's switch: every change of
  // them goes through this state machine (conn_state.h).
  ConnState state;
  std::atomic<bool> nonblocking{false};  // cached O_NONBLOCK of the open file

  bool eligible = false;       // created in this process (socket/accept): byte counts are exact
  // The session it is registered with. Written under setup_mu (registration,
  // its end, a fork) but read lock-free by the I/O and wait paths, so an
  // atomic pointer (release store, acquire load: plain moves on x86), used
  // like the raw pointer it was.
  SessionRef session;

  // Held on kernel TCP by the upgrade policy until it streams (decision 51):
  // eligible, not registered; its kernel I/O is noted in `stream`.
  std::atomic<bool> held{false};
  StreamDetector stream;
  // listen() succeeded: never registers, never carries data.
  std::atomic<bool> listening{false};
  // Threads asleep in the kernel on this connection while it is held (a
  // blocking recv, a poll): while there are any, it does not register
  // (decision 51), so its bytes cannot move to the rings under them.
  std::atomic<int> kernel_sleepers{0};
  std::atomic<bool> claiming{false};  // a held connection is registering

  // Held by the upgrade policy and not streaming yet: it registers only at
  // its own I/O, after which it never is again.
  bool HeldQuiet() const {
    return session == nullptr && held.load(std::memory_order_relaxed) && !stream.streaming() &&
           state.phase() == Phase::kUnprobed;
  }
  // On kernel TCP and staying there until its own next I/O: a listener, a
  // connection kernel for good, or a held one. A wait on it alone needs no
  // session's wake-ups (a held one that registers kicks epoll waits,
  // EpollKick; a kernel sleeper holds the registration off: EnterKernelSleep).
  bool KernelUntilOwnIo() const {
    if (session != nullptr) return false;
    return listening.load(std::memory_order_relaxed) || state.phase() == Phase::kKernel || HeldQuiet();
    // (A withdrawn one still has its session: it ends the registration at
    // its next call, then is one of these.)
  }
  // Before a held connection's thread sleeps in the kernel on it: true, and
  // it will not register until LeaveKernelSleep; false if it is registering
  // already (sleep on the registered path instead).
  // A Dekker pair with ClaimRegistration: each side's seq_cst write, then
  // its seq_cst read of the other's flag (all four in one total order, so
  // at least one side sees the other; no separate fence is needed).
  bool EnterKernelSleep() {
    kernel_sleepers.fetch_add(1);
    if (!claiming.load() && session == nullptr && state.phase() == Phase::kUnprobed) return true;
    kernel_sleepers.fetch_sub(1);
    return false;
  }
  void LeaveKernelSleep() { kernel_sleepers.fetch_sub(1); }
  // A held connection that streams, about to register: false (and nothing
  // changed) while a thread sleeps in the kernel on it; the next I/O tries
  // again.
  bool ClaimRegistration() {
    claiming.store(true);
    if (kernel_sleepers.load() == 0) return true;  // (the pair: EnterKernelSleep)
    claiming.store(false);
    return false;
  }

  std::atomic<uint64_t> kernel_sent{0};      // bytes the app sent on the kernel path
  std::atomic<uint64_t> kernel_received{0};  // bytes the app received on the kernel path
  // Written under the side's mutex, read lock-free by poll/epoll.
  std::atomic<uint64_t> tx_tail{0};  // bytes produced into TX
  std::atomic<uint64_t> rx_head{0};  // bytes consumed from RX
  uint64_t consumed_reported GUARDED_BY(rx_mu) = 0;
  bool wrote_after_peer_gone GUARDED_BY(tx_mu) = false;
  std::atomic<bool> shut_wr{false};
  std::atomic<bool> shut_wr_posted{false};  // our SHUTDOWN (write) went to the backend (PostShutWr)
  // The application sent urgent data (MSG_OOB) on kernel TCP: never
  // registers (decision 79).
  std::atomic<bool> urgent{false};
  std::atomic<bool> shut_rd{false};
  uint8_t* tx = nullptr;
  uint8_t* rx = nullptr;
  proto::DoorbellBlock* db = nullptr;  // after tx, when the session has the doorbell
  uint32_t ring_size = 0;
  // A direct pair (decision 97, guest/core/direct.h): set by the DIRECT
  // event before the UPGRADE; tx, rx and ring_size are then the pair's own
  // memory's, and the rings the registration gave the backend stay ours
  // (region_tx/rx) until the session frees them. Retired (RetireDirect)
  // when the connection, back on kernel TCP, leaves its registration to
  // register again: its next pair is a new one.
  DirectSlot direct;
  // The peer process's wake eventfd, one of the library's own fds.
  struct OwnedFd {
    int fd = -1;
    ~OwnedFd() {
      if (fd >= 0) CloseOwnFd(fd);
    }
  } direct_wake;
  std::atomic<bool> direct_broken{false};  // the peer's counts were impossible (reset)
  uint8_t* region_tx = nullptr;
  uint8_t* region_rx = nullptr;
  uint8_t* owned_tx() const { return region_tx != nullptr ? region_tx : tx; }
  uint8_t* owned_rx() const { return region_rx != nullptr ? region_rx : rx; }
  int64_t registered_ns = 0;

  // Written by event dispatch.
  std::atomic<bool> peer_fence_known{false};
  std::atomic<uint64_t> peer_fence{0};
  std::atomic<uint64_t> rx_tail{0};
  std::atomic<uint64_t> credit{0};        // bytes the peer consumed
  std::atomic<bool> peer_shut_wr{false};  // EOF after rx_tail
  std::atomic<bool> peer_gone{false};     // peer reads no more: EPIPE
  std::atomic<uint32_t> gen{0};           // bumped on every event (epoll ET)
  // When the last RX_TAIL that brought bytes, or the peer's EOF, was
  // dispatched; and how many sleeps began after it yet ended long after
  // with those bytes found (a missed wake-up: NoteLateWakeup, wait.h).
  std::atomic<int64_t> rx_event_ns{0};
  std::atomic<uint32_t> late_wakeups{0};

  // Back to kernel TCP after the fabric link was lost (RESYNC, see
  // docs/fabric-design.md "Link loss and RESYNC"; state.resynced()). Set by
  // dispatch; the two directions then finish the downgrade at their own pace.
  std::atomic<bool> resync_fence_acked{false};  // the peer has our FENCE
  std::atomic<bool> fence_delivered{false};     // FENCE_DELIVERED came (the backend may go)
  // Our FENCE's place among the session's requests (Session::Post), and,
  // at a backend's loss, whether the backend never took it from the
  // request queue: then no peer can have it, and our ring stream goes on
  // on the kernel socket from byte 0 with no RESYNC header (decision 124).
  std::atomic<uint64_t> fence_seq{0};
  std::atomic<bool> fence_unread{false};
  // The backend went away while this connection was registered: it
  // registers again when one is back, trying no sooner than retry_at_ns.
  std::atomic<bool> lost_backend{false};
  std::atomic<int64_t> retry_at_ns{0};
  std::atomic<uint64_t> resync_landed{0};  // accelerated bytes in our RX ring, final
  // Not kNone: our ring stream goes on on the kernel socket from byte
  // resend_from, with no RESYNC header, for this cause: the peer's process
  // forked (kForked, decision 85: from what its application consumed) or
  // it could not map our direct pair (kDirectUnavailable, decision 135:
  // from 0). Stored before the phase changes.
  std::atomic<proto::Reason> resend_headerless{proto::Reason::kNone};
  std::atomic<uint64_t> resend_from{0};
  // TX (under tx_mu): the RESYNC header and the unacknowledged TX bytes,
  // written on the kernel socket before any new byte.
  bool tx_resync_started GUARDED_BY(tx_mu) = false;
  bool shut_after_resend GUARDED_BY(tx_mu) = false;  // shutdown(SHUT_WR) waits for the resend
  std::atomic<bool> fin_deferred{false};  // shutdown(SHUT_WR) kept the kernel FIN back (reported)
  std::atomic<int> resync_fd{-1};         // our dup of the socket while the resend is owed
  // close() before the peer consumed our accelerated bytes: the background
  // writer keeps this dup of the socket (no FIN yet) and the registration,
  // so a link loss can still be repaired by a resend (see Linger()).
  std::atomic<int> linger_fd{-1};
  // (Written by close() before linger_fd is stored, read by the writer
  // after it loaded it: published by that atomic, under no lock.)
  int64_t linger_start_ns = 0;
  // close() after the peer's EOF came by the ring but before its kernel
  // FIN did (it sends it once we consumed its bytes): the writer keeps this
  // dup until that FIN arrives (AwaitPeerFin), so the side that closed
  // first is the one whose FIN goes first and which keeps TIME_WAIT, as
  // with kernel TCP.
  std::atomic<int> await_fin_fd{-1};
  int64_t await_fin_start_ns = 0;  // (published by await_fin_fd, as linger_start_ns)
  int fd_hint = -1;                         // an fd of the app's naming it (set at registration)
  // The kernel socket's identity (fstat st_dev, st_ino) when it registered:
  // an fd that names something else now was closed behind our back
  // (ReclaimStale, fd_table.h).
  uint64_t sock_dev = 0, sock_ino = 0;
  std::atomic<int64_t> resync_start_ns{0};  // (writer and event dispatch)
  std::atomic<uint32_t> reupgrades{0};      // times it registered again after a RESYNC
  std::atomic<uint64_t> resent_bytes{0};    // accelerated bytes sent again on kernel TCP (RESYNC)
  // Bytes of the kernel stream that carry no new byte of the application:
  // RESYNC headers, and ring bytes sent again (tx) or read again and
  // skipped (rx). They are positions in the stream (kernel_sent and
  // kernel_received count them, the fences need that); the report leaves
  // them out so that each end counts every byte of the application once.
  std::atomic<uint64_t> kernel_tx_repeat{0}, kernel_rx_repeat{0};
  std::vector<uint8_t> resend GUARDED_BY(tx_mu);
  size_t resend_off GUARDED_BY(tx_mu) = 0;
  // A drain (connection-lifecycle.md §9; its steps are the state's:
  // state.draining(), drain_tx(), drain_rx()): why, and where our ring
  // stream ended (stored before the tx-ring-end step, under tx_mu).
  std::atomic<proto::Reason> drain_reason{proto::Reason::kOperator};
  // Its busy loop went quiet and vsocketd was asked to move it back to
  // kernel TCP (decision 92), once per registration.
  std::atomic<bool> move_back_asked{false};
  // Its turns (+1) when it was first seen with its loop quiet (0: not
  // since the loop was last busy); MaybeMoveBack.
  std::atomic<uint64_t> quiet_turns_mark{0};
  std::atomic<uint64_t> tx_ring_end{0};
  // RX (under rx_mu; state.rx_resync() says the step): the header read so
  // far, and the resent bytes still to skip.
  uint8_t rx_hdr[16] GUARDED_BY(rx_mu) = {};
  uint32_t rx_hdr_got GUARDED_BY(rx_mu) = 0;
  uint64_t rx_skip GUARDED_BY(rx_mu) = 0;

  // Statistics. fence_sent: kernel_sent when this side switched over.
  std::atomic<uint64_t> fence_sent{0};
  std::atomic<uint64_t> accel_tx{0}, accel_rx{0};  // (written under tx_mu / rx_mu alone)
  std::atomic<int> fd_refs{0};  // fds in the fd table naming this conn
};

}  // namespace vsocket::guest
