// Serves the proof sockets of the vhost-user ports (vhost/user/proof.h) on
// a thread of its own ("vsocketd-proof"): binds each channel to the device
// whose memory the process passes, inspects every socket it passes, and
// records the 4-tuple for that device (socket_proof.h). The data-path
// worker only looks the tuple up at REGISTER_CONN.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "vhost/backend/socket_proof.h"

namespace vsocket::vhost {

class BackendDevice;

// A direct pair's memory handed to one of its processes (decision 97).
struct DirectGrant {
  UniqueFd memory;  // the pair's sealed memfd
  UniqueFd wake;    // the peer process's wake eventfd (its event queue's call fd)
  uint32_t side = 0;
};

struct ProofCounters {
  std::atomic<uint64_t> channels{0};        // proof channels accepted
  std::atomic<uint64_t> channels_refused{0};  // beyond a port's bound
  std::atomic<uint64_t> binds_refused{0};   // memory of no device of that port
  std::atomic<uint64_t> proved{0};          // sockets proved
  std::atomic<uint64_t> refused{0};         // not a connected TCP socket, or before a bind
  std::atomic<uint64_t> wrong_netns{0};     // a socket of another network namespace than the VM's attested one
  std::atomic<uint64_t> direct_fetched{0};  // direct pair memories handed over (decision 97)
  std::atomic<uint64_t> direct_refused{0};  // fetches with no such token for that device
};

class ProofServer {
 public:
  // The running device of the port at `port_path` whose memory region is
  // the file `f`, if any.
  using FindDevice = std::function<std::shared_ptr<BackendDevice>(const std::string& port_path, const FileId& f)>;
  // The network namespace the operator attested for the port's VM
  // (SO_NETNS_COOKIE; 0: none attested).
  using AttestedNetns = std::function<uint64_t(const std::string& port_path)>;
  // The grant behind a DIRECT token for a connection of `device` (the
  // port's data path keeps them); kNotFound if there is none.
  using FetchDirect =
      std::function<Status(const std::string& port_path, BackendDevice* device, uint64_t token, DirectGrant* out)>;
  ProofServer(FindDevice find, AttestedNetns netns, FetchDirect fetch, ProofCounters* counters)
      : find_(std::move(find)), netns_(std::move(netns)), fetch_(std::move(fetch)), counters_(*counters) {}
  ~ProofServer();

  // Opens PATH.proof next to the port socket at port_path, with its mode and
  // group; at most max_channels channels at once (one per guest process).
  Status Listen(const std::string& port_path, size_t max_channels) EXCLUDES(mu_);
  // Closes it and its channels.
  void Close(const std::string& port_path) EXCLUDES(mu_);

 private:
  struct Listener {
    std::string port_path;
    UniqueFd fd;
    size_t max_channels = 0;
  };
  struct Channel {
    std::string port_path;
    UniqueFd fd;
    std::weak_ptr<BackendDevice> device;
    bool bound = false;
  };
  void Start();
  void Run() EXCLUDES(mu_);
  void Accept(const Listener& l);
  // False: the channel is done (closed, or broke the protocol).
  bool Serve(Channel& c);
  // A kDirectFetch: answered with its fds (false: the channel broke).
  bool ServeDirectFetch(Channel& c, uint64_t token);

  FindDevice find_;
  AttestedNetns netns_;
  FetchDirect fetch_;
  ProofCounters& counters_;
  UniqueFd wake_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  Mutex mu_;  // Listen/Close against the thread
  std::vector<std::shared_ptr<Listener>> listeners_ GUARDED_BY(mu_);
  std::vector<std::string> closing_ GUARDED_BY(mu_);  // ports whose channels go
  std::vector<std::shared_ptr<Listener>> polled_;  // the thread's: what its poll set names
  std::vector<Channel> channels_;    // the thread's own
};

}  // namespace vsocket::vhost
