#include "base/log.h"

#include "base/clock.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace vsocket {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};
char g_tag[32] = "vsocket";

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kError: return "E";
    case LogLevel::kWarn: return "W";
    case LogLevel::kInfo: return "I";
    case LogLevel::kDebug: return "D";
  }
  return "?";
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }

bool ParseLogLevel(const char* text, LogLevel* out) {
  static constexpr struct {
    const char* name;
    LogLevel level;
  } kNames[] = {
      {"error", LogLevel::kError}, {"warn", LogLevel::kWarn}, {"info", LogLevel::kInfo}, {"debug", LogLevel::kDebug}};
  for (const auto& n : kNames) {
    if (std::strcmp(text, n.name) == 0) {
      *out = n.level;
      return true;
    }
  }
  return false;
}

void SetLogTag(const char* tag) { std::snprintf(g_tag, sizeof(g_tag), "%s", tag); }

bool LogAllowed(LogSite& site, uint32_t* dropped) {
  int64_t now = MonotonicNs();
  int64_t start = site.window_start_ns.load(std::memory_order_relaxed);
  if (now - start >= 1'000'000'000 && site.window_start_ns.compare_exchange_strong(start, now))
    site.in_window.store(0, std::memory_order_relaxed);
  if (site.in_window.fetch_add(1, std::memory_order_relaxed) >= kLogBurst) {
    site.dropped.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  *dropped = site.dropped.exchange(0, std::memory_order_relaxed);
  return true;
}

void Log(LogLevel level, const char* fmt, ...) {
  int saved_errno = errno;
  char line[1024];
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  int n = std::snprintf(line, sizeof(line), "%s %ld.%06ld %s: ", LevelName(level), static_cast<long>(ts.tv_sec),
                        ts.tv_nsec / 1000, g_tag);
  va_list ap;
  va_start(ap, fmt);
  if (n > 0 && static_cast<size_t>(n) < sizeof(line)) n += std::vsnprintf(line + n, sizeof(line) - n, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  if (static_cast<size_t>(n) >= sizeof(line) - 1) n = sizeof(line) - 2;
  line[n++] = '\n';
  // One write() so concurrent lines do not interleave.
  (void)!::fwrite(line, 1, n, stderr);
  errno = saved_errno;
}

}  // namespace vsocket
