#include "guest/core/session.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/log.h"
#include "base/unix_addr.h"
#include "guest/core/config.h"
#include "guest/core/conn_events.h"
#include "guest/core/cpu_share.h"
#include "guest/core/direct.h"
#include "guest/core/direct_ring.h"
#include "guest/core/writer.h"
#include "guest/sys/libc.h"

namespace vsocket::guest {

using proto::Message;
using proto::MsgType;

namespace {

constexpr uint32_t kSlotBytes = 128;  // largest request: REGISTER_CONN, 88 bytes
constexpr uint32_t kEventBufBytes = 4096;
constexpr size_t kEventBufs = 64;
// Backend unreachable: retry later, 50 ms after losing it (a restart, a
// guest that moved: its socket path leads to the new host's vsocketd within
// moments), backing off to once a second.
constexpr int64_t kRetryMinNs = 50'000'000;
constexpr int64_t kRetryMaxNs = 1'000'000'000;

Mutex g_init_mu;
Session* g_session = nullptr;
// Written under g_init_mu by Get; BackendLost (which may run inside Get,
// under g_init_mu already) stores it without the lock.
std::atomic<int64_t> g_last_attempt_ns{0};
std::atomic<int64_t> g_retry_ns{kRetryMinNs};  // wait after the last attempt (guarded by g_init_mu to write)
proto::Reason g_last_failure = proto::Reason::kBackendUnavailable;
std::atomic<bool> g_sleep_at_once{false};
std::atomic<bool> g_streams_only{false};
std::atomic<bool> g_busy_rule{false};
std::atomic<bool> g_direct_rule{false};
// Set with the rules above by a session's start; kept across fork.
std::atomic<bool> g_policy_known{false};
std::atomic<Session::LinkLostHandler> g_link_lost{nullptr};

}  // namespace

Session* Session::Existing() {
  Session* s = __atomic_load_n(&g_session, __ATOMIC_ACQUIRE);
  return s != nullptr && s->alive() ? s : nullptr;
}

Session* Session::Get(proto::Reason* why) {
  if (Session* s = Existing()) return s;
  const GuestConfig& cfg = Config();
  if (!cfg.enabled) {
    *why = proto::Reason::kDisabledByRule;
    return nullptr;
  }
  if (cfg.socket_path.empty()) {
    *why = proto::Reason::kBackendUnavailable;
    return nullptr;
  }
  MutexLock lock(g_init_mu);
  if (Session* s = Existing()) return s;  // another thread connected meanwhile
  int64_t now = MonotonicNs();
  int64_t last = g_last_attempt_ns.load(std::memory_order_relaxed);
  if (last != 0 && now - last < g_retry_ns.load(std::memory_order_relaxed)) {
    *why = g_last_failure;
    return nullptr;
  }
  g_last_attempt_ns.store(now, std::memory_order_relaxed);
  VS_LOG(kDebug, "connecting to vsocketd at %s", cfg.socket_path.c_str());
  auto* fresh = new Session();
  Status st = fresh->Open();
  if (st.ok()) st = fresh->Negotiate();
  if (!st.ok()) {
    static std::atomic<bool> told{false};
    if (st.code() == Code::kPermissionDenied && !told.exchange(true))
      VS_LOG(kWarn, "%s: connections stay on kernel TCP", st.message().c_str());
    else
      VS_LOG(kInfo, "backend unavailable (%s): connections stay on kernel TCP", st.ToString().c_str());
    // Never handed out: nothing else refers to it. Its region and fds go
    // (the backend, if it got that far, keeps its own mapping and fds).
    // Retried 50 ms later, backing off to once a second while the backend is away.
    delete fresh;
    g_retry_ns.store(std::min(2 * g_retry_ns.load(std::memory_order_relaxed), kRetryMaxNs), std::memory_order_relaxed);
    g_last_failure = proto::Reason::kBackendUnavailable;
    *why = g_last_failure;
    return nullptr;
  }
  // Polling or not, and registering at once or once streaming, are decided
  // per backend: a restarted vsocketd may run on other CPUs.
  bool auto_upgrade = cfg.upgrade == UpgradePolicy::kAuto;
  CpuShare share = cfg.poll_auto || auto_upgrade ? fresh->transport_->BackendCpus() : CpuShare{};
  g_sleep_at_once.store(cfg.poll_auto && share.sleep_at_once, std::memory_order_relaxed);
  g_streams_only.store(auto_upgrade && share.sleep_at_once, std::memory_order_relaxed);
  g_busy_rule.store(auto_upgrade && share.sleep_at_once && fresh->tentative_, std::memory_order_relaxed);
  g_direct_rule.store(auto_upgrade && share.sleep_at_once && fresh->tentative_ && fresh->direct_,
                      std::memory_order_relaxed);
  g_policy_known.store(true, std::memory_order_release);
  VS_LOG(kDebug, "session up in %.1f ms", (MonotonicNs() - now) / 1e6);
  if (share.sleep_at_once)
    VS_LOG(kInfo,
           "vsocketd runs on all %d CPUs this process can use: %s; %s",
           share.mine,
           cfg.poll_auto ? "blocked calls sleep at once (VSOCKET_POLL_AUTO=0 polls anyway)" : "blocked calls poll first",
           auto_upgrade ? "connections are accelerated once they stream (VSOCKET_UPGRADE=always: at once)"
                        : "connections are accelerated at once");
  g_retry_ns.store(kRetryMinNs, std::memory_order_relaxed);
  __atomic_store_n(&g_session, fresh, __ATOMIC_RELEASE);
  return fresh;
}

void Session::SetLinkLostHandler(LinkLostHandler h) { g_link_lost.store(h, std::memory_order_release); }

bool Session::SleepAtOnce() { return g_sleep_at_once.load(std::memory_order_relaxed); }

bool Session::RegistersStreamsOnly() { return g_streams_only.load(std::memory_order_relaxed); }
bool Session::BusyLoopRule() { return g_busy_rule.load(std::memory_order_relaxed); }
bool Session::DirectPeerRule() { return g_direct_rule.load(std::memory_order_relaxed); }

bool Session::PolicyKnown() {
  if (!g_policy_known.load(std::memory_order_acquire)) return false;
  Session* s = __atomic_load_n(&g_session, __ATOMIC_ACQUIRE);
  return s == nullptr || s->alive();  // (this process's own session lost: ask again)
}

namespace {

// A stream socket listens at path: vsocketd's port (process mode), not the
// agent's seqpacket socket (a VM: connecting there would take a function).
// The probe's connection ends at once (vsocketd drops it unseen).
bool StreamSocketAt(const std::string& path) {
  auto addr = UnixAddress(path);
  if (!addr.ok()) return false;
  int fd = Libc().socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  bool stream = Libc().connect(fd, AsSockaddr(*addr), sizeof(*addr)) == 0;
  Libc().close(fd);
  return stream;
}

}  // namespace

void Session::LearnPolicy() {
  const GuestConfig& cfg = Config();
  if (cfg.upgrade != UpgradePolicy::kAuto || !cfg.enabled || PolicyKnown()) return;
  // Only a process-mode backend can hold connections (an agent's reports no
  // CPU share: its rules accelerate at once, nothing to learn). (A live
  // session made the rules known: PolicyKnown above answered for it.)
  if (!StreamSocketAt(cfg.socket_path)) return;
  proto::Reason why;
  (void)Get(&why);
}

void Session::ForgetAfterFork() {
  // The child shares the parent's rings and vhost-user socket; using them
  // would corrupt the parent's session. Leak the object (its memory is the
  // parent's rings too), close our copies of its fds, start over lazily.
  if (g_session != nullptr && g_session->transport_) g_session->transport_->CloseFdsAfterFork();
  g_session = nullptr;
  g_last_attempt_ns.store(0, std::memory_order_relaxed);
  new (&g_init_mu) Mutex();
}

void Session::DestroyForTesting() {
  Session* s = g_session;
  g_session = nullptr;
  g_last_attempt_ns.store(0, std::memory_order_relaxed);
  for (auto* rule : {&g_sleep_at_once, &g_streams_only, &g_busy_rule, &g_direct_rule, &g_policy_known})
    rule->store(false, std::memory_order_relaxed);
  delete s;
}

Status Session::Open() {
  auto t = OpenTransport();
  if (!t.ok()) return t.status();
  transport_ = std::move(t).value();
  MutexLock lock(mu_);  // (not handed out yet: for the analysis)
  vhost::RegionAllocator& mem = transport_->allocator();
  const uint32_t slots = transport_->queue(QueueId::kRequests).size() / 2;  // two descriptors a request
  for (uint32_t i = 0; i < slots; ++i) {
    uint8_t* m = mem.Allocate(2 * kSlotBytes);
    if (!m) return Status(Code::kResourceExhausted, "region too small");
    slots_.push_back(Slot{m, m + kSlotBytes});
    free_slots_.push_back(slots - 1 - i);
  }
  for (size_t i = 0; i < kEventBufs; ++i) {
    uint8_t* m = mem.Allocate(kEventBufBytes);
    if (!m) return Status(Code::kResourceExhausted, "region too small");
    event_bufs_.push_back(m);
  }
  vhost::VirtqueueDriver& eq = transport_->queue(QueueId::kEvents);
  for (size_t i = 0; i < kEventBufs; ++i) {
    vhost::VirtqueueDriver::Buf in{Gpa(event_bufs_[i]), kEventBufBytes};
    if (!eq.Add({}, {&in, 1}, i).ok()) return Status(Code::kInternal, "cannot post event buffers");
  }
  if (eq.Publish()) transport_->Kick(QueueId::kEvents);
  eq.DisableInterrupts();
  transport_->queue(QueueId::kRequests).DisableInterrupts();
  owner_pid_ = getpid();
  alive_.store(true, std::memory_order_release);
  return Status::Ok();
}

// Offers the features this library can use; the backend answers with the
// ones the session gets (an older backend: none).
Status Session::Negotiate() {
  proto::Hello hello;
  hello.pid = static_cast<uint32_t>(getpid());
  hello.features = (Config().doorbell ? proto::kFeatureDoorbell : 0) |
                   (Config().ring_hold ? proto::kFeatureRingHold : 0) | proto::kFeatureFenceDelivered |
                   proto::kFeatureCleanDowngrade | proto::kFeatureBulkHint | proto::kFeatureNaps |
                   (Config().busy_events > 0 ? proto::kFeatureTentative | proto::kFeatureMoveBack : 0) |
                   proto::kFeatureForkResync |
                   (Config().direct ? proto::kFeatureDirect | proto::kFeatureDirectResend : 0) |
                   // (Only a reason's name: proto::ToString names it in the report.)
                   proto::kFeatureDirectoryUnavailable;
  proto::Message resp;
  VS_RETURN_IF_ERROR(Call({MsgType::kHello, 0, hello}, &resp));
  const auto* ack = std::get_if<proto::HelloAck>(&resp.body);
  if (resp.type != MsgType::kHelloAck || ack == nullptr)
    return Status(Code::kInternal, std::string("HELLO answered with ") + proto::ToString(resp.type));
  if (ack->status != proto::WireError::kOk)
    return Status(Code::kFailedPrecondition, std::string("HELLO refused: ") + proto::ToString(ack->status));
  doorbell_ = (ack->features & hello.features & proto::kFeatureDoorbell) != 0;
  ring_hold_ = (ack->features & hello.features & proto::kFeatureRingHold) != 0;
  bulk_hint_ = (ack->features & hello.features & proto::kFeatureBulkHint) != 0;
  naps_ = (ack->features & hello.features & proto::kFeatureNaps) != 0;
  tentative_ = (ack->features & hello.features & proto::kFeatureTentative) != 0;
  fork_resync_ = (ack->features & hello.features & proto::kFeatureForkResync) != 0;
  move_back_ = (ack->features & hello.features & proto::kFeatureMoveBack) != 0;
  direct_ = (ack->features & hello.features & proto::kFeatureDirect) != 0;
  direct_resend_ = direct_ && (ack->features & hello.features & proto::kFeatureDirectResend) != 0;
  // Process mode: registrations name sockets this process proves it holds
  // (a port without a proof socket does not ask for it).
  Status proof = transport_->OpenProofs();
  if (!proof.ok() && proof.code() != Code::kNotFound)
    VS_LOG(kWarn, "socket proof channel: %s (registrations will be refused: spoofed-address)",
           proof.ToString().c_str());
  return Status::Ok();
}

Status Session::ProveSocket(int fd) {
  return transport_->proves_sockets() ? transport_->ProveSocket(fd) : Status::Ok();
}

std::string Session::QueueStates() {
  MutexLock lock(mu_);
  return QueueStatesLocked();
}

std::string Session::QueueStatesLocked() {
  std::string out;
  for (QueueId q : {QueueId::kEvents, QueueId::kRequests}) {
    vhost::VirtqueueDriver& d = transport_->queue(q);
    char b[200];
    snprintf(b, sizeof(b), "%s: avail %u, used %u, seen %u, used_event %u, avail flags %u, free %u%s%s; ",
             q == QueueId::kEvents ? "events" : "requests", d.avail_idx(),
             d.ring().used_idx().load(std::memory_order_acquire), d.last_used_idx(),
             d.ring().used_event().load(std::memory_order_relaxed),
             d.ring().avail_flags().load(std::memory_order_relaxed), d.num_free(), d.broken() ? " (broken)" : "",
             d.DeviceCannotCall() ? " (the backend says it cannot call: decision 129)" : "");
    out += b;
  }
  char b[96];
  snprintf(b, sizeof(b), "sleepers %d, alive %d", sleepers_, alive() ? 1 : 0);
  return out + b;
}

int Session::event_fd() const { return transport_->wake_fd(QueueId::kEvents); }
int Session::liveness_fd() const { return transport_->liveness_fd(); }

bool Session::CheckBackend() {
  if (alive() && !transport_->BackendGone()) return true;
  // (Under mu_: a BackendLost under way in another thread finishes first,
  // so the caller sees its connections moved on.)
  MutexLock lock(mu_);
  BackendLost();
  return false;
}
int Session::request_fd() const { return transport_->wake_fd(QueueId::kRequests); }

Status Session::SubmitLocked(const Message& m, bool want_response, uint32_t* slot_out, std::atomic<uint64_t>* seq) {
  if (!alive()) return Status(Code::kUnavailable, "backend session lost");
  if (free_slots_.empty()) return Status(Code::kResourceExhausted, "no request slot");
  uint32_t s = free_slots_.back();
  Slot& slot = slots_[s];
  auto n = proto::Encode(m, {slot.req, kSlotBytes});
  if (!n.ok()) return n.status();
  vhost::VirtqueueDriver::Buf out{Gpa(slot.req), static_cast<uint32_t>(*n)};
  vhost::VirtqueueDriver::Buf in{Gpa(slot.resp), kSlotBytes};
  auto head =
      transport_->queue(QueueId::kRequests)
          .Add({&out, 1}, want_response ? std::span(&in, 1) : std::span<const vhost::VirtqueueDriver::Buf>(), s);
  if (!head.ok()) return head.status();
  free_slots_.pop_back();
  ++posted_;
  if (seq != nullptr) seq->store(posted_, std::memory_order_relaxed);
  slot.in_flight = true;
  slot.submitted_ns = MonotonicNs();
  slot.want_response = want_response;
  slot.done = false;
  if (transport_->queue(QueueId::kRequests).Publish()) {
    transport_->Kick(QueueId::kRequests);
  } else {
    NoteProduced();  // (a napping backend sees it at its next pass, or our kick)
  }
  *slot_out = s;
  return Status::Ok();
}

void Session::KickOwed() {
  if (!owe_kick_.exchange(false, std::memory_order_acq_rel)) return;
  consumed_since_kick_.store(0, std::memory_order_relaxed);
  transport_->Kick(QueueId::kRequests);
}

Status Session::Post(const Message& msg, std::atomic<uint64_t>* seq) {
  int64_t deadline = MonotonicNs() + 3'000'000'000;
  for (;;) {
    {
      MutexLock lock(mu_);
      uint32_t slot;
      Status st = SubmitLocked(msg, false, &slot, seq);
      if (st.code() != Code::kResourceExhausted) return st;
      DrainLocked();
      st = SubmitLocked(msg, false, &slot, seq);
      if (st.code() != Code::kResourceExhausted) return st;
    }
    if (MonotonicNs() > deadline) return Status(Code::kDeadlineExceeded, "backend not answering");
    if (!CheckBackend()) return Status(Code::kUnavailable, "backend session lost");
    AwaitEvent(10);
  }
}

Status Session::Call(const Message& request, Message* response, int timeout_ms) {
  int64_t deadline = MonotonicNs() + int64_t{timeout_ms} * 1000000;
  uint32_t slot = 0;
  Message req = request;
  for (;;) {
    {
      MutexLock lock(mu_);
      req.request_id = next_request_id_++;
      Status st = SubmitLocked(req, true, &slot);
      if (st.ok()) break;
      if (st.code() != Code::kResourceExhausted) return st;
      DrainLocked();
    }
    if (MonotonicNs() > deadline) return Status(Code::kDeadlineExceeded, "backend not answering");
    usleep(100);
  }
  int64_t spin_until = MonotonicNs() + int64_t{Config().poll_us} * 1000;
  KickIfOwed();  // (a napping backend: our request now, not at its next pass)
  for (uint32_t iter = 0;; ++iter) {
    {
      MutexLock lock(mu_);
      DrainLocked();
      Slot& s = slots_[slot];
      if (s.done) {
        s.in_flight = false;
        free_slots_.push_back(slot);
        auto m = proto::Decode({s.resp, s.resp_len});
        if (!m.ok()) return m.status();
        if (m->request_id != req.request_id) return Status(Code::kDataLoss, "response does not match the request");
        *response = *m;
        return Status::Ok();
      }
      if (!alive()) return Status(Code::kUnavailable, "backend session lost");
      if (MonotonicNs() > deadline) {
        s.want_response = false;  // freed when it completes
        int64_t none = 0;
        if (unanswered_since_ns_.compare_exchange_strong(none, s.submitted_ns, std::memory_order_acq_rel))
          VS_LOG(kWarn, "vsocketd did not answer in %d ms: new connections stay on kernel TCP until it answers again",
                 timeout_ms);
        return Status(Code::kDeadlineExceeded, "backend did not answer in time");
      }
    }
    if (MonotonicNs() < spin_until) {
      SpinStep(iter);
      continue;
    }
    AwaitEvent(5);
  }
}

void Session::AwaitEvent(int timeout_ms) {
  if (!PrepareSleep()) return;
  pollfd p[3] = {{request_fd(), POLLIN, 0}, {event_fd(), POLLIN, 0}, {liveness_fd(), POLLIN, 0}};
  Libc().poll(p, 3, timeout_ms);
  DoneSleeping();
  if (p[2].revents) {
    MutexLock lock(mu_);
    BackendLost();
  }
}

bool Session::Drain() {
  MutexLock lock(mu_);
  return DrainLocked();
}

bool Session::TryDrain() {
  if (!mu_.try_lock()) return false;
  bool changed = DrainLocked();
  mu_.unlock();
  return changed;
}

void Session::Answered(int64_t submitted_ns) {
  // (A request older than the one that went unanswered may have been done
  // before the backend stopped, and only be seen now.)
  int64_t since = unanswered_since_ns_.load(std::memory_order_relaxed);
  if (since != 0 && submitted_ns >= since &&
      unanswered_since_ns_.compare_exchange_strong(since, 0, std::memory_order_acq_rel))
    VS_LOG(kWarn, "vsocketd answers again after %.1f s: new connections are accelerated again",
           (MonotonicNs() - since) / 1e9);
}

bool Session::DrainLocked() {
  if (!alive()) return false;
  bool changed = false;
  vhost::VirtqueueDriver& rq = transport_->queue(QueueId::kRequests);
  while (auto u = rq.PopUsed()) {
    ++taken_;
    Slot& s = slots_[u->cookie];
    Answered(s.submitted_ns);
    if (s.want_response) {
      s.done = true;
      s.resp_len = u->len;
    } else {
      s.in_flight = false;
      free_slots_.push_back(static_cast<uint32_t>(u->cookie));
    }
  }
  vhost::VirtqueueDriver& eq = transport_->queue(QueueId::kEvents);
  bool reposted = false;
  while (auto u = eq.PopUsed()) {
    const uint8_t* buf = event_bufs_[u->cookie];
    size_t off = 0;
    while (off < u->len) {
      size_t consumed = 0;
      auto m = proto::Decode({buf + off, u->len - off}, &consumed);
      if (!m.ok()) {
        VS_LOG(kWarn, "bad event from backend: %s", m.status().ToString().c_str());
        break;  // rest of this buffer is untrustworthy
      }
      Dispatch(*m);
      off += consumed;
      changed = true;
    }
    vhost::VirtqueueDriver::Buf in{Gpa(event_bufs_[u->cookie]), kEventBufBytes};
    (void)eq.Add({}, {&in, 1}, u->cookie);
    reposted = true;
  }
  if (reposted && eq.Publish()) transport_->Kick(QueueId::kEvents);
  if (rq.broken() || eq.broken()) {
    VS_LOG(kError, "backend broke the virtqueue protocol: %s%s", rq.broken_reason(), eq.broken_reason());
    BackendLost();
    changed = true;
  }
  if (session_unknown_ && !lost_) {
    VS_LOG(kWarn, "vsocketd does not know this session (the VM moved to another host): opening a new one");
    BackendLost();
    changed = true;
  }
  if (!direct_conns_.empty()) changed |= PullDirectLocked();
  if (!unmapped_owed_.empty() && !lost_) PostUnmappedLocked();
  if (changed) NotifyWaitersLocked();
  if (sleepers_ > 0) {
    eq.EnableInterrupts();
    rq.EnableInterrupts();
  }
  return changed;
}

void Session::Dispatch(const Message& m) {
  // ERROR for connection 0 (the session as a whole) as an event: this
  // vsocketd never saw our session (the VM arrived from another host,
  // decision 094). DrainLocked then takes the backend for gone.
  if (m.type == MsgType::kError && std::get<proto::Error>(m.body).conn_id == 0) {
    session_unknown_ = true;
    return;
  }
  if (m.type == MsgType::kRingsReleased) {
    auto it = closing_.find(std::get<proto::ConnCounter>(m.body).conn_id);
    if (it == closing_.end()) return;  // not ours to free (a confused backend)
    if (!it->second.answered_held) {
      it->second.released = true;  // the UNREGISTER answer is still on its way
      return;
    }
    transport_->allocator().Free(it->second.tx);
    transport_->allocator().Free(it->second.rx);
    closing_.erase(it);
    --held_;
    return;
  }
  auto it = conns_.find(EventConnId(m));
  if (it == conns_.end()) return;  // closed meanwhile
  const std::shared_ptr<Conn>& c = it->second;
  if (m.type == MsgType::kDirect) {
    // (Before its UPGRADE: no ring byte has moved yet.)
    Status st = direct_ ? AttachDirect(*c, *transport_, std::get<proto::ConnCounter>(m.body).bytes)
                        : Status(Code::kFailedPrecondition, "the session did not take kFeatureDirect");
    if (st.ok()) {
      direct_conns_.push_back(c);
    } else {
      UnmappedDirectLocked(c, st);
    }
    return;
  }
  if (c->direct) {
    // Its counts come from the pair's memory, never from the backend; an
    // EOF the backend passes on follows the counts before it there.
    if (m.type == MsgType::kRxTail || m.type == MsgType::kCredit) return;
    if (m.type == MsgType::kShutdown || m.type == MsgType::kDowngrade) PullDirect(*c);
  }
  DispatchConnEvent(c, m, g_link_lost.load(std::memory_order_acquire));
}

void Session::UnmappedDirectLocked(const std::shared_ptr<Conn>& c, const Status& why) {
  // (Before its UPGRADE: we never switched, our kernel stream is whole.)
  // Its peer may have switched onto the pair and written there: it must
  // resend that on the kernel socket, from byte 0 with no header, which
  // vsocketd tells it (decision 135); we read our kernel socket as plain
  // kernel TCP from here on. If vsocketd goes first, the peer finds our
  // `attached` word 0 and does the same.
  if (!direct_resend_) {
    // (An older vsocketd: it cannot tell the peer.)
    VS_LOG(kWarn, "conn %lu: no direct ring pair: %s: connection reset", static_cast<unsigned long>(c->id),
           why.ToString().c_str());
    ResetDirectLocked(c);
    return;
  }
  VS_LOG(kWarn, "conn %lu: no direct ring pair: %s: on kernel TCP, the peer resends there",
         static_cast<unsigned long>(c->id), why.ToString().c_str());
  ApplyLoss(c, LossKind::kPeerAborted, 0, false, proto::Reason::kDirectUnavailable, nullptr);
  c->gen.fetch_add(1, std::memory_order_acq_rel);
  unmapped_owed_.push_back(c->id);
  PostUnmappedLocked();
}

void Session::PostUnmappedLocked() {
  // Posted without an answer: a full request queue leaves the rest for the
  // next drain (before it, nothing of ours names the connection: its
  // UNREGISTER waits for our next call on it).
  while (!unmapped_owed_.empty()) {
    uint32_t slot = 0;
    Status st = SubmitLocked({MsgType::kDowngrade, 0,
                              proto::Downgrade{unmapped_owed_.front(), proto::Reason::kDirectUnavailable, 0,
                                               proto::kDowngradeResendFrom}},
                             false, &slot, nullptr);
    if (st.code() == Code::kResourceExhausted) return;
    if (!st.ok())
      VS_LOG(kWarn, "conn %lu: DOWNGRADE(direct-unavailable): %s", static_cast<unsigned long>(unmapped_owed_.front()),
             st.ToString().c_str());
    unmapped_owed_.erase(unmapped_owed_.begin());
  }
}

void Session::ResetDirectLocked(const std::shared_ptr<Conn>& c) {
  // As the backend's ERROR for it (ECONNRESET), with the reason the
  // report names: the peer's corrupted counts.
  ApplyLoss(c, LossKind::kProtocolError, 0, false, proto::Reason::kPeerCorruptedRing, nullptr);
  c->gen.fetch_add(1, std::memory_order_acq_rel);
}

bool Session::PullDirectLocked() {
  bool changed = false;
  for (size_t i = 0; i < direct_conns_.size();) {
    const std::shared_ptr<Conn>& c = direct_conns_[i];
    changed |= PullDirect(*c);
    if (c->direct_broken.load(std::memory_order_relaxed)) {
      // The peer wrote a count that cannot be: this connection is reset.
      ResetDirectLocked(c);
      direct_conns_[i] = std::move(direct_conns_.back());
      direct_conns_.pop_back();
      changed = true;
      continue;
    }
    ++i;
  }
  return changed;
}

void Session::NotifyWaitersLocked() {
  uint64_t one = 1;
  for (int efd : waiters_) (void)!Libc().write(efd, &one, sizeof(one));
}

void Session::WakeWaiters() {
  MutexLock lock(mu_);
  NotifyWaitersLocked();
}

void Session::AddWaiter(int efd) {
  MutexLock lock(mu_);
  waiters_.push_back(efd);
}

void Session::RemoveWaiter(int efd) {
  MutexLock lock(mu_);
  waiters_.erase(std::remove(waiters_.begin(), waiters_.end(), efd), waiters_.end());
}

bool Session::PrepareSleep() {
  MutexLock lock(mu_);
  if (!alive()) return false;
  ++sleepers_;
  bool pending = transport_->queue(QueueId::kEvents).EnableInterrupts();
  pending |= transport_->queue(QueueId::kRequests).EnableInterrupts();
  if (!direct_conns_.empty()) {
    // Direct peers wake us only when asked (direct.h), then one last look.
    for (const auto& c : direct_conns_) ArmDirect(*c);
    FenceDirectAsks(direct_conns_);
    if (PullDirectLocked()) {
      // What that look took may be another thread's to read, and that
      // thread may have looked before it and sleep after it: the peer, not
      // asked then, wakes nobody (pgbench -j 2 stalled for good). As a
      // drain that dispatched something, wake every waiter.
      NotifyWaitersLocked();
      pending = true;
    }
  }
  if (pending) {
    --sleepers_;
    DrainLocked();
    return false;
  }
  return true;
}

void Session::NoteTimedOutSleep() {
  MutexLock lock(mu_);
  if (!alive()) return;
  bool waiting = false;
  for (QueueId q : {QueueId::kEvents, QueueId::kRequests}) {
    vhost::VirtqueueDriver& d = transport_->queue(q);
    waiting |= d.ring().used_idx().load(std::memory_order_acquire) != d.last_used_idx();
  }
  if (!waiting) return;
  uint64_t n = missed_wakeups_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (n == 1 || n == 10 || n == 100 || n == 1000)
    VS_LOG(kWarn, "a sleep ended by its timeout with the backend's entries waiting (%llu so far: its wake-up never "
           "came): %s", static_cast<unsigned long long>(n), QueueStatesLocked().c_str());
  if (++missed_in_a_row_ != kMissedWakeupsLost) return;
  // (In a VM: QEMU gives vsocketd no call eventfd for a function whose INTx
  // was disabled as its device (re)started, e.g. at a resume: decision 128.
  // vsocketd flags it in the used rings and the VM's agent restarts that
  // device's queues with INTx on within 200 ms: decision 129. Giving the
  // session up here would close the connections, as an exit, for peers
  // that still read their rings.)
  VS_LOG(kWarn, "the backend's wake-ups no longer come (%d sleeps in a row ran to their timeout with its entries "
         "waiting): waits on this session now find its answers only at their timeouts (decision 128)",
         kMissedWakeupsLost);
}

bool Session::WakeUpsLost() {
  MutexLock lock(mu_);
  return missed_in_a_row_ >= kMissedWakeupsLost;
}

void Session::DoneSleeping() {
  MutexLock lock(mu_);
  if (--sleepers_ == 0 && alive()) {
    transport_->queue(QueueId::kEvents).DisableInterrupts();
    transport_->queue(QueueId::kRequests).DisableInterrupts();
  }
  uint64_t v;
  bool called = Libc().read(event_fd(), &v, sizeof(v)) > 0;
  called |= Libc().read(request_fd(), &v, sizeof(v)) > 0;
  if (called) missed_in_a_row_ = 0;  // the backend's wake-ups do come
  // We consumed a call another sleeper may be waiting for: act on it (the
  // drain wakes every waiter if anything changed).
  if (called && alive()) DrainLocked();
}

Status Session::AllocRings(Conn& c, uint32_t ring_bytes) {
  MutexLock lock(mu_);
  // With the doorbell, its block follows the TX ring (proto/control.h).
  uint32_t extra = doorbell_ ? proto::kDoorbellBytes : 0;
  uint8_t* tx = transport_->allocator().Allocate(ring_bytes + extra, 64);
  uint8_t* rx = tx ? transport_->allocator().Allocate(ring_bytes, 64) : nullptr;
  if (rx == nullptr) {
    transport_->allocator().Free(tx);
    char why[160];
    snprintf(why, sizeof(why), "shared region full: %zu of %zu bytes in use, %zu connections tracked, %zu closing (%zu held)",
             transport_->allocator().bytes_in_use(), transport_->memory_bytes(), conns_.size(), closing_.size(), held_);
    return Status(Code::kResourceExhausted, why);
  }
  c.tx = tx;
  c.rx = rx;
  c.ring_size = ring_bytes;
  c.db = nullptr;
  if (doorbell_) {
    auto* db = new (tx + ring_bytes) proto::DoorbellBlock{};
    // Until the backend polls it, every count is announced.
    db->want_tx = db->want_consumed = 1;
    c.db = db;
  }
  return Status::Ok();
}

void Session::FreeRings(Conn& c) {
  MutexLock lock(mu_);
  transport_->allocator().Free(c.owned_tx());
  transport_->allocator().Free(c.owned_rx());
  c.tx = c.rx = c.region_tx = c.region_rx = nullptr;
  c.db = nullptr;
}

Status Session::Unregister(Conn& c) {
  if (!answering()) {
    // A backend that does not answer: told without waiting, and the rings
    // are never reused (it may still use them when it wakes up).
    Status st = Post({MsgType::kUnregister, 0, proto::Unregister{c.id}});
    Untrack(c.id);
    c.tx = c.rx = c.region_tx = c.region_rx = nullptr;
    c.db = nullptr;
    return st.ok() ? Status(Code::kDeadlineExceeded, "backend not answering: rings left to it") : st;
  }
  {
    MutexLock lock(mu_);
    closing_[c.id] = Closing{c.owned_tx(), c.owned_rx()};
    // (A DOWNGRADE(direct-unavailable) still owed goes first: after the
    // UNREGISTER vsocketd would not know the connection it names.)
    if (!unmapped_owed_.empty()) PostUnmappedLocked();
  }
  Message resp;
  Status st = Call({MsgType::kUnregister, 0, proto::Unregister{c.id}}, &resp);
  Untrack(c.id);
  MutexLock lock(mu_);
  auto it = closing_.find(c.id);
  const auto* ack = std::get_if<proto::RegisterAck>(&resp.body);
  if (!st.ok()) {
    closing_.erase(it);  // no answer: the backend may still use them; never reused
  } else if (ring_hold_ && ack != nullptr && ack->reason == proto::Reason::kRingsHeld && !it->second.released) {
    it->second.answered_held = true;
    ++held_;
    VS_LOG(kDebug, "conn %lu: rings held until the backend's sends and peer writes are done",
           static_cast<unsigned long>(c.id));
  } else {
    transport_->allocator().Free(c.owned_tx());
    transport_->allocator().Free(c.owned_rx());
    closing_.erase(it);
  }
  c.tx = c.rx = c.region_tx = c.region_rx = nullptr;
  c.db = nullptr;
  return st;
}

size_t Session::returning_rings() const {
  MutexLock lock(mu_);
  return closing_.size();
}

std::vector<std::shared_ptr<Conn>> Session::Tracked() const {
  MutexLock lock(mu_);
  std::vector<std::shared_ptr<Conn>> out;
  out.reserve(conns_.size());
  for (const auto& [id, c] : conns_) out.push_back(c);
  return out;
}

void Session::Track(const std::shared_ptr<Conn>& c) {
  MutexLock lock(mu_);
  conns_[c->id] = c;
}

bool Session::TrackPending(const std::shared_ptr<Conn>& c) {
  MutexLock lock(mu_);
  if (lost_) return false;
  conns_[c->id] = c;
  c->state.Apply(ConnEvent::kRegistered);
  return true;
}

void Session::Untrack(uint64_t conn_id) {
  MutexLock lock(mu_);
  conns_.erase(conn_id);
  std::erase_if(direct_conns_, [&](const std::shared_ptr<Conn>& c) { return c->id == conn_id; });
}

// Requires mu_. Every connection finishes on kernel TCP without losing a
// byte, as after a fabric link loss (RESYNC): the kernel connection is
// still there, and each side still holds every byte the other has not
// consumed. What landed in our RX ring is what we were told of (the rest is
// resent); our FENCE reached the peer's library if the backend said so
// (FENCE_DELIVERED), or if the peer consumed any byte of our ring (it reads
// the ring only past our fence); it never reached it if the backend never
// took it from our request queue (then our ring stream follows our kernel
// bytes with no header: decision 124). Otherwise the peer may not know
// where our kernel bytes end: that connection is reset rather than guessed
// (resync.cc). Pending connections stay exact on kernel TCP and register
// again once a backend is back.
void Session::BackendLost() {
  if (!alive() || lost_) return;
  lost_ = true;
  // A queue the backend broke: it may still be running (a bug, or a
  // hostile peer of ours), so nothing here proves where bytes are: reset
  // what was upgraded, as the ring protocol's violation demands.
  bool broken = transport_->queue(QueueId::kRequests).broken() || transport_->queue(QueueId::kEvents).broken();
  // What the backend published before it went is in our memory still: a
  // FENCE there says where the peer's kernel bytes end, an RX_TAIL how many
  // landed, a CREDIT how many the peer consumed. Take them all before
  // deciding (the peer's library decides from the same events).
  if (!broken) DrainLocked();
  VS_LOG(kWarn, "%s",
         broken ? "the backend broke the session: upgraded connections are reset"
                : "lost the backend session: connections finish on kernel TCP (RESYNC) and register again later");
  LinkLostHandler handler = g_link_lost.load(std::memory_order_acquire);
  for (auto& [id, c] : conns_) {
    // Our RX tail is what landed; the peer has our FENCE if the backend said
    // so (FENCE_DELIVERED) or it consumed any byte of our ring, and cannot
    // have it if the backend never took it from the request queue (it acts
    // on a FENCE only once its used entry is published: decision 124).
    uint64_t landed = c->rx_tail.load(std::memory_order_acquire);
    bool fence_acked =
        c->fence_delivered.load(std::memory_order_acquire) || c->credit.load(std::memory_order_acquire) > 0;
    uint64_t fence_seq = c->fence_seq.load(std::memory_order_relaxed);
    c->fence_unread.store(!broken && !fence_acked && fence_seq != 0 && taken_ < fence_seq,
                          std::memory_order_relaxed);
    ApplyLoss(c, broken ? LossKind::kBackendBroken : LossKind::kBackendGone, landed, fence_acked,
              broken ? proto::Reason::kProtocolError : proto::Reason::kBackendUnavailable, handler);
    c->gen.fetch_add(1);
  }
  // Last: whoever sees the session dead sees its connections moved on.
  alive_.store(false, std::memory_order_release);
  NotifyWaitersLocked();
  g_last_attempt_ns.store(MonotonicNs(), std::memory_order_relaxed);
  ReleaseIfUnusedLocked();
}

void Session::ReleaseIfUnused() {
  MutexLock lock(mu_);
  ReleaseIfUnusedLocked();
}

void Session::ReleaseIfUnusedLocked() {
  if (!lost_ || released_) return;
  // Only a resyncing connection still reads our rings (its landed bytes,
  // its resend); pending ones register again elsewhere, reset or closed
  // ones read nothing. (c->session: MaybeReregister and a close clear it
  // once the connection is off the rings.)
  for (const auto& [id, c] : conns_)
    if (c->session == this && c->state.phase() == Phase::kResyncing) return;
  released_ = true;
  transport_->ReleaseMemory();
  // Everything here pointed into that memory: nothing is freed or reused
  // there any more. (The connections live on in the fd table.)
  size_t tracked = conns_.size();
  conns_.clear();
  direct_conns_.clear();
  closing_.clear();
  held_ = 0;
  VS_LOG(kInfo, "lost session: its %zu KiB of ring memory given back (%zu connections had been on it)",
         transport_->memory_bytes() >> 10, tracked);
}

}  // namespace vsocket::guest
