// Connections accepted on peer_listen, until they say what they are: a TLS
// control channel (its handshake runs here) or a data link (its LINK_HELLO
// has arrived whole). Then they are handed to the worker (Take), which
// decides who the peer is and what the connection is for.
//
// Its own thread (issue 17, finding 6): anyone who can reach peer_listen
// can start handshakes, and each costs public-key operations; on the worker
// they stalled every guest's data path. The thread blocks in epoll_wait
// (never spins); a connection that has not finished within the setup
// timeout is dropped. Half-open connections are bounded per source address
// and in all, so one flooding address cannot crowd out the real peers.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "host-backend/peering/tls_channel.h"

namespace vsocket::backend {

struct PeeringCounters;

// Watches fd on epoll_fd for input, and for output too if `out` (adds it,
// or changes what it is watched for). Shared with Peering.
void WatchFd(int epoll_fd, int fd, bool out);

class Handshaker {
 public:
  struct Limits {
    size_t max_pending = 256;  // half-open connections in all
    size_t per_source = 8;     // half-open connections from one address
    int timeout_ms = 5000;     // to finish the handshake or the hello
  };
  // One connection that said what it is.
  struct Ready {
    std::unique_ptr<peering::TlsChannel> tls;  // a control channel, handshake done; or
    UniqueFd link;                             // a data link: its LINK_HELLO waits unread
    std::string from;                          // address:port
    uint64_t generation = 0;                   // of the TLS context it used
  };

  Handshaker() = default;
  ~Handshaker();
  Handshaker(const Handshaker&) = delete;
  Handshaker& operator=(const Handshaker&) = delete;

  // Accepts on `listen_fd` (not owned; non-blocking) from now on.
  Status Start(int listen_fd, std::shared_ptr<peering::TlsContext> ctx, PeeringCounters* counters,
               size_t link_hello_bytes, Limits limits);
  void Stop();

  // Readable (an eventfd) when Take() has something.
  int ready_fd() const { return ready_.get(); }
  std::vector<Ready> Take() EXCLUDES(mu_);

  // A new TLS context (tls_crl changed): handshakes under way are dropped
  // (they were verified against the old lists), and finished ones not yet
  // taken carry an older generation than generation(): the worker drops
  // them too.
  void SetContext(std::shared_ptr<peering::TlsContext> ctx) EXCLUDES(mu_);
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }

 private:
  struct Pending {
    UniqueFd fd;
    std::unique_ptr<peering::TlsChannel> tls;
    std::string from, source;
    int64_t deadline_ms;
    uint64_t generation;
  };
  enum class Outcome { kWaiting, kRefused, kReady };
  void Run();
  void AcceptAll();
  // Moves p on; kReady: a finished TLS channel, or a link whose hello is
  // whole (HandOver gives it to the worker).
  Outcome Step(Pending& p);
  Outcome Refuse(Pending& p, std::atomic<uint64_t>& counter, const std::string& why);
  void HandOver(Pending& p);
  void Forget(Pending& p);

  int listen_fd_ = -1;
  PeeringCounters* counters_ = nullptr;
  size_t hello_bytes_ = 0;
  Limits limits_;
  UniqueFd epoll_, ready_, wake_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> generation_{0};

  // Thread only.
  std::shared_ptr<peering::TlsContext> ctx_;
  uint64_t ctx_generation_ = 0;
  std::vector<Pending> pending_;
  std::map<std::string, size_t> per_source_;

  Mutex mu_;
  std::vector<Ready> ready_list_ GUARDED_BY(mu_);
  std::shared_ptr<peering::TlsContext> next_ctx_ GUARDED_BY(mu_);
};

}  // namespace vsocket::backend
