#include "guest/core/conn_state.h"

namespace vsocket::guest {

using proto::Reason;

const char* ToString(Mode m) {
  switch (m) {
    case Mode::kUnprobed: return "unprobed";
    case Mode::kKernel: return "kernel";
    case Mode::kPending: return "kernel-pending";
    case Mode::kAccel: return "accelerated";
  }
  return "?";
}

void SetKernelForGood(Conn& c, Reason r) {
  c.reason.store(r);
  c.mode.store(Mode::kKernel, std::memory_order_release);
}

void Reset(Conn& c, Reason r) {
  c.reason.store(r);
  c.reset.store(true, std::memory_order_release);
}

bool IsRegistered(const Conn& c) {
  Mode m = c.mode.load(std::memory_order_acquire);
  return m == Mode::kPending || m == Mode::kAccel;
}

}  // namespace vsocket::guest
