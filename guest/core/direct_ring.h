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

  // What the peer published, checked. `rx_head`: bytes we consumed of its
  // ring; `rx_tail`: its produced count we took last; `tx_tail`: bytes we
  // wrote into ours; `credit`: its consumed count we took last.
  struct Peer {
    uint64_t produced = 0;
    uint64_t consumed = 0;
    uint64_t ring_end = proto::kDirectOpen;
    bool shut_wr = false;
  };
  Result<Peer> ReadPeer(uint64_t rx_head, uint64_t rx_tail, uint64_t tx_tail, uint64_t credit) const;

  // Publishes our counts. True if the peer asked to be woken for it (then
  // the caller wakes it: one write to its wake eventfd); the ask is taken.
  bool PublishProduced(uint64_t produced);
  bool PublishConsumed(uint64_t consumed);
  // Our EOF after `produced` (stored after the last byte's count).
  bool PublishShutWr();
  bool PublishRingEnd(uint64_t end);
  // Before sleeping until the peer produces (or consumes): asks it to wake
  // us; the caller reads the peer once more after this and sleeps only if
  // nothing changed.
  void WantProduced();
  void WantConsumed();

 private:
  DirectRing() = default;
  proto::DirectSide* mine() const { return sides_[side_]; }
  proto::DirectSide* peer() const { return sides_[1 - side_]; }
  bool TakeAsk(uint32_t proto::DirectSide::*want);

  int side_ = 0;
  uint32_t ring_bytes_ = 0;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  proto::DirectSide* sides_[2] = {nullptr, nullptr};
  uint8_t* tx_ = nullptr;
  uint8_t* rx_ = nullptr;
};

}  // namespace vsocket::guest
