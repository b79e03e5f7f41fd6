// One side of a direct pair's memory (proto/direct.h, decision 97): maps
// the pair's memfd, gives the connection its TX and RX rings there,
// publishes this side's counts and reads the other's, which it trusts no
// more than anything else it reads from shared memory: every count is read
// once and checked against what this side knows, and a count that cannot
// be (a produced count that goes back or overfills the ring, a consumed
// count beyond what we wrote) breaks this connection alone (kDataLoss:
// the caller resets it), never a read outside the mapping. The peer could
// truncate the file under us (SIGBUS at the next touch) only if it were
// not sealed: Map refuses a memfd without its seals.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "base/asym_fence.h"
#include "base/status.h"
#include "proto/direct.h"

namespace vsocket::guest {

class DirectRing {
 public:
  // Maps memfd as side `side` (0 or 1) and checks its header and seals.
  // Does not take the fd (the caller closes it; the mapping stays).
  static Result<std::unique_ptr<DirectRing>> Map(int memfd, int side);
  ~DirectRing();
  DirectRing(const DirectRing&) = delete;
  DirectRing& operator=(const DirectRing&) = delete;

  int side() const { return side_; }
  uint32_t ring_bytes() const { return ring_bytes_; }
  uint8_t* tx() const { return tx_; }  // ours: we write it
  uint8_t* rx() const { return rx_; }  // the peer's: we read it

  // What the peer published: Load() once, then Check() it. The bounds the
  // caller passes are read in this order, so that threads that take the
  // counts concurrently never see a true count as impossible: `rx_tail`
  // (its produced count taken last) and `credit` (its consumed count taken
  // last) before Load; `rx_head` (bytes we consumed of its ring) and
  // `tx_tail` (bytes we wrote into ours) after it (the peer wrote only what
  // our published consumed count, never above rx_head, let it; it consumed
  // only what our produced count, never above tx_tail, showed).
  struct Peer {
    uint64_t produced = 0;
    uint64_t consumed = 0;
    uint64_t ring_end = proto::kDirectOpen;
    bool shut_wr = false;
    bool fence_set = false;
    uint64_t fence = 0;  // (only with fence_set; checked by the caller, as a FENCE message is)
  };
  Peer Load() const;
  Status Check(const Peer& p, uint64_t rx_tail, uint64_t credit, uint64_t rx_head, uint64_t tx_tail) const;
  // Load and Check with counts no other thread changes meanwhile.
  Result<Peer> ReadPeer(uint64_t rx_head, uint64_t rx_tail, uint64_t tx_tail, uint64_t credit) const {
    Peer p = Load();
    Status st = Check(p, rx_tail, credit, rx_head, tx_tail);
    if (!st.ok()) return st;
    return p;
  }

  // Publishes our counts. True if the peer asked to be woken for it (then
  // the caller wakes it: one write to its wake eventfd); the ask is taken.
  bool PublishProduced(uint64_t produced);
  bool PublishConsumed(uint64_t consumed);
  // Our EOF after `produced` (stored after the last byte's count).
  bool PublishShutWr();
  // Our FENCE (also posted to vsocketd): the peer learns it here even when
  // our kernel FIN overtakes the backend's event. False if the peer closed
  // our fence word first (CloseFence: it left the pair, decision 134): we
  // must not switch. *wake: the peer asked to be woken for it.
  bool PublishFence(uint64_t fence, bool* wake);
  // Leaving the pair (a loss, a withdrawal): the peer's FENCE is final from
  // here. Closes the peer's fence word if it was not set, so the peer never
  // switches onto the pair after we decided; true (with *fence) if it was.
  bool CloseFence(uint64_t* fence);
  bool PublishRingEnd(uint64_t end);
  // Right after mapping: says we did (decision 135). False if the peer left
  // the pair first and decided we never would (it resends its ring stream
  // from 0 on the kernel socket, with no header): then we must not use it.
  bool Attach();
  // Leaving the pair after a loss: true if the peer never mapped it and now
  // never will (we closed its word, or had), so our ring stream goes on the
  // kernel socket from byte 0 with no header; false if it did.
  bool ClosePeerAttach();
  // Whether the peer mapped the pair (our ring bytes are where it reads).
  bool PeerAttached() const;
  // Before sleeping until the peer produces (or consumes): asks it to wake
  // us. Then, once for all the rings it asked on, the caller fences with
  // FenceAsks() and reads the peer once more, and sleeps only if nothing
  // changed.
  void WantProduced();
  void WantConsumed();
  // After the asks of every ring a sleeper waits on ([first, last), each
  // element's ring given by ring_of, which may be null): a full fence,
  // and one heavy fence (membarrier) if any of their peers publishes
  // lightly now for what we asked.
  template <typename It, typename RingOf>
  static void FenceAsks(It first, It last, RingOf ring_of) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    bool heavy = false;
    for (; first != last; ++first)
      if (DirectRing* r = ring_of(*first)) heavy |= r->AskedOfLightPeer();
    if (heavy) HeavyFence();
  }
  // Asymmetric fences (decision 114, base/asym_fence.h): if this process
  // can, promises the peer that we heed its light_* words (FenceAsks). A
  // side whose peer promised, and which promised itself (its CPUs then get
  // the heavy fence), publishes without a full fence after kLightAfter
  // publishes in a row that found no ask, until it takes two asks within
  // kLightAfter publishes: a streaming writer with a polling reader saves a
  // fence per send, and a sleeper pays a membarrier only while its peer is
  // in that mode, at most once per kLightAfter of its publishes. Before our
  // first ask.
  void PromiseHeavyAsks();
  static constexpr uint32_t kLightAfter = 64;
  // Whether this side ever published lightly (for the report).
  bool went_light() const { return went_light_.load(std::memory_order_relaxed); }

 private:
  DirectRing() = default;
  proto::DirectSide* mine() const { return sides_[side_]; }
  proto::DirectSide* peer() const { return sides_[1 - side_]; }
  // A publish's look at the peer's ask: kind 0 for produced (the TX
  // lock's), 1 for consumed (the RX lock's), -1 for a rare publish (a
  // fence, an EOF, a ring end), which always fences fully.
  bool TakeAsk(uint32_t proto::DirectSide::*want, int kind);
  static constexpr uint8_t kAskedProduced = 1, kAskedConsumed = 2;
  // After the fence that follows our asks: whether this ring heeds its
  // peer (we promised) and the peer is light for what we asked; forgets
  // the asks.
  bool AskedOfLightPeer();

  // Our promise (PromiseHeavyAsks), and the peer's as Load last saw it.
  bool promised_ = false;
  mutable std::atomic<bool> peer_promised_{false};
  // Per kind (0 produced, 1 consumed; each under its caller's lock): light
  // now, and publishes since the last ask taken.
  bool light_[2] = {false, false};
  uint32_t streak_[2] = {0, 0};
  std::atomic<bool> went_light_{false};
  // What Want* asked since the last FenceAsks (the sleeper's, under its
  // session lock: one sleeper arms at a time).
  uint8_t asked_ = 0;
  int side_ = 0;
  uint32_t ring_bytes_ = 0;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  proto::DirectSide* sides_[2] = {nullptr, nullptr};
  uint8_t* tx_ = nullptr;
  uint8_t* rx_ = nullptr;
};

}  // namespace vsocket::guest
