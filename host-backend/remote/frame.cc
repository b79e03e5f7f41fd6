// Building fabric frame headers.
#include "host-backend/remote/frame.h"

namespace vsocket::backend {

using proto::FrameHeader;
using proto::FrameType;

FrameHeader Frame(FrameType t, uint32_t tenant, uint64_t handle, uint64_t value, uint32_t aux) {
  FrameHeader h;
  h.type = t;
  h.tenant = tenant;
  h.handle = handle;
  h.value = value;
  h.aux = aux;
  return h;
}

}  // namespace vsocket::backend
