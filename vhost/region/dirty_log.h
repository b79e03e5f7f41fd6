// The frontend's dirty log during live migration (VHOST_F_LOG_ALL): every
// byte the backend writes into guest memory while it is on must be marked,
// after the write, or the destination gets a stale copy of that page.
//
// The check is one relaxed load (one predictable branch when off, which is
// always outside a migration); the marking itself goes to a sink (in
// vsocketd: rte_vhost_log_write, which sets the bits in QEMU's shared log
// with atomic ORs, so any thread may call it).
#pragma once

#include <atomic>
#include <cstdint>

namespace vsocket::vhost {

struct DirtyLogCounters {
  std::atomic<uint64_t> writes{0};  // ranges marked
  std::atomic<uint64_t> bytes{0};   // bytes in them
};

class DirtyLog {
 public:
  // sink(context, gpa, len) marks [gpa, gpa+len) written.
  using Sink = void (*)(int context, uint64_t gpa, uint64_t len);

  DirtyLog() = default;
  DirtyLog(Sink sink, int context, DirtyLogCounters* counters) : sink_(sink), context_(context), counters_(counters) {}
  DirtyLog(const DirtyLog&) = delete;
  DirtyLog& operator=(const DirtyLog&) = delete;

  // A log that is never on: where guest memory has no frontend to migrate it.
  static const DirtyLog& Never();

  // Turned on and off by the protocol thread while the data path is
  // detached (SET_FEATURES is bracketed), so relaxed suffices; a sink
  // tolerates a late mark after the frontend dropped its log.
  void Set(bool on) { on_.store(on && sink_ != nullptr, std::memory_order_relaxed); }
  bool on() const { return on_.load(std::memory_order_relaxed); }

  void Mark(uint64_t gpa, uint64_t len) const {
    if (len == 0) return;
    sink_(context_, gpa, len);
    if (counters_ != nullptr) {
      counters_->writes.fetch_add(1, std::memory_order_relaxed);
      counters_->bytes.fetch_add(len, std::memory_order_relaxed);
    }
  }

 private:
  std::atomic<bool> on_{false};
  Sink sink_ = nullptr;
  int context_ = 0;
  DirtyLogCounters* counters_ = nullptr;
};

}  // namespace vsocket::vhost
