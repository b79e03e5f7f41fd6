// vsocketd's configuration: one file (default /etc/vsocket/vsocketd.conf),
// every key overridable by a VSOCKET_* environment variable, then by
// command-line flags. See docs/operator-guide.md for the format.
#pragma once

#include <sys/socket.h>

#include <string>
#include <vector>

#include "base/status.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {

// Upper bound of links_per_peer (also what a peer may ask for).
inline constexpr int kMaxLinksPerPeer = 16;

// Another vsocketd this one links to (multi-host).
struct PeerHostConfig {
  std::string name;     // must equal the CN of its certificate
  std::string address;  // ADDR:PORT of its peer_listen
};

// A CPU list such as "1" or "0,2-3" as CPU numbers (sorted, no
// duplicates); false and *error on a malformed list or a CPU >= CPU_SETSIZE.
bool ParseCpuList(const std::string& text, std::vector<int>* cpus, std::string* error);

struct DaemonConfig;
// nap_us as it applies on this host (resolves -1, auto).
int EffectiveNapUs(const DaemonConfig& c, int online_cpus);

struct DaemonConfig {
  std::string ctl_socket = "/run/vsocket/vsocketd.sock";
  int poll_us = 50;       // the worker polls at least this long after work before sleeping
  int poll_max_us = 400;  // and up to this, when work usually comes back sooner (0: fixed poll_us)
  int eal_mem_mb = 64;
  // The CPUs every vsocketd thread runs on ("1", "2-3,6"; empty: wherever
  // it was started). A CPU of its own is the production placement: guests
  // then see a backend that does not share their CPUs and accelerate every
  // connection at once (decision 51) and poll first (decision 35).
  std::string cpus;
  // Between passes the worker sleeps this long instead of polling, the
  // guests' kicks off (decision 67): -1 (auto): 100 when it shares every
  // CPU with the guests (no `cpus`) on a host of fewer than 4 CPUs, else 0
  // (poll).
  int nap_us = -1;
  std::string log_level = "warn";
  std::string metrics_addr = "127.0.0.1";
  int metrics_port = 0;  // 0: no HTTP metrics listener (still on the ctl socket)
  std::vector<vhost::PortConfig> vms;
  // Where `vsocketctl vm add` keeps the VMs it adds, a file each, read
  // again at every start (vms_dir.h, decision 105); empty: CTL_SOCKET.vms.d.
  std::string vms_dir;
  // Multi-host (all empty: this host links to no other).
  std::string host_name;    // this host's name, the CN of tls_cert
  std::string peer_listen;  // ADDR:PORT other backends connect to
  std::string tls_cert, tls_key, tls_ca;
  std::string tls_crl;  // optional: revocation lists, re-read when the file changes
  // The locator: a static file (its path), or the cluster directory in
  // etcd, etcd[s]://HOST:PORT[,HOST:PORT...] (docs/multi-host.md).
  std::string locator;
  // locator = etcd://...: this host's etcd user (by default none: etcd
  // without auth) and the file holding its password (docs/multi-host.md,
  // "Permissions").
  std::string etcd_user;
  std::string etcd_password_file;
  // locator = etcds://...: https to etcd; etcd's certificate is checked
  // against etcd_ca (empty: the system's CAs), and etcd_cert/etcd_key are
  // this host's client certificate (without a CommonName when etcd's auth is
  // on: its gateway refuses one).
  std::string etcd_ca, etcd_cert, etcd_key;
  std::string fabric = "tcp";  // tcp | rdma
  // fabric = rdma: the RDMA device (empty: the first one) and the GID index
  // of its port 1 (-1: the IPv4-mapped RoCEv2 GID). A missing device is a
  // startup error, never a silent fall back to tcp.
  std::string rdma_device;
  int rdma_gid_index = -1;
  // Data links (TCP connections, or RC queue pairs) per peer host, all
  // shared by every connection of every tenant between the two hosts; each
  // connection sends on one of them. The host that connects (the name that
  // sorts first) decides the count for the pair.
  int links_per_peer = 1;
  std::vector<PeerHostConfig> peers;
  // Budgets for what guests can make vsocketd hold on their behalf: bytes a
  // closed connection had written but not yet delivered, copied out of its
  // ring (per VM, and for all VMs). A close beyond them resets that
  // connection (its peer sees ECONNRESET) instead of buffering.
  int orphan_mb_per_vm = 256;
  int orphan_mb_total = 1024;
  // Per VM: vhost-user connections at once (one per guest process), and
  // registered connections not yet closed.
  int max_devices_per_vm = 256;
  int max_conns_per_vm = 65536;
  // SIGTERM drains every VM first (docs/operator-guide.md, "Upgrading
  // vsocketd"): how long to wait for the connections to leave the rings
  // before exiting anyway (those left resync on kernel TCP, losing nothing).
  // 0: exit at once.
  int drain_timeout_ms = 10000;
};

// Parses the file's text. `name` is used in error messages ("FILE:LINE: ...").
Result<DaemonConfig> ParseConfig(const std::string& text, const std::string& name);
// Applies VSOCKET_* overrides from `env` (KEY=VALUE strings, e.g. environ):
// VSOCKET_CTL_SOCKET, VSOCKET_POLL_US, VSOCKET_EAL_MEM_MB, VSOCKET_LOG_LEVEL,
// VSOCKET_METRICS_ADDR, VSOCKET_METRICS_PORT, VSOCKET_HOST_NAME,
// VSOCKET_PEER_LISTEN, VSOCKET_TLS_{CERT,KEY,CA}, VSOCKET_LOCATOR,
// VSOCKET_FABRIC, VSOCKET_RDMA_DEVICE, VSOCKET_RDMA_GID_INDEX, VSOCKET_LINKS_PER_PEER,
// VSOCKET_ORPHAN_MB_PER_VM, VSOCKET_ORPHAN_MB_TOTAL, VSOCKET_MAX_DEVICES_PER_VM,
// VSOCKET_MAX_CONNS_PER_VM, VSOCKET_VMS_DIR, per peer
// VSOCKET_PEER_<NAME>_ADDRESS, and per VM VSOCKET_VM_<NAME>_{SOCKET,TENANT,ADDRESSES,GROUP} (NAME upper-cased, '-' -> '_').
Status ApplyEnv(char** env, DaemonConfig* config);
// Checks the whole configuration (at least one VM, unique names, sockets
// and tenants set, addresses parse). Call after all overrides.
Status Validate(DaemonConfig* config);
// Parses "ADDR[;ADDR...]" or "ADDR, ADDR" into VM addresses.
Status ParseAddresses(const std::string& text, std::vector<vhost::VmAddress>* out);
// locator = etcd://...: the cluster directory in etcd, and its endpoints
// (HOST:PORT each); anything else names a static locator file.
bool IsEtcdLocator(const std::string& locator);
bool EtcdLocatorUsesTls(const std::string& locator);  // etcds://
Result<std::vector<std::string>> EtcdEndpoints(const std::string& locator);
// Parses "IPV4:PORT" or "[IPV6]:PORT" into a sockaddr (for peer addresses).
Status ParseHostPort(const std::string& text, sockaddr_storage* out, unsigned* len);

}  // namespace vsocket::backend
