// netload: see netload_common.h.
//
//   netload server  ADDR PORT [--sink] [--conns N] [--max-seconds S]
//   netload rate    ADDR PORT [--conns N] [--size B] [--seconds T] [--warmup W] [--nodelay]
//                   [--linger S]
//   netload connect ADDR PORT [--count N] [--max-seconds S]
//   netload hold    ADDR PORT [--conns N] [--msg-bytes L] [--seed S] [--phase-timeout T]
//                   [--io-timeout T]
//
// Results are one JSON line on stdout; exit status 0 only if every
// connection did what it was asked.
#include <cstdio>
#include <string>

#include "bench/netload_common.h"

int main(int argc, char** argv) {
  using namespace vsocket::bench;
  if (argc < 4) {
    std::fprintf(stderr, "usage: netload server|rate|connect|hold ADDR PORT [--option value]...\n");
    return 2;
  }
  const std::string mode = argv[1];
  const sockaddr_in addr = ParseAddr(argv[2], argv[3]);
  const Options o(argc, argv, 4);
  if (mode == "server") return RunServer(addr, o);
  if (mode == "rate") return RunRate(addr, o);
  if (mode == "connect") return RunConnect(addr, o);
  if (mode == "hold") return RunHold(addr, o);
  std::fprintf(stderr, "netload: unknown mode '%s'\n", mode.c_str());
  return 2;
}
