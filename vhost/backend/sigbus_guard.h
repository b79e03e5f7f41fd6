// A guest's memory is a file the guest owns. An access beyond that file's
// end (a guest that shrank it, or declared a region larger than the file)
// raises SIGBUS in whichever vsocketd thread touches it, rte_vhost's own
// message thread included (it reads the rings while it applies a memory
// table, before any check of ours runs). Unhandled, that kills vsocketd and
// every tenant's connections with it.
//
// BackendDevice::Load() refuses files that are not size-sealed or are
// shorter than their regions, so a running device cannot fault. This guard
// covers the window before that check: a fault beyond a file's end
// (BUS_ADRERR) gets a private zero page mapped over it, the access is
// retried and reads zeros, and the address is recorded; Load() then refuses
// any device whose mappings absorbed a fault. Any other SIGBUS keeps its
// default action.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vsocket::vhost {

// Installs the handler, once per process (later calls do nothing).
void InstallSigbusGuard();
// Faults absorbed so far.
uint64_t AbsorbedSigbusFaults();
// Whether an absorbed fault lies in [base, base + len).
bool SigbusFaultWithin(const void* base, size_t len);

}  // namespace vsocket::vhost
