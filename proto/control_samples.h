// One valid instance of every control message type: used by tests, the fuzz
// seed generator and documentation examples.
#pragma once

#include <vector>

#include "proto/control.h"

namespace vsocket::proto {

const std::vector<Message>& SampleMessages();

}  // namespace vsocket::proto
