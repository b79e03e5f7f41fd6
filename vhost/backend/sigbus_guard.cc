#include "vhost/backend/sigbus_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

namespace vsocket::vhost {
namespace {

// The first kMaxRecorded faulting pages (the count goes on beyond them; a
// device is refused on the count alone once the table is full).
constexpr uint32_t kMaxRecorded = 256;
std::atomic<uintptr_t> g_pages[kMaxRecorded];
std::atomic<uint64_t> g_count{0};
uintptr_t g_page_size = 4096;
constexpr uintptr_t kHugePage = 2u << 20;

// Async-signal-safe: mmap and atomics only.
void OnSigbus(int sig, siginfo_t* info, void* ctx) {
  if (info->si_code == BUS_ADRERR) {
    auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
    // A normal page first; inside a hugetlbfs mapping only a whole huge page
    // can be replaced.
    for (uintptr_t size : {g_page_size, kHugePage}) {
      uintptr_t page = addr & ~(size - 1);
      void* p = mmap(reinterpret_cast<void*>(page), size, PROT_READ | PROT_WRITE,
                     MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) continue;
      uint64_t n = g_count.fetch_add(1, std::memory_order_acq_rel);
      // (Pages are aligned: bit 0 says "huge".)
      if (n < kMaxRecorded) g_pages[n].store(page | (size == kHugePage ? 1 : 0), std::memory_order_release);
      return;  // the access is retried on the zero page
    }
  }
  // Not a fault we can absorb: die as without the guard.
  signal(sig, SIG_DFL);
  (void)ctx;
}

}  // namespace

void InstallSigbusGuard() {
  static std::once_flag once;
  std::call_once(once, [] {
    long ps = sysconf(_SC_PAGESIZE);
    if (ps > 0) g_page_size = static_cast<uintptr_t>(ps);
    struct sigaction sa{};
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, nullptr);
  });
}

uint64_t AbsorbedSigbusFaults() { return g_count.load(std::memory_order_acquire); }

bool SigbusFaultWithin(const void* base, size_t len) {
  uint64_t n = g_count.load(std::memory_order_acquire);
  if (n > kMaxRecorded) return true;  // not all recorded: assume the worst
  auto lo = reinterpret_cast<uintptr_t>(base);
  for (uint64_t i = 0; i < n; ++i) {
    uintptr_t v = g_pages[i].load(std::memory_order_acquire);
    if (v == 0) return true;  // claimed, not yet written: its fault is still in its handler
    uintptr_t page = v & ~uintptr_t{1}, size = (v & 1) ? kHugePage : g_page_size;
    if (page + size > lo && page < lo + len) return true;
  }
  return false;
}

}  // namespace vsocket::vhost
