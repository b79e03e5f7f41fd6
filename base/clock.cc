#include "base/clock.h"

#include <sched.h>

namespace vsocket {

void SpinStep(uint32_t iteration) {
  if (iteration < 32) {
    __builtin_ia32_pause();
  } else {
    sched_yield();
  }
}

}  // namespace vsocket
