#include "guest/core/registration.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <atomic>
#include <cstring>

#include "base/clock.h"
#include "base/log.h"
#include "guest/core/config.h"
#include "guest/core/direct.h"
#include "guest/core/conn_state.h"
#include "guest/core/fd_table.h"
#include "guest/core/poll_ops.h"
#include "guest/core/session.h"
#include "guest/core/writer.h"

namespace vsocket::guest {

using proto::Message;
using proto::MsgType;
using proto::Reason;

namespace {

std::atomic<uint64_t> g_next_conn_id{1};

bool ToEndpoint(const sockaddr_storage& ss, proto::Endpoint* e) {
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    e->family = proto::Family::kIpv4;
    e->addr = {};
    std::memcpy(e->addr.data(), &a->sin_addr, 4);
    e->port = ntohs(a->sin_port);
    return true;
  }
  if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    e->port = ntohs(a->sin6_port);
    e->addr = {};
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
      // A dual-stack socket's IPv4 peer (::ffff:a.b.c.d): on the wire it is
      // the IPv4 connection its peer sees, and is named as one (vsocketd's
      // proof of the socket names it so too).
      e->family = proto::Family::kIpv4;
      std::memcpy(e->addr.data(), &a->sin6_addr.s6_addr[12], 4);
      return true;
    }
    e->family = proto::Family::kIpv6;
    std::memcpy(e->addr.data(), &a->sin6_addr, 16);
    return true;
  }
  return false;
}

// How often a connection that lost its backend tries to register again.
constexpr int64_t kRegisterRetryNs = 1'000'000'000;

void KernelForGood(Conn& c, Reason why) { c.state.Apply(ConnEvent::kKernelForGood, why); }

// How long a registration waits for rings on their way back (decision 44).
constexpr int64_t kRingWaitNs = 20'000'000;

// Rings for c. A burst of connections this side closed first can fill the
// region with rings that come back within moments: a lingering connection's
// once its peer consumed the last bytes, an unregistered one's once the
// backend answers or releases it. Those are taken back first (the writer's step, early); while
// some are still on their way, this waits for them up to kRingWaitNs, rather
// than leave the connection on kernel TCP for good. A region full of live
// connections fails at once.
Status AllocRingsWaiting(Session* s, Conn& c) {
  int64_t deadline = 0;
  for (;;) {
    Status rings = s->AllocRings(c, Config().ring_bytes);
    if (rings.ok()) return rings;
    // Connections closed behind our back hold rings that never come back
    // otherwise.
    if (ReclaimStale() > 0) continue;
    (void)s->Drain();
    size_t lingering = 0;
    if (ReclaimLingering(s, &lingering) > 0) continue;
    // (Some may have come back since the first try.)
    if (lingering == 0 && s->returning_rings() == 0) return s->AllocRings(c, Config().ring_bytes);
    int64_t now = MonotonicNs();
    if (deadline == 0) deadline = now + kRingWaitNs;
    if (now >= deadline || !s->alive()) {
      char why[96];
      snprintf(why, sizeof(why), "; waited %.1f ms, %zu lingering, %zu returning", (now - deadline + kRingWaitNs) / 1e6,
               lingering, s->returning_rings());
      return Status(rings.code(), rings.message() + why);
    }
    s->AwaitEvent(1);
  }
}

}  // namespace

Addresses ReadAddresses(int fd, Conn& c) {
  sockaddr_storage local{}, peer{};
  socklen_t ll = sizeof(local), pl = sizeof(peer);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) return Addresses::kNotConnected;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 || !ToEndpoint(local, &c.local) ||
      !ToEndpoint(peer, &c.peer))
    return Addresses::kOtherFamily;
  c.addressed.store(true, std::memory_order_release);
  return Addresses::kRead;
}

bool BulkWriter(const Conn& c) {
  uint64_t calls = c.stream.calls_out(), sent = c.kernel_sent.load(std::memory_order_relaxed);
  return calls > 0 && sent >= c.kernel_received.load(std::memory_order_relaxed) &&
         sent / calls >= proto::kBulkWriteBytes;
}

// Registers an established connection with the backend, once, at its first
// I/O (so a connection accepted by a parent and used by a forked child is
// registered by the child), or, where the policy holds request/response
// traffic on kernel TCP, at its first I/O after it streams. Data keeps
// flowing on kernel TCP meanwhile.
void EnsureRegistered(int fd, Conn& c) {
  if (c.state.phase() != Phase::kUnprobed) return;
  if (c.held.load(std::memory_order_relaxed) && !c.stream.streaming()) {
    // Request/response so far. (Held from birth: a report wants the
    // addresses once it is connected.)
    if (!Config().report_path.empty() && !c.addressed.load(std::memory_order_acquire)) {
      MutexLock lock(c.setup_mu);
      if (!c.addressed.load(std::memory_order_relaxed)) (void)ReadAddresses(fd, c);
    }
    return;
  }
  if (c.lost_backend.load(std::memory_order_relaxed) && MonotonicNs() < c.retry_at_ns.load(std::memory_order_relaxed))
    return;  // waiting for a backend to come back
  MutexLock lock(c.setup_mu);
  if (c.state.phase() != Phase::kUnprobed) return;
  if (!c.eligible) return KernelForGood(c, Reason::kInherited);
  if (c.urgent.load(std::memory_order_relaxed)) return KernelForGood(c, Reason::kUrgentData);
  if (!c.held.load(std::memory_order_relaxed) && Session::RegistersStreamsOnly() && Session::PolicyKnown()) {
    // Held until it streams (decision 51), at no cost: the addresses and
    // rules are looked at when it does (a report wants the addresses now).
    c.held.store(true, std::memory_order_relaxed);
    if (!Config().report_path.empty()) (void)ReadAddresses(fd, c);
    return;
  }
  switch (ReadAddresses(fd, c)) {
    case Addresses::kNotConnected: return;  // not connected yet
    case Addresses::kOtherFamily: return KernelForGood(c, Reason::kUnsupportedFamily);
    case Addresses::kRead: break;
  }
  if (!AccelerationAllowed(Config(), c.peer)) return KernelForGood(c, Reason::kDisabledByRule);
  Reason why = Reason::kBackendUnavailable;
  Session* s = Session::Get(&why);
  if (s == nullptr) {
    if (c.lost_backend.load(std::memory_order_relaxed) && why == Reason::kBackendUnavailable) {
      // It was accelerated (or about to be) when its backend went away:
      // kernel TCP meanwhile, and another try when one may be back.
      c.retry_at_ns.store(MonotonicNs() + kRegisterRetryNs, std::memory_order_relaxed);
      c.state.Apply(ConnEvent::kBackendLost, why);
      return;
    }
    return KernelForGood(c, why);
  }
  if (!s->answering()) {
    (void)s->Drain();  // it may have woken up since
    if (!s->answering()) return KernelForGood(c, Reason::kBackendUnavailable);  // logged once by the session
  }
  if (Session::RegistersStreamsOnly() && !c.stream.streaming()) {
    // The backend shares our few CPUs: kernel TCP until the connection
    // streams (decision 51). Its kernel I/O is noted from now on.
    c.held.store(true, std::memory_order_relaxed);
    return;
  }
  // Claimed until this attempt ends, registered or not.
  struct Unclaim {
    Conn* c = nullptr;
    ~Unclaim() {
      if (c != nullptr) c->claiming.store(false);
    }
  } unclaim;
  if (c.held.load(std::memory_order_relaxed)) {
    // Not while another thread sleeps in the kernel on it (a blocking recv,
    // a poll): its bytes could move to the ring under it. The next I/O
    // tries again.
    if (!c.ClaimRegistration()) return;
    unclaim.c = &c;
    VS_LOG(kDebug, "fd %d: streams after %llu kernel bytes: registering", fd,
           static_cast<unsigned long long>(c.kernel_sent.load() + c.kernel_received.load()));
    // Epoll waits the kernel alone answered must watch the session now.
    EpollKick(c);
  }
  Status rings = AllocRingsWaiting(s, c);
  if (!rings.ok()) {
    VS_LOG(kWarn, "%s: connection stays on kernel TCP", rings.ToString().c_str());
    return KernelForGood(c, Reason::kResourceLimit);
  }
  // The proof first, while the connection is not yet "registered" for the
  // other threads: a message they send about it must not overtake the
  // REGISTER_CONN (Shutdown waits for this call too).
  if (Status proof = s->ProveSocket(fd); !proof.ok()) {
    // Refused because the connection is over since we read its addresses
    // (another thread's shutdown() and the peer's FIN, or a reset: the
    // socket is no longer connected). No registration: it ended on kernel
    // TCP (a gRPC client's shutdown racing its poller's registration was
    // reported spoofed-address). (After the rings: a region full of live
    // connections fails at once, without a proof's round trip.)
    sockaddr_storage peer{};
    socklen_t pl = sizeof(peer);
    if (proof.code() == Code::kPermissionDenied && getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0 &&
        errno == ENOTCONN) {
      VS_LOG(kDebug, "fd %d: connection over before its registration: stays on kernel TCP", fd);
      s->FreeRings(c);
      return KernelForGood(c, Reason::kConnectionOver);
    }
    // Otherwise the registration below is answered spoofed-address: the
    // connection stays on kernel TCP like any refused one. (A channel that
    // failed or did not answer in time is worth a warning: the log then
    // says which way a spoofed-address came.)
    if (proof.code() == Code::kPermissionDenied)
      VS_LOG(kInfo, "fd %d: socket not proved to the backend: %s", fd, proof.ToString().c_str());
    else
      VS_LOG(kWarn, "fd %d: socket not proved to the backend: %s", fd, proof.ToString().c_str());
  }
  c.id = g_next_conn_id.fetch_add(1);
  c.session = s;
  c.fd_hint = fd;
  if (struct stat sock{}; fstat(fd, &sock) == 0) {
    c.sock_dev = sock.st_dev;
    c.sock_ino = sock.st_ino;
  }
  c.registered_ns = MonotonicNs();
  std::shared_ptr<Conn> self = Lookup(fd);
  // Tracked and pending before the request: the UPGRADE can race the ack.
  if (!s->TrackPending(self)) {
    // The session was lost meanwhile (it moved its connections on without
    // this one): registered again with the next backend, as they are.
    c.lost_backend.store(true, std::memory_order_relaxed);
    c.retry_at_ns.store(MonotonicNs() + kRegisterRetryNs, std::memory_order_relaxed);
    return;
  }
  proto::RegisterConn r{c.id, c.role, c.local, c.peer, s->Gpa(c.tx), s->Gpa(c.rx), c.ring_size, c.ring_size};
  // Registered by the policy because it streams: in large writes, vsocketd
  // keeps it on kernel TCP where its path copies more than the kernel's
  // (a peer across the tcp fabric; decision 62).
  if (c.held.load(std::memory_order_relaxed) && s->bulk_hint() && BulkWriter(c)) r.flags |= proto::kRegisterBulk;
  // Registered because its process's loop is busy, not because it streams:
  // withdrawn by the backend if the peer's process does not register it
  // too within proto::kTentativeWaitMs (decision 83).
  if (c.held.load(std::memory_order_relaxed) && c.stream.cause() == StreamDetector::Cause::kBusyLoop && s->tentative())
    r.flags |= proto::kRegisterTentative;
  // Registered only because its peer may be a direct pair's (decision 98):
  // withdrawn too if the pair would not be direct.
  if (c.held.load(std::memory_order_relaxed) && c.stream.cause() == StreamDetector::Cause::kDirectPeer &&
      s->tentative() && s->direct())
    r.flags |= proto::kRegisterTentative | proto::kRegisterDirect;
  Message resp;
  Status st = s->Call({MsgType::kRegisterConn, 0, r}, &resp);
  const auto* ack = std::get_if<proto::RegisterAck>(&resp.body);
  if (!st.ok() || ack == nullptr || ack->status != proto::WireError::kOk) {
    Reason reason = !st.ok() || ack == nullptr ? Reason::kBackendUnavailable : ack->reason;
    if (!st.ok() && !s->alive()) {
      // The backend went away while we asked (BackendLost moved the
      // connection on already: back to probing, or resyncing if its last
      // events upgraded it). Registered again with the next backend.
      c.retry_at_ns.store(MonotonicNs() + kRegisterRetryNs, std::memory_order_relaxed);
      s->Untrack(c.id);
      return;
    }
    // (kernel-faster is the backend's choice for the application's sake,
    // not a failure: the report names it.)
    if (reason == Reason::kKernelFaster)
      VS_LOG(kDebug, "registration refused (%s): stays on kernel TCP", proto::ToString(reason));
    else
      VS_LOG(kInfo, "registration refused (%s): stays on kernel TCP",
             st.ok() ? proto::ToString(reason) : st.ToString().c_str());
    // (An UPGRADE that raced a timed-out answer: the connection is untracked
    // and withdrawn below, so it fails rather than stays upgraded.)
    if (!c.state.Apply(ConnEvent::kKernelForGood, reason)) c.state.Apply(ConnEvent::kFail, reason);
    s->Untrack(c.id);
    if (st.ok() && ack != nullptr) {
      // Refused: the backend never used the rings.
      s->FreeRings(c);
    } else {
      // No answer: the request may still be processed. Withdraw it and
      // never reuse the rings (a small leak, only when the backend hangs).
      (void)s->Post({MsgType::kUnregister, 0, proto::Unregister{c.id}});
    }
    // Out of the session, as a withdrawn registration ends: on kernel TCP
    // until its own next I/O, so epoll defers its changes (decision 61)
    // and waits on it need no session wake-ups. (It kept the session
    // once: redis-benchmark -c 1 across hosts, every connection refused
    // kernel-faster, made 5 epoll_ctl and 2 epoll_pwait calls a request.)
    // Only while no other thread is inside a send or receive on it: those
    // read c.session under their lock (a receive may sleep there, holding
    // it); then the session stays, as it did before, costing only speed.
    if (c.tx_mu.try_lock()) {
      MutexLock tx(c.tx_mu, kAdoptLock);
      if (c.rx_mu.try_lock()) {
        MutexLock rx(c.rx_mu, kAdoptLock);
        c.session = nullptr;
      }
    }
    return;
  }
  // Shut down for writing before it registered (shutdown() found it
  // unregistered and told the backend nothing; its kernel FIN is sent): the
  // peer must hear it, or a reader there, upgraded, waits for our FENCE for
  // ever, though every byte we wrote came on the kernel stream. (A
  // shutdown() racing this one waits for setup_mu; PostShutWr posts once.)
  if (c.shut_wr.load()) PostShutWr(c);
}

bool NoteUrgent(Conn& c) {
  if (c.urgent.load(std::memory_order_relaxed)) return true;
  MutexLock lock(c.setup_mu);
  Phase p = c.state.phase();
  if (p != Phase::kUnprobed && p != Phase::kKernel && p != Phase::kWithdrawn) return false;
  if (p == Phase::kKernel && c.state.resynced()) return false;  // (registered once: a resend may follow)
  c.urgent.store(true, std::memory_order_relaxed);
  return true;
}

void MaybeMoveBack(Conn& c) {
  if (c.stream.cause() != StreamDetector::Cause::kBusyLoop) return;
  // A direct pair costs one wake-up per one-way as the kernel does, none
  // when the reader polls: a lone request/response connection is faster
  // there than on kernel TCP (decision 98), so it stays (decision 112).
  if (c.direct) return;
  BusyLoop* loop = ActiveBusyLoop();
  if (loop == nullptr) return;
  if (loop->busy()) {
    if (c.quiet_turns_mark.load(std::memory_order_relaxed) != 0) c.quiet_turns_mark.store(0, std::memory_order_relaxed);
    return;
  }
  if (loop->quiet_ns(MonotonicNs()) < kMoveBackAfterNs) return;
  // Only a connection that went on turning while its loop was quiet: one
  // idle through the lull and active again as the loop gets busy again
  // stays where it is (the busy signal is judged once a window of waits,
  // in which each of a busy loop's connections turns tens of times).
  uint64_t turns = c.stream.turns() + 1;  // (0: no mark yet)
  uint64_t mark = c.quiet_turns_mark.load(std::memory_order_relaxed);
  if (mark == 0) {
    c.quiet_turns_mark.store(turns, std::memory_order_relaxed);
    return;
  }
  if (turns - mark < kMoveBackTurns) return;
  Session* s = c.session;
  if (s == nullptr || !s->move_back() || c.state.phase() != Phase::kUpgraded || c.state.draining() ||
      c.move_back_asked.exchange(true))
    return;
  Message resp;
  Status st = s->Call(
      {MsgType::kDowngrade, 0, proto::Downgrade{c.id, Reason::kKernelFaster, 0, proto::kDowngradeDrain}}, &resp, 1000);
  const auto* ack = std::get_if<proto::RegisterAck>(&resp.body);
  VS_LOG(kDebug, "conn %lu: its event loop is no longer busy: %s", static_cast<unsigned long>(c.id),
         st.ok() && ack != nullptr && ack->status == proto::WireError::kOk ? "back to kernel TCP (drain asked)"
                                                                          : "stays on the rings (drain refused)");
  s->TryDrain();  // (the DOWNGRADE(drain) it raised)
}

void EndWithdrawnLocked(Conn& c) {
  if (c.state.phase() != Phase::kWithdrawn) return;
  Session* s = c.session;
  if (s != nullptr && s->alive()) {
    // Never upgraded: the backend hands the rings back at once.
    Status st = s->Unregister(c);
    if (!st.ok()) VS_LOG(kDebug, "unregister of a withdrawn registration: %s", st.ToString().c_str());
  }
  c.session = nullptr;
  if (s != nullptr && !s->alive()) s->ReleaseIfUnused();
  // Registered for its busy loop and withdrawn because the peer's process
  // was not one (decision 83): held again, to qualify again after a pause
  // that doubles with each withdrawal. Anything else: kernel TCP for good.
  if (c.held.load(std::memory_order_relaxed) && c.stream.cause() == StreamDetector::Cause::kBusyLoop &&
      c.state.reason() == Reason::kPeerNotRegistered && !c.urgent.load(std::memory_order_relaxed) &&
      c.state.Apply(ConnEvent::kHoldAgain)) {
    c.stream.HoldAgain(MonotonicNs());
    return;
  }
  // Registered for a direct pair (decision 98): the peer's process did not
  // register in time (held again, to try after the same doubling pause),
  // or the pair could not be direct (kernel-faster: held again, never for
  // that rule again; the stream and busy-loop rules still apply).
  Reason why = c.state.reason();
  if (c.held.load(std::memory_order_relaxed) && c.stream.cause() == StreamDetector::Cause::kDirectPeer &&
      !c.urgent.load(std::memory_order_relaxed) && (why == Reason::kPeerNotRegistered || why == Reason::kKernelFaster) &&
      c.state.Apply(ConnEvent::kHoldAgain)) {
    if (why == Reason::kKernelFaster) c.stream.NoDirectPeer();
    else c.stream.HoldAgain(MonotonicNs());
    return;
  }
  (void)c.state.Apply(ConnEvent::kEndWithdrawn);
}

void FenceBeforeEndLocked(Conn& c) {
  Session* s = c.session;
  if (s == nullptr || !s->alive() || !c.state.upgraded() || c.state.phase() != Phase::kUpgraded ||
      c.state.tx_on_ring() || c.state.draining())
    return;
  (void)SwitchTxLocked(c);
}

Status SwitchTxLocked(Conn& c) {
  uint64_t sent = c.kernel_sent.load();
  if (c.direct) {
    // A direct peer reads our FENCE in the pair's memory, whatever vsocketd
    // took (before any ring byte and before our kernel FIN): once it is
    // there we have switched, and a resync puts a RESYNC header after our
    // kernel bytes (decision 134). A peer that left the pair first closed
    // the word: no switch, the kernel stream goes on.
    if (!PublishDirectFence(c, sent)) return Status(Code::kAlreadyExists, "the direct peer left the pair");
    Status st = c.session->Post({MsgType::kFence, 0, proto::ConnCounter{c.id, sent}}, nullptr);
    if (!st.ok())
      VS_LOG(kDebug, "conn %lu: FENCE not posted (%s): the pair's memory has it", static_cast<unsigned long>(c.id),
             st.ToString().c_str());
  } else {
    // Its place among the requests says whether the peer can have it
    // (decision 124).
    VS_RETURN_IF_ERROR(c.session->Post({MsgType::kFence, 0, proto::ConnCounter{c.id, sent}}, &c.fence_seq));
  }
  c.fence_sent.store(sent);
  c.state.SwitchTx();
  return Status::Ok();
}

void PostShutWr(Conn& c) {
  Session* s = c.session;
  if (s == nullptr || c.shut_wr_posted.exchange(true)) return;
  PublishDirectShutWr(c);  // (a direct peer sees it at once; the backend passes it on too)
  (void)s->Post({MsgType::kShutdown, 0, proto::Shutdown{c.id, proto::ShutdownHow::kWrite}});
}

// The end of a closed connection's registration (at close(), or when its
// linger ends): UNREGISTER.
void Unregistered(Conn& c) {
  Session* s = c.session;
  if (s != nullptr && s->alive() && c.state.registered()) {
    // The backend keeps any bytes not yet delivered; the rings are reused
    // once it no longer reads or lets peers write them.
    Status st = s->Unregister(c);
    if (!st.ok()) VS_LOG(kWarn, "unregister: %s", st.ToString().c_str());
  }
  c.session = nullptr;
  if (c.state.registered()) c.state.Apply(ConnEvent::kClose);
  if (s != nullptr && !s->alive()) s->ReleaseIfUnused();  // (the last one off a lost session's rings)
}

// The end of a closed connection that resets its peer, as the kernel's RST
// after close() does (unread data, SO_LINGER {on, 0}, data arriving after
// close): SHUTDOWN both ways on the accelerated path, then UNREGISTER.
void Aborted(Conn& c) {
  Session* s = c.session;
  if (s != nullptr && s->alive())
    (void)s->Post({MsgType::kShutdown, 0, proto::Shutdown{c.id, proto::ShutdownHow::kBoth}});
  Unregistered(c);
}

// Whether the backend has c paired, or accepted a pairing whose peer may
// already have switched (asked on kernel EOF before our UPGRADE).
bool PairingInFlight(Conn& c) {
  proto::Message resp;
  if (!c.session->Call({MsgType::kPairingQuery, 0, proto::ConnCounter{c.id, 0}}, &resp).ok()) return false;
  auto* ack = std::get_if<proto::RegisterAck>(&resp.body);
  return ack != nullptr && ack->status == proto::WireError::kOk && ack->reason == Reason::kNone;
}

}  // namespace vsocket::guest
