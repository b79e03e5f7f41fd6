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

}  // namespace vsocket::backend
