// Makes libvsocket.so choose its transport at run time (transport_choice.h,
// decision 108): vsocket-guestd's inside a VM, vsocketd's vhost-user port
// in process mode. Linked into the library only (unit tests install their
// own factory or none).
#include "guest/agent/transport_choice.h"

namespace vsocket::agent {
namespace {

// (Only stores a function pointer: safe before anything else is set up.)
__attribute__((constructor)) void InstallTransportChoice() { guest::SetTransportFactory(&OpenChosenTransport); }

}  // namespace
}  // namespace vsocket::agent
