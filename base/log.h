// Minimal leveled logging to stderr. Preserves errno (callers log on error
// paths where errno is still needed).
#pragma once

#include <cstdarg>

namespace vsocket {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// Messages above this level are dropped. Set from config/env by binaries.
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "error|warn|info|debug"; returns false if unknown.
bool ParseLogLevel(const char* text, LogLevel* out);
void SetLogTag(const char* tag);  // e.g. "vsocketd"; copied

void Log(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace vsocket

#define VS_LOG(level, ...)                                                                          \
  do {                                                                                              \
    if (static_cast<int>(::vsocket::LogLevel::level) <= static_cast<int>(::vsocket::GetLogLevel())) \
      ::vsocket::Log(::vsocket::LogLevel::level, __VA_ARGS__);                                      \
  } while (0)
