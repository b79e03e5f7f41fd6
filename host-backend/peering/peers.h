// Peering: this vsocketd's links to the other hosts' vsocketds.
//
// Per peer host, one TLS 1.3 control channel with mutual certificate
// authentication (pairing requests, link setup and teardown) and
// links_per_peer data links (the fabric) keyed by the TLS session: each
// link's first frame carries a 32-byte key both ends export from their TLS
// session, so only the authenticated peer can attach it, and the link's
// index and the count. The host is up once all its links are; the loss of
// any one (or of the TLS channel) takes the whole session down, and every
// connection on it RESYNCs to kernel TCP. Of two hosts, the one whose name sorts
// first connects; the other accepts. Lost links are re-established with
// exponential backoff. Runs on the worker thread, non-blocking throughout;
// the worker sleeps on this object's epoll fd. Connections accepted on
// peer_listen are handshaken on a thread of their own (Handshaker) and
// handed to the worker once they said what they are.
//
// fabric = rdma: each data link is an RdmaLink (an RC QP) instead of a TCP
// connection. Its setup (QPN, GID, PSN, staging ring
// address and rkey) travels only on the authenticated TLS channel, as
// RDMA_SETUP: the initiator sends its own, the acceptor connects its QP to
// it and answers with its own and LINK_READY, then the initiator connects.
// A session's QPs share one completion queue (and so one channel fd).
// Each peer host has its own protection domain: its QPs, and each paired
// connection's guest RX ring registered as a memory region in it
// (RegisterRemoteWritable), its rkey given only to that host; another
// peer's QP cannot write there even with the rkey. See docs/rdma-fabric.md.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "host-backend/config.h"
#include "host-backend/conn/conn_manager.h"
#include "host-backend/directory/counters.h"
#include "host-backend/directory/etcd_client.h"
#include "host-backend/directory/etcd_locator.h"
#include "host-backend/directory/etcd_publisher.h"
#include "host-backend/fabric/link.h"
#include "host-backend/fabric/locator.h"
#include "host-backend/peering/handshaker.h"
#include "host-backend/peering/tls_channel.h"

namespace vsocket::fabric {
class RdmaCompletionQueue;
class RdmaDevice;
class RdmaLink;
}  // namespace vsocket::fabric

namespace vsocket::backend {

struct PeerSnapshot {
  std::string name;
  std::string address;
  std::string fabric;  // tcp | rdma
  std::string state;
  bool initiator;
  uint64_t connects, losses, refused;
  std::string last_error;
  uint64_t frames_out, frames_in, data_bytes_out, data_bytes_in, write_calls, read_calls, busy;
  uint64_t copied_bytes;                  // DATA payload the links copied (bounce ring, stream backlog)
  uint64_t inplace_bytes;                 // DATA payload read where it was (rdma: registered TX rings)
  std::vector<uint64_t> link_frames_out;  // per live link (empty while down)
};

struct PeeringCounters {
  std::atomic<uint64_t> refused_tls{0};   // handshake failed: no/wrong certificate, not TLS
  std::atomic<uint64_t> refused_name{0};  // authenticated, but not a configured peer
  std::atomic<uint64_t> refused_link{0};  // data link with an unknown key
  std::atomic<uint64_t> refused_revoked{0};  // link cut: a new tls_crl no longer accepts the peer
  std::atomic<uint64_t> refused_busy{0};     // beyond the half-open limits (per address, in all)
  directory::DirectoryCounters directory;    // locator = etcd[s]://... (all 0 otherwise)
};

// A link's counters as plain totals (summed over the links a peer had).
struct LinkTotals {
  uint64_t frames_out = 0, frames_in = 0, bytes_out = 0, bytes_in = 0, writes = 0, reads = 0, busy = 0;
  uint64_t copied = 0, inplace = 0;
  void Add(const fabric::LinkStats& s);
};

class Peering : public RemoteHosts {
 public:
  explicit Peering(ConnManager* conns) : conns_(conns) {}
  ~Peering() override;

  // Loads certificates and the locator, opens the listener. No peers
  // configured and no etcd directory: does nothing (and the daemon links to
  // nobody). With the directory, the peer hosts are also those it lists
  // (decision 96): linked to when they appear, not dialled again once their
  // records are gone.
  Status Start(const DaemonConfig& config);
  bool enabled() const { return enabled_; }
  // The worker sleeps on this (readable when anything here needs a Poll).
  int wake_fd() const { return epoll_.get(); }

  // Worker thread: takes accepted connections from the handshaker, steps
  // the connections it makes itself, reads control messages and link
  // frames, sends owed frames and flushes links. True if anything happened.
  bool Poll();

  // RemoteHosts.
  uint32_t Locate(uint32_t tenant, const proto::Endpoint& addr) override;
  bool BulkSlowerThanKernel() const override { return fabric_ != "rdma"; }
  bool Runs(uint32_t host, uint32_t tenant, const proto::Endpoint& addr) override;
  bool DirectoryCannotPlace(uint32_t tenant, const proto::Endpoint& addr) override;
  bool DirectoryMayLag() const override { return etcd_locator_ != nullptr; }
  std::vector<uint32_t> HostsUp() const override;
  bool SendPairing(uint32_t host, const proto::FrameHeader& h, std::span<const uint8_t> payload) override;
  fabric::Link* LinkTo(uint32_t host, uint64_t conn) override;
  RegisterFn Registering(uint32_t host, void* addr, size_t len, bool remote_write) override;
  Status Adopt(uint32_t host, Registration* r, uint32_t* rkey) override;
  Registration TakeRemoteWritable(uint32_t host, void* addr) override;
  uint64_t WithdrawSendable(uint32_t host, void* addr) override;
  Registration ReleaseSendable(uint64_t token) override;

  // Any thread (control socket).
  std::vector<PeerSnapshot> Snapshot() const;
  // vsocketctl locator: its entries (file format); `lines` (file format)
  // set entries, replacing those of the same tenant and prefix (a guest
  // that moved); the file read again. The caller then has the connection
  // manager look again (ConnManager::VmOp::kRelocate). Not enabled: an error.
  Result<std::string> LocatorText() const;
  Status SetLocations(const std::string& lines, size_t* replaced);
  Status ReloadLocator();
  // locator = etcd://...: the cluster directory's locator (null with a
  // static file), and vsocketctl locator's report of it: which etcd, its
  // health, this host's publishing and the cached entries.
  const directory::EtcdLocator* etcd_locator() const { return etcd_locator_.get(); }
  std::string DirectoryReport(bool json) const;
  // A VM arrived here / left this host (vsocketctl migrate end / detach):
  // with the etcd directory, its record is written under this host's name
  // or withdrawn at once (nothing with a static file). Any thread.
  // DirectoryVmHere waits (up to follow_ms) until this host's own watch
  // shows the record.
  void DirectoryVmHere(const vhost::PortConfig& vm, int follow_ms = 1000);
  void DirectoryVmAway(const std::string& vm);
  // A QEMU live migration's ends (decision 116): the VM's first device
  // started here (here) or its last one stopped at the switchover. Its
  // record is written or withdrawn by the publisher's thread, at once;
  // this never waits for etcd (the vhost-user and worker threads call it).
  void DirectoryVmPresence(const vhost::PortConfig& vm, bool here);
  // The tenants this host's VMs (here or away) have, after vsocketctl vm
  // add/remove (decision 105): the directory follows those (decision 103).
  // Any thread; nothing with a static file.
  void DirectoryTenants(std::set<uint32_t> tenants);
  // Revokes this host's lease (its records leave the directory) and stops
  // following the directory. Daemon::Stop; also at destruction.
  void StopDirectory();
  const PeeringCounters& counters() const { return counters_; }
  const std::string& host_name() const { return host_name_; }

 private:
  // Frames read per link and pass (DATA frames carry up to 64 KiB: a pass
  // reads at most a few MiB per link, then pairing and guests get a turn).
  static constexpr int kMaxFramesPerPoll = 64;
  // Time a setup step (connect, handshake, links) may take.
  static constexpr int kSetupTimeoutMs = 5000;
  // How often tls_crl is looked at for a change.
  static constexpr int kCrlCheckMs = 5000;
  // kRetired: a host found in the directory whose records are gone (its
  // lease expired, it stopped, it no longer offers our fabric): neither
  // dialled nor accepted until it is listed again.
  enum class State {
    kIdle,
    kBackoff,
    kConnecting,
    kHandshake,
    kLinkConnecting,
    kWaitLink,
    kWaitReady,
    kUp,
    kRetired
  };
  // One data link of a host pair (a TCP connection or an RC QP).
  struct Lane {
    std::unique_ptr<fabric::Link> link;
    fabric::RdmaLink* rdma = nullptr;  // rdma fabric: `link`, typed; null otherwise
    bool rdma_connected = false;       // its QP is connected to the peer's
    bool link_more = false;            // the last Poll() hit its frame limit
    UniqueFd connecting;               // tcp, initiator: its TCP connect in progress
  };
  struct Host {
    uint32_t id;
    std::string name;
    std::string address;
    sockaddr_storage addr;
    socklen_t addr_len;
    bool initiator;
    // Found in the directory (decision 96), not a [peer] section; and
    // whether it is listed now (a [peer] always is). An unlisted host keeps
    // a session that is up until it fails, and is then retired.
    bool from_directory = false;
    bool listed = true;
    std::atomic<State> state{State::kIdle};  // (read by Snapshot)
    std::unique_ptr<peering::TlsChannel> tls;
    UniqueFd connecting;  // TCP connect of the TLS channel in progress
    // What Snapshot (another thread) reads of the host, besides atomics:
    // lanes (the vector and each Lane's link), last_error and old. The
    // worker changes them with mu held; it is their only writer, so it
    // reads lanes without mu (which the analysis cannot check: lanes is not
    // GUARDED_BY).
    Mutex mu;
    // The session's links: as many as the initiator asked for (its
    // links_per_peer); empty while down, and at the acceptor until the
    // first link (tcp) or RDMA_SETUP (rdma) names the count.
    std::vector<Lane> lanes;
    // rdma: the host's own protection domain (its QPs, the rings
    // registered for it: no other peer's QP can reach them), and the
    // completion queue the session's QPs share.
    std::shared_ptr<fabric::RdmaDevice> rdma;
    std::shared_ptr<fabric::RdmaCompletionQueue> rdma_cq;
    std::array<uint8_t, 32> link_key{};
    int64_t retry_at_ms = 0;
    int backoff_ms = 0;
    int64_t deadline_ms = 0;  // for the current setup step
    std::atomic<uint64_t> connects{0}, losses{0};
    std::string last_error GUARDED_BY(mu);
    // Totals of links that are gone (live links' stats are added on read).
    LinkTotals old GUARDED_BY(mu);
  };

  Host* ByName(const std::string& name);
  // A peer host, id = hosts_.size() + 1 (ids are never reused: a host that
  // leaves the directory is retired, and listed again if it comes back).
  Status AddHost(const std::string& name, const std::string& address, bool from_directory);
  // locator = etcd://...: the hosts the directory lists now, as peers
  // (decision 96); at Start and after each change of the directory.
  void FollowDirectoryHosts();
  void Unlist(Host& h, const std::string& why);
  // A directory host's fabric_address as its record says now (worker; not
  // while its session is up or being set up).
  void FollowAddress(Host& h);
  void Step(Host& h);
  void StartConnect(Host& h);
  UniqueFd ConnectTo(Host& h, std::string* error);
  void OnTlsUp(Host& h);
  void OnLinkConnected(Host& h, size_t lane);
  bool AllLanes(const Host& h, bool rdma_connected) const;
  void StartRdmaLink(Host& h);
  Status CreateRdmaLane(Host& h, size_t i);
  bool OnRdmaSetup(Host& h, const proto::FrameHeader& hdr, std::span<const uint8_t> payload);
  bool SendRdmaSetup(Host& h, size_t lane);
  // A count and index a peer gave for a lane (LINK_HELLO, RDMA_SETUP:
  // value = index, aux = count, 0 meaning 1); false if out of range or
  // inconsistent with the lanes already set up.
  bool LaneOf(Host& h, const proto::FrameHeader& hdr, size_t* lane, std::string* why);
  void HostUp(Host& h);
  void HostDown(Host& h, const std::string& why);
  // rdma: host's protection domain (null: another fabric, or no such host).
  fabric::RdmaDevice* DomainOf(uint32_t host) const;
  // Connections the handshaker is done with: a control channel whose peer
  // is checked here, or a data link joining its session.
  void TakeIncoming();
  void AcceptTls(std::unique_ptr<peering::TlsChannel> tls, const std::string& from);
  void AcceptLink(UniqueFd fd, const std::string& from);
  bool ServiceUp(Host& h);
  void Watch(int fd, bool out);
  void ArmTimer();
  // tls_crl changed: a new TLS context with it, and every peer whose
  // certificate it no longer accepts loses its link.
  void CheckCrl();
  struct FileId;
  static FileId CrlFileId(const std::string& path);
  static const char* ToString(State s);
  // The host the locator names for (tenant, addr) ("" if none).
  std::string HostOf(uint32_t tenant, const proto::Endpoint& addr) const;
  // locator = etcd://...: follows the directory, publishes this host.
  Status StartDirectory(const DaemonConfig& config);

  ConnManager* conns_;
  std::string host_name_;
  std::string fabric_ = "tcp";
  int links_per_peer_ = 1;
  std::shared_ptr<fabric::RdmaDevice> rdma_;  // fabric = rdma: the opened device (each Host has a domain of it)
  std::shared_ptr<peering::TlsContext> tls_ctx_;  // shared with handshaker_
  peering::TlsConfig tls_config_;
  struct FileId {
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = -1;
    int64_t mtime_ns = 0;
    bool operator==(const FileId&) const = default;
  };
  FileId crl_id_;  // tls_crl as last loaded (or tried)
  int64_t crl_check_at_ms_ = 0;
  mutable Mutex locator_mu_;  // the worker reads, vsocketctl writes
  std::unique_ptr<fabric::StaticLocator> locator_ GUARDED_BY(locator_mu_);
  std::string locator_path_;
  // locator = etcd://... (all null with a static file; fixed after Start).
  // The eventfd wakes the worker when the directory changed (the locator's
  // thread asked the connections to look again: VmOp::kRelocate); declared
  // before the locator, whose thread writes it, so that it outlives it.
  UniqueFd directory_wake_;
  std::shared_ptr<directory::EtcdClient> etcd_;
  std::unique_ptr<directory::EtcdLocator> etcd_locator_;
  std::unique_ptr<directory::EtcdPublisher> etcd_publisher_;
  // index = id - 1. The worker is the only writer (it adds hosts found in
  // the directory, with hosts_mu_ held) and reads it without the lock;
  // Snapshot (another thread) reads it with hosts_mu_.
  std::vector<std::unique_ptr<Host>> hosts_;
  mutable Mutex hosts_mu_;
  bool enabled_ = false;  // fixed after Start
  // Directory hosts not taken as peers, and why (logged when it changes).
  std::map<std::string, std::string> directory_skipped_;
  // The host records of the directory as last followed (worker only).
  std::map<std::string, directory::HostRecord> directory_hosts_;
  UniqueFd listener_;
  Handshaker handshaker_;  // accepts on listener_ (stopped before it closes)
  UniqueFd epoll_;
  UniqueFd timer_;
  std::vector<int> watched_;
  PeeringCounters counters_;
};

}  // namespace vsocket::backend
