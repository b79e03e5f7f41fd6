// What of a connection's TX ring the fabric may still read, when sends read
// it in place (rdma, the ring registered for local reads): every DATA frame
// sent from the ring is marked with its link frame number and the stream
// position it ends at. Until the link released a frame (its work requests
// completed; an RC retransmission reads the memory again), its bytes must
// stay as they are, so the guest's credit is held below the first frame
// not released, and a closed connection's rings stay held.
//
// Registrations withdrawn from use (a device pause remaps guest memory, the
// guest closed) are kept with the frame number the link had reached: they
// may be dropped once every frame before that number was released.
//
// All of one connection's frames go on one link (Peering::LinkTo), for as
// long as its peer host stays up; Forget() when that link is destroyed.
// Worker-thread state.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "host-backend/fabric/link.h"

namespace vsocket::backend {

class TxHold {
 public:
  // Marks kept per connection; beyond that, the newest one absorbs the next
  // (later frame, later end: the bytes are released a little later).
  static constexpr size_t kMaxMarks = 8;

  // A frame numbered `frame` on `link`, to peer host `host`, carried the TX
  // stream bytes [start, end).
  void Sent(fabric::Link* link, uint32_t host, uint64_t frame, uint64_t start, uint64_t end);
  // The registration with `token` was withdrawn. False: no frame can read
  // it (nothing in flight), drop it now; true: Reap() returns it later.
  bool Withdrawn(uint64_t token);
  // Pops released marks; appends tokens that may now be dropped.
  void Reap(std::vector<uint64_t>* droppable);
  // The link is being destroyed: nothing reads any more. Appends every
  // withdrawn token.
  void Forget(std::vector<uint64_t>* droppable);

  // The TX stream position below which no send reads the ring (`copied`:
  // the bytes handed to the link so far). Call Reap() first for news.
  uint64_t Released(uint64_t copied) const { return marks_.empty() ? copied : released_; }
  // Whether any frame or withdrawn registration still waits for the link.
  bool Busy() const { return !marks_.empty() || !withdrawn_.empty(); }
  bool HasWithdrawn() const { return !withdrawn_.empty(); }
  uint32_t host() const { return host_; }
  size_t marks() const { return marks_.size(); }

 private:
  void PopMarks();

  struct Mark {
    uint64_t frame;
    uint64_t end;
  };
  fabric::Link* link_ = nullptr;
  uint32_t host_ = 0;
  std::vector<Mark> marks_;                               // oldest first
  std::vector<std::pair<uint64_t, uint64_t>> withdrawn_;  // (frames before this number, token)
  uint64_t released_ = 0;                                 // end of the last released mark
};

}  // namespace vsocket::backend
