// Building fabric frame headers.
#pragma once

#include <cstdint>

#include "proto/fabric.h"

namespace vsocket::backend {

proto::FrameHeader Frame(proto::FrameType t, uint32_t tenant, uint64_t handle, uint64_t value = 0,
                         uint32_t aux = 0);

}  // namespace vsocket::backend
