// What a request handler tells the code that posted the request's reply.
#pragma once

#include <cstdint>

namespace vsocket::backend {

// The result of handling one guest request (like DPDK vhost-user's
// RTE_VHOST_MSG_RESULT_*).
enum class RequestResult : uint8_t {
  kNoReply,  // fire-and-forget message: the chain is returned with nothing written
  kReply,    // the handler filled in the reply: it is written back
};

// The code that posted a request, for a request the guest must see taken
// before anything it causes is seen anywhere else (a FENCE, decision 124):
// TakeFirst returns the request's chain (nothing written) and publishes the
// used ring, before the handler acts. A guest whose backend dies then knows
// from its own used ring that a FENCE it sees untaken reached no peer.
class RequestTaker {
 public:
  // Takes the request (once).
  void Take() {
    if (taken_) return;
    taken_ = true;
    TakeFirst();
  }
  // The chain went back to the guest: nothing more is written into it.
  bool taken() const { return taken_; }

 protected:
  virtual void TakeFirst() = 0;
  ~RequestTaker() = default;

 private:
  bool taken_ = false;
};

}  // namespace vsocket::backend
