// Minimal leveled logging to stderr. Preserves errno (callers log on error
// paths where errno is still needed). Each VS_LOG call site prints at most
// kLogBurst lines a second: a guest or peer that makes vsocketd warn in a
// loop cannot flood its log or stall its data path on stderr; the lines
// dropped are counted and said with the site's next printed line.
#pragma once

#include <atomic>
#include <cstdarg>
#include <cstdint>

namespace vsocket {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// Messages above this level are dropped. Set from config/env by binaries.
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "error|warn|info|debug"; returns false if unknown.
bool ParseLogLevel(const char* text, LogLevel* out);
void SetLogTag(const char* tag);  // e.g. "vsocketd"; copied

void Log(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

inline constexpr uint32_t kLogBurst = 20;  // lines per call site and second
struct LogSite {
  std::atomic<int64_t> window_start_ns{0};
  std::atomic<uint32_t> in_window{0};
  std::atomic<uint32_t> dropped{0};
};
// Whether this site may print now; if it may, *dropped is how many of its
// lines were dropped since it last printed (then reset).
bool LogAllowed(LogSite& site, uint32_t* dropped);

}  // namespace vsocket

#define VS_LOG(level, ...)                                                                            \
  do {                                                                                                \
    if (static_cast<int>(::vsocket::LogLevel::level) <= static_cast<int>(::vsocket::GetLogLevel())) { \
      static ::vsocket::LogSite vs_log_site_;                                                         \
      uint32_t vs_log_dropped_ = 0;                                                                   \
      if (::vsocket::LogAllowed(vs_log_site_, &vs_log_dropped_)) {                                    \
        if (vs_log_dropped_ != 0)                                                                     \
          ::vsocket::Log(::vsocket::LogLevel::level, "(%u more lines like the next were dropped)",   \
                         vs_log_dropped_);                                                            \
        ::vsocket::Log(::vsocket::LogLevel::level, __VA_ARGS__);                                      \
      }                                                                                               \
    }                                                                                                 \
  } while (0)
