// netload: load generator for the cross-host benchmark and the connection
// scale run (bench/cross_host_bench.py, bench/conn_scale.py). Plain POSIX
// sockets and epoll, so the same binary runs over kernel TCP and with
// libvsocket.so preloaded. Every wait has a deadline: a stalled peer makes
// the tool fail, never hang.
#pragma once

#include <netinet/in.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "base/unique_fd.h"

namespace vsocket::bench {

// `--key value` pairs after the mode, address and port.
class Options {
 public:
  // Exits with a usage error on a stray argument.
  Options(int argc, char** argv, int first);
  int64_t Int(const std::string& key, int64_t fallback) const;
  double Real(const std::string& key, double fallback) const;
  bool Flag(const std::string& key) const { return values_.count(key) > 0; }

 private:
  std::map<std::string, std::string> values_;
};

sockaddr_in ParseAddr(const char* ip, const char* port);  // exits on a bad address

int64_t NowNs();
inline int64_t SecondsToNs(double s) { return static_cast<int64_t>(s * 1e9); }
double CpuSeconds();  // this process, user + system

void SetNonBlocking(int fd);
void SetNoDelay(int fd);

// A connected, nonblocking TCP socket (with TCP_NODELAY if `nodelay`), or an
// invalid fd once the deadline passed or the connect failed.
UniqueFd ConnectBefore(const sockaddr_in& addr, int64_t deadline_ns, bool nodelay = true);

// Whole-buffer I/O on a nonblocking socket, waiting in poll() until the
// deadline. False on an error, EOF or timeout.
bool WriteFull(int fd, const uint8_t* p, size_t n, int64_t deadline_ns);
bool ReadFull(int fd, uint8_t* p, size_t n, int64_t deadline_ns);

// Deterministic message content and its check: the scale run's per-connection
// message is PatternByte(seed, i) with an FNV-1a trailer.
uint8_t PatternByte(uint64_t seed, uint64_t i);
uint64_t Fnv1a(const uint8_t* p, size_t n);

// Prints one line to stdout and flushes it: the driving script reads the
// tool's progress as it happens.
void Say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Waits (bounded) for one line on stdin; false on EOF or timeout. The scale
// run steps the clients through their phases this way.
bool WaitForLine(double timeout_s);

int RunServer(const sockaddr_in& addr, const Options& o);
int RunRate(const sockaddr_in& addr, const Options& o);
int RunConnect(const sockaddr_in& addr, const Options& o);
int RunHold(const sockaddr_in& addr, const Options& o);

}  // namespace vsocket::bench
