// The vhost-user backend on DPDK's rte_vhost, for vSocket's own (non-net)
// device. One Unix socket per VM ("port"); any number of frontends per
// socket (one per guest process in process mode, or QEMU in VM mode).
//
// Threads: rte_vhost runs the protocol on its own thread and calls us there.
// The data path runs elsewhere (a DeviceListener). Device memory can change
// under the data path only through vhost-user messages, so every message
// that could remap memory or rings is bracketed: the data path detaches the
// device before rte_vhost handles it and reattaches it after (see
// docs/vhost.md, "Quiescing").
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "vhost/backend/backend_device.h"
#include "vhost/backend/proof_server.h"

namespace vsocket::vhost {

struct EalOptions {
  int memory_mb = 64;  // EAL heap (no huge pages); holds rte_vhost's vq state
  std::string log_level = "warning";
};
// Starts DPDK's EAL once per process: no huge pages, no PCI, no telemetry.
Status InitEal(const EalOptions& options);

// An address a VM may use (anti-spoofing): family 4 or 6, IPv4 in the first
// four bytes of addr.
struct VmAddress {
  uint8_t family = 4;
  std::array<uint8_t, 16> addr{};
  bool operator==(const VmAddress&) const = default;
};

struct PortConfig {
  std::string path;  // vhost-user socket
  std::string vm_name;
  uint32_t tenant_id = 0;  // from operator config, never from the guest
  uint16_t num_queues = 2;
  std::vector<VmAddress> addresses;  // the VM's own addresses
  uint32_t index = 0;                // position in the daemon's port list
  uint32_t max_devices = 256;        // vhost-user connections at once (one per guest process)
  // Group whose members may connect (the socket becomes 0660, that group);
  // empty: the socket keeps the mode and group it was created with.
  std::string group;
  // The VM is configured here but runs on another host (a migration
  // target): vsocketd opens its port only at `vsocketctl migrate end`.
  bool away = false;
  // A QEMU live migration's destination (decision 116): the port opens at
  // once (QEMU -incoming attaches at its start), but the VM is published in
  // the etcd directory only when its first device starts here (the guest
  // arrived). A VM that leaves by a live migration (its last device with the
  // dirty log on stopped: the switchover) is withdrawn and waits the same way.
  bool incoming = false;
  // Process mode: a registration must name a TCP socket its process proved
  // it holds (PATH.proof; socket_proof.h). Off for frontends that cannot
  // (QEMU VMs, raw-protocol tests).
  bool prove_sockets = true;
  // VM mode (decision 100): the proofs come from the VM's agent, not from
  // PATH.proof. vsocketd opens a second vhost-user socket, PATH.agent, for
  // the one function the agent keeps for itself; the device attached there
  // is the VM's socket-proof authority (VOUCH). Only with prove_sockets.
  bool proofs_by_agent = false;
  // Direct pairs (decision 97): which of this VM's same-host pairs vsocketd
  // hands a ring pair of their own and leaves. kSameTenant: a peer of the
  // same tenant; kSameVm: only a peer in this VM; kOff: none. Process mode
  // only (prove_sockets without proofs_by_agent): same-tenant by default
  // there (decision 102), off elsewhere (config Validate).
  enum class Direct : uint8_t { kOff, kSameTenant, kSameVm };
  Direct direct = Direct::kSameTenant;
  bool direct_set = false;  // `direct` given in the configuration (not the default)
};

// Whether the port's processes may get direct pairs at all: process mode
// (their libraries fetch the pair's memory on PATH.proof; a QEMU VM's
// processes cannot yet).
inline bool DirectCapable(const PortConfig& p) { return p.prove_sockets && !p.proofs_by_agent; }

// The port's agent socket (PortConfig::proofs_by_agent): the VM's agent's
// own function attaches here.
inline std::string AgentSocketPath(const std::string& port_path) { return port_path + ".agent"; }

// Implemented by the data path. All calls come from the vhost-user thread.
class DeviceListener {
 public:
  virtual ~DeviceListener() = default;
  // Starts serving a loaded device.
  virtual void Attach(std::shared_ptr<BackendDevice> device) = 0;
  // Stops serving it; must not return while the data path may still touch
  // its memory. Idempotent. Must never wait on rte_vhost locks.
  virtual void Detach(BackendDevice* device) = 0;
  // VHOST_F_LOG_ALL toggled: live migration began (true) or ended (false);
  // also false when a device stops with its log on (device->stopping()).
  virtual void MigrationChanged(BackendDevice* device, bool logging) = 0;
  // From the proof thread: the direct pair memory behind `token` for a
  // connection of `device` (decision 97), once; kNotFound if none.
  virtual Status FetchDirect(BackendDevice* device, uint64_t token, DirectGrant* out) {
    (void)device, (void)token, (void)out;
    return Status(Code::kNotFound, "no direct pairs here");
  }
};

struct BackendCounters {
  std::atomic<uint64_t> connections{0};
  std::atomic<uint64_t> devices_started{0};
  std::atomic<uint64_t> devices_rejected{0};  // failed validation on start
  std::atomic<uint64_t> devices_stopped{0};
  // Stopped by their frontend (GET_VRING_BASE, dirty log off) and kept:
  // the VM paused, or its driver reset the device (decision 123).
  std::atomic<uint64_t> devices_kept{0};
  std::atomic<uint64_t> devices_resumed{0};  // kept ones that started again where they stopped
  std::atomic<uint64_t> reconfigurations{0};  // messages handled while running
  std::atomic<uint64_t> connections_refused{0};  // beyond a VM's max_devices
  std::atomic<uint64_t> dirty_log_starts{0};     // LOG_ALL set on a device (live migration began)
  std::atomic<uint64_t> dirty_log_stops{0};      // LOG_ALL cleared (migration ended or was cancelled)
  DirtyLogCounters dirty_log;                    // what the devices marked while it was on
  ProofCounters proofs;                           // the ports' proof sockets
};

class VhostBackend {
 public:
  // rte_vhost's callbacks are plain functions: one backend per process.
  static VhostBackend& Instance();

  Status AddPort(const PortConfig& config, DeviceListener* listener) EXCLUDES(mu_);
  // The VM's network namespace, as the operator attests it (the
  // SO_NETNS_COOKIE of a socket made inside it: `vsocketctl attest VM` run
  // there): from then on a socket proof from another namespace is refused.
  void AttestNetns(const std::string& port_path, uint64_t cookie) EXCLUDES(mu_);
  uint64_t AttestedNetns(const std::string& port_path) EXCLUDES(mu_);
  Status RemovePort(const std::string& path) EXCLUDES(mu_);

  const BackendCounters& counters() const { return counters_; }
  // Devices currently connected (running or not), for reporting.
  std::vector<std::shared_ptr<BackendDevice>> Devices() EXCLUDES(mu_);
  // The running device of `port` (not its authority) whose request queue's
  // descriptor table is at `gpa` (a VOUCH's target, decision 100).
  std::shared_ptr<BackendDevice> DeviceWithRequestRing(const PortConfig* port, uint64_t gpa) EXCLUDES(mu_);

  // rte_vhost entry points (public for the C callback shims only).
  int OnNewConnection(int vid) EXCLUDES(mu_);
  void OnDestroyConnection(int vid) EXCLUDES(mu_);
  int OnNewDevice(int vid) EXCLUDES(mu_);
  void OnDestroyDevice(int vid) EXCLUDES(mu_);
  int OnFeaturesChanged(int vid, uint64_t features) EXCLUDES(mu_);
  int OnPreMessage(int vid, void* msg) EXCLUDES(mu_);
  int OnPostMessage(int vid, void* msg) EXCLUDES(mu_);

 private:
  struct Port {
    PortConfig config;
    DeviceListener* listener;
  };
  struct Conn {
    Port* port = nullptr;
    bool authority = false;  // on the port's agent socket (PATH.agent)
    std::shared_ptr<BackendDevice> device;  // while running
    bool paused = false;                    // detached around a message
    bool logging = false;
    // GET_VRING_BASE seen since the device started: the frontend stops it
    // (a VM pause, a driver reset, a migration's switchover), as opposed to
    // going away (its socket closed).
    bool stop_asked = false;
    // Stopped by its frontend with the dirty log off, its connections kept
    // as they were (decision 123): the VM paused, or its driver reset the
    // device. Its next start says which (the same rings where they stopped:
    // resumed), or the frontend's going away ends it.
    std::shared_ptr<BackendDevice> kept;
  };

  VhostBackend() = default;
  // rte_vhost_driver_register + our features and callbacks, not started.
  Status RegisterDriver(const std::string& path);
  std::shared_ptr<BackendDevice> DeviceWithRegionFile(const std::string& port_path, const FileId& f) EXCLUDES(mu_);
  ProofServer& Proofs();
  // The data path of the port at port_path (listeners live as long as the
  // backend: a port removed keeps its listener object).
  DeviceListener* ListenerOf(const std::string& port_path) EXCLUDES(mu_);
  // The way to a port's listener, never with mu_ held: Detach waits for the
  // worker's pass, and our lock held meanwhile would stall the control
  // socket (Devices) and the proof thread (DeviceWithRegionFile).
  DeviceListener& Listener(const Port& port) EXCLUDES(mu_) { return *port.listener; }
  // A kept device whose VM did not resume it: gone for good, its
  // connections end as its process's would at an exit.
  void EndKept(const std::shared_ptr<BackendDevice>& kept, Port* port, const char* why) EXCLUDES(mu_);

  // Taken before a device's own lock (DeviceWithRegionFile asks the devices
  // under it: BackendDevice::HasRegionFile), never after.
  Mutex mu_;
  std::vector<std::unique_ptr<Port>> ports_ GUARDED_BY(mu_);
  std::unordered_map<int, Conn> conns_ GUARDED_BY(mu_);
  std::atomic<uint64_t> next_device_id_{1};
  BackendCounters counters_;
  std::unordered_map<std::string, uint64_t> netns_ GUARDED_BY(mu_);  // attested, by port path
  std::once_flag proofs_once_;
  std::unique_ptr<ProofServer> proofs_;
};

}  // namespace vsocket::vhost
