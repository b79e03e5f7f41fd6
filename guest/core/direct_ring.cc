#include "guest/core/direct_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cstdio>
#include <string>

#include "proto/control.h"

namespace vsocket::guest {

namespace {

template <typename T>
std::atomic_ref<T> Word(T& v) {
  return std::atomic_ref<T>(v);
}

Status Corrupt(const char* what, uint64_t got, uint64_t lo, uint64_t hi) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "direct peer's %s %llu outside [%llu, %llu]", what,
                static_cast<unsigned long long>(got), static_cast<unsigned long long>(lo),
                static_cast<unsigned long long>(hi));
  return Status(Code::kDataLoss, buf);
}

}  // namespace

Result<std::unique_ptr<DirectRing>> DirectRing::Map(int memfd, int side) {
  if (side != 0 && side != 1) return Status(Code::kInvalidArgument, "direct side must be 0 or 1");
  // Sealed, or the peer could shrink the file under us (SIGBUS) or seal it
  // against our writes.
  constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  int seals = fcntl(memfd, F_GET_SEALS);
  if (seals < 0) return Status::FromErrno("direct memory: F_GET_SEALS");
  if ((seals & kSeals) != kSeals) return Status(Code::kPermissionDenied, "direct memory is not sealed");
  struct stat st {};
  if (fstat(memfd, &st) != 0) return Status::FromErrno("direct memory: fstat");
  size_t size = static_cast<size_t>(st.st_size);
  if (size < proto::kDirectRingsOffset) return Status(Code::kInvalidArgument, "direct memory too small");
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (p == MAP_FAILED) return Status::FromErrno("direct memory: mmap");
  std::unique_ptr<DirectRing> r(new DirectRing());
  r->base_ = p;
  r->bytes_ = size;
  // The header is read once (the peer may rewrite it later: we keep ours).
  auto* h = static_cast<proto::DirectHeader*>(p);
  uint32_t magic = Word(h->magic).load(std::memory_order_acquire);
  uint16_t version = Word(h->version).load(std::memory_order_relaxed);
  uint32_t ring = Word(h->ring_bytes).load(std::memory_order_relaxed);
  if (magic != proto::kDirectMagic || version != proto::kDirectVersion)
    return Status(Code::kInvalidArgument, "direct memory: bad magic or version");
  if (!proto::IsValidRingSize(ring) || size != proto::DirectBytes(ring))
    return Status(Code::kInvalidArgument, "direct memory: ring size " + std::to_string(ring) + " does not fit " +
                                              std::to_string(size) + " bytes");
  auto* b = static_cast<uint8_t*>(p);
  r->side_ = side;
  r->ring_bytes_ = ring;
  r->sides_[0] = reinterpret_cast<proto::DirectSide*>(b + proto::kDirectSideOffset[0]);
  r->sides_[1] = reinterpret_cast<proto::DirectSide*>(b + proto::kDirectSideOffset[1]);
  r->tx_ = b + proto::DirectRingOffset(side, ring);
  r->rx_ = b + proto::DirectRingOffset(1 - side, ring);
  return r;
}

DirectRing::~DirectRing() {
  if (base_ != nullptr) munmap(base_, bytes_);
}

DirectRing::Peer DirectRing::Load() const {
  proto::DirectSide* s = peer();
  Peer v;
  // Flags first, counts after (acquire): a shut_wr or ring_end seen means
  // every count stored before it is seen too.
  v.fence_set = Word(s->fence_set).load(std::memory_order_acquire) == 1;  // (2: closed by us)
  if (v.fence_set) v.fence = Word(s->fence).load(std::memory_order_relaxed);
  v.shut_wr = Word(s->shut_wr).load(std::memory_order_acquire) != 0;
  v.ring_end = Word(s->ring_end).load(std::memory_order_acquire);
  v.produced = Word(s->produced).load(std::memory_order_acquire);
  v.consumed = Word(s->consumed).load(std::memory_order_acquire);
  // (Once seen, kept: a peer that takes its promise back harms only its
  // own wake-ups.)
  if (!peer_promised_.load(std::memory_order_relaxed) && Word(s->heavy_asks).load(std::memory_order_relaxed) == 1)
    peer_promised_.store(true, std::memory_order_relaxed);
  return v;
}

Status DirectRing::Check(const Peer& v, uint64_t rx_tail, uint64_t credit, uint64_t rx_head, uint64_t tx_tail) const {
  if (v.produced < rx_tail || v.produced > rx_head + ring_bytes_)
    return Corrupt("produced count", v.produced, rx_tail, rx_head + ring_bytes_);
  if (v.consumed < credit || v.consumed > tx_tail) return Corrupt("consumed count", v.consumed, credit, tx_tail);
  if (v.ring_end != proto::kDirectOpen && (v.ring_end < rx_tail || v.produced > v.ring_end))
    return Corrupt("ring end", v.ring_end, rx_tail, v.produced);
  return Status::Ok();
}

bool DirectRing::TakeAsk(uint32_t proto::DirectSide::*want, int kind) {
  // (The doorbell pattern: our store, a full fence, then the peer's ask.
  // In light mode, a compiler barrier only: the peer's FenceAsks fences
  // for both of us. A full fence here waited for our store to reach the
  // peer's CPU, 80% of a 16-byte send's time while the peer polls.)
  bool light = kind >= 0 && light_[kind];
  if (light) LightFence();
  else std::atomic_thread_fence(std::memory_order_seq_cst);
  auto flag = Word(mine()->*want);
  bool asked = flag.load(std::memory_order_relaxed) != 0 && flag.exchange(0, std::memory_order_acq_rel) != 0;
  if (kind < 0) return asked;
  uint32_t proto::DirectSide::*word = kind == 0 ? &proto::DirectSide::light_produced : &proto::DirectSide::light_consumed;
  if (asked) {
    // The peer sleeps often (again within kLightAfter publishes): full
    // fences again, so that its asks need no membarrier. Less often, each
    // of its membarriers buys kLightAfter fences here: light it stays.
    if (light && streak_[kind] < kLightAfter) {
      light_[kind] = false;
      Word(mine()->*word).store(0, std::memory_order_release);
    }
    streak_[kind] = 0;
  } else if (++streak_[kind] >= kLightAfter && !light && promised_ && peer_promised_.load(std::memory_order_relaxed)) {
    // Into light mode: the flag first, then a full fence, so that either
    // the peer's next ask sees it (and fences heavily) or our next look
    // sees the ask (FenceAsks fences after its asks before it looks).
    Word(mine()->*word).store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    light_[kind] = true;
    went_light_.store(true, std::memory_order_relaxed);
  }
  return asked;
}

bool DirectRing::PublishProduced(uint64_t produced) {
  Word(mine()->produced).store(produced, std::memory_order_release);
  return TakeAsk(&proto::DirectSide::want_produced, 0);
}

bool DirectRing::PublishConsumed(uint64_t consumed) {
  Word(mine()->consumed).store(consumed, std::memory_order_release);
  return TakeAsk(&proto::DirectSide::want_consumed, 1);
}

bool DirectRing::PublishShutWr() {
  Word(mine()->shut_wr).store(1, std::memory_order_release);
  return TakeAsk(&proto::DirectSide::want_produced, -1);
}

bool DirectRing::PublishFence(uint64_t fence, bool* wake) {
  *wake = false;
  Word(mine()->fence).store(fence, std::memory_order_relaxed);
  // One word both sides may write (decision 134): open (0), our FENCE (1),
  // or closed by the peer (2). Whoever changes it first decides.
  uint32_t was = 0;
  if (!Word(mine()->fence_set).compare_exchange_strong(was, 1, std::memory_order_seq_cst) && was != 1) return false;
  *wake = TakeAsk(&proto::DirectSide::want_produced, -1);
  return true;
}

bool DirectRing::CloseFence(uint64_t* fence) {
  uint32_t was = 0;
  if (Word(peer()->fence_set).compare_exchange_strong(was, 2, std::memory_order_seq_cst)) return false;
  if (was != 1) return false;  // (closed already, or a value a peer made up: no FENCE)
  *fence = Word(peer()->fence).load(std::memory_order_relaxed);
  return true;
}

bool DirectRing::Attach() {
  uint32_t was = 0;
  return Word(mine()->attached).compare_exchange_strong(was, 1, std::memory_order_seq_cst) || was == 1;
}

bool DirectRing::ClosePeerAttach() {
  uint32_t was = 0;
  if (Word(peer()->attached).compare_exchange_strong(was, 2, std::memory_order_seq_cst)) return true;
  return was == 2;  // (1: it mapped; a value a peer made up is taken as that, the usual RESYNC)
}

bool DirectRing::PeerAttached() const {
  return Word(peer()->attached).load(std::memory_order_acquire) == 1;
}

bool DirectRing::PublishRingEnd(uint64_t end) {
  Word(mine()->ring_end).store(end, std::memory_order_release);
  return TakeAsk(&proto::DirectSide::want_produced, -1);
}

void DirectRing::WantProduced() {
  Word(peer()->want_produced).store(1, std::memory_order_relaxed);
  asked_ |= kAskedProduced;
}

void DirectRing::WantConsumed() {
  Word(peer()->want_consumed).store(1, std::memory_order_relaxed);
  asked_ |= kAskedConsumed;
}

bool DirectRing::AskedOfLightPeer() {
  uint8_t asked = asked_;
  asked_ = 0;
  // (Only a ring of ours that promised heeds the peer's words; a peer in
  // light mode without our promise is breaking its own wake-ups. Only what
  // we asked for: a peer whose consumed counts go light (we rarely wait
  // for room) says nothing of a wait for its answer.)
  if (!promised_) return false;
  proto::DirectSide* s = peer();
  return ((asked & kAskedProduced) && Word(s->light_produced).load(std::memory_order_relaxed) != 0) ||
         ((asked & kAskedConsumed) && Word(s->light_consumed).load(std::memory_order_relaxed) != 0);
}

void DirectRing::PromiseHeavyAsks() {
  if (promised_ || !AsymFenceReady()) return;
  promised_ = true;
  Word(mine()->heavy_asks).store(1, std::memory_order_release);
}

}  // namespace vsocket::guest
