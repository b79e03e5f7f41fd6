// The directory's numbers for vsocketd's metrics (host-backend/metrics):
// written by the locator, the publisher and pairing's lookups, read by the
// registry. Every field is a std::atomic<uint64_t> (the registry's test
// fills them as an array).
#pragma once

#include <atomic>
#include <cstdint>

namespace vsocket::directory {

struct DirectoryCounters {
  // Gauges.
  std::atomic<uint64_t> enabled{0};    // 1: locator = etcd[s]://...
  std::atomic<uint64_t> connected{0};  // 1: the watch is live
  std::atomic<uint64_t> revision{0};   // the last revision applied to the cache
  std::atomic<uint64_t> hosts{0};      // host records in the cache
  std::atomic<uint64_t> entries{0};    // (tenant, address) entries pairing may use
  std::atomic<uint64_t> conflicts{0};  // claims dropped: two hosts claim the address (claims.h)
  std::atomic<uint64_t> published{0};  // 1: this host's records are in etcd under a live lease
  // Counters.
  std::atomic<uint64_t> watch_events{0};        // changes applied from the watch
  std::atomic<uint64_t> connects{0};            // watches set up (the first, then each reconnect)
  std::atomic<uint64_t> full_reads{0};          // reads of the whole prefix
  std::atomic<uint64_t> bad_records{0};         // keys or values ignored as malformed
  std::atomic<uint64_t> publishes{0};           // this host's records written (a new lease each)
  std::atomic<uint64_t> keepalive_failures{0};  // lease renewals that failed (etcd away, lease gone)
  // Lookups the cache answered with a host: where a connection's peer runs
  // (the host to ask to pair), and whether a pairing request's source runs
  // on the host that sent it.
  std::atomic<uint64_t> placements{0};
  // New pairings across hosts given up because the address was not in the
  // cache while etcd was unreachable: kernel TCP, "directory-unavailable".
  std::atomic<uint64_t> unavailable_fallbacks{0};
};

}  // namespace vsocket::directory
