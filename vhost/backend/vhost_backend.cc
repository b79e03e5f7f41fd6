#include "vhost/backend/vhost_backend.h"

#include "vhost/user/proof.h"

#include <grp.h>
#include <pthread.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_vhost.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "base/log.h"
#include "proto/virtio_ring.h"
#include "vhost/backend/sigbus_guard.h"
#include "vhost/user/protocol.h"

namespace vsocket::vhost {
namespace {

using user::Request;

// C shims: rte_vhost calls plain functions.
int NewConnection(int vid) { return VhostBackend::Instance().OnNewConnection(vid); }
void DestroyConnection(int vid) { VhostBackend::Instance().OnDestroyConnection(vid); }
int NewDevice(int vid) { return VhostBackend::Instance().OnNewDevice(vid); }
void DestroyDevice(int vid) { VhostBackend::Instance().OnDestroyDevice(vid); }
int FeaturesChanged(int vid, uint64_t f) { return VhostBackend::Instance().OnFeaturesChanged(vid, f); }
int VringStateChanged(int, uint16_t, int) {
  // Kick/call fd swaps and enable changes all arrive as messages, which the
  // pre/post hooks bracket; nothing to do here.
  return 0;
}
rte_vhost_msg_result PreMessage(int vid, void* msg) {
  return static_cast<rte_vhost_msg_result>(VhostBackend::Instance().OnPreMessage(vid, msg));
}
rte_vhost_msg_result PostMessage(int vid, void* msg) {
  return static_cast<rte_vhost_msg_result>(VhostBackend::Instance().OnPostMessage(vid, msg));
}

const rte_vhost_device_ops kDeviceOps = {
    .new_device = NewDevice,
    .destroy_device = DestroyDevice,
    .vring_state_changed = VringStateChanged,
    .features_changed = FeaturesChanged,
    .new_connection = NewConnection,
    .destroy_connection = DestroyConnection,
    .guest_notified = nullptr,
    .reserved = {nullptr},
};

const rte_vhost_user_extern_ops kExternOps = {
    .pre_msg_handle = PreMessage,
    .post_msg_handle = PostMessage,
};

// Messages that cannot change memory or rings: no need to detach for them.
bool IsReadOnly(uint32_t request) {
  switch (static_cast<Request>(request)) {
    case Request::kGetFeatures:
    case Request::kGetProtocolFeatures:
    case Request::kGetQueueNum:
    case Request::kGetStatus: return true;
    default: return false;
  }
}

// LOG_ALL and LOG_SHMFD: without them QEMU refuses to migrate the VM
// (decision 88). rte_vhost maps the log (SET_LOG_BASE); the data path marks
// its writes (GuestMemory::MarkWritten).
constexpr uint64_t kDeviceFeatures =
    proto::kFeatureVersion1 | proto::kFeatureVhostUserProtocol | proto::kFeatureEventIdx | proto::kFeatureLogAll;
constexpr uint64_t kProtocolFeatures = user::kProtoReplyAck | user::kProtoStatus | user::kProtoLogShmfd;

// The gid of group `name` (a port's `group` key), from the system's group
// database (NSS), looked up before the socket exists so that a typo stops the
// daemon instead of leaving a socket nobody can use.
Result<gid_t> LookUpGroup(const std::string& name) {
  std::vector<char> buf(16384);
  group grp;
  group* found = nullptr;
  int err = getgrnam_r(name.c_str(), &grp, buf.data(), buf.size(), &found);
  if (err != 0) return Status::FromErrno("looking up group " + name, err);
  if (found == nullptr) return Status(Code::kNotFound, "group '" + name + "' does not exist");
  return found->gr_gid;
}

// Opens the port socket to `gid`: rw for owner and group, nothing for others
// (connect(2) on a Unix socket needs write permission). Changing the group
// of a file one owns needs membership of that group (or CAP_CHOWN): the
// daemon's user must be in it (docs/operator-guide.md, "Non-root guests").
Status OpenToGroup(const std::string& path, const std::string& name, gid_t gid) {
  if (chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    int err = errno;
    Status st = Status::FromErrno("chgrp " + name + " " + path, err);
    if (err != EPERM) return st;
    return Status(Code::kPermissionDenied, st.message() + " (the user vsocketd runs as must be a member of group " +
                                               name + ", e.g. adduser vsocket " + name + ")");
  }
  if (chmod(path.c_str(), 0660) != 0) return Status::FromErrno("chmod 0660 " + path);
  return Status::Ok();
}

}  // namespace

Status InitEal(const EalOptions& options) {
  static bool done = false;
  if (done) return Status::Ok();
  // EAL pins the main thread to its lcore's CPU set. Give lcore 0 every CPU
  // we may run on, so neither our threads nor the vhost thread get pinned.
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  sched_getaffinity(0, sizeof(cpus), &cpus);
  std::string set;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &cpus)) continue;
    if (!set.empty()) set += ",";
    set += std::to_string(c);
  }
  std::string lcores = "--lcores=0@(" + set + ")";
  std::string mem = std::to_string(options.memory_mb);
  std::string log = "--log-level=" + options.log_level;
  std::string log_eal = "--log-level=lib.eal:" + options.log_level;
  std::string log_vhost = "--log-level=lib.vhost.*:" + options.log_level;
  const char* args[] = {"vsocketd",  "--no-huge",    "--no-pci",  "--no-shconf",   "--no-telemetry", "-m",
                        mem.c_str(), lcores.c_str(), log.c_str(), log_eal.c_str(), log_vhost.c_str()};
  std::vector<char*> argv;
  for (const char* a : args) argv.push_back(const_cast<char*>(a));
  int r = rte_eal_init(static_cast<int>(argv.size()), argv.data());
  if (r < 0) return Status(Code::kInternal, std::string("rte_eal_init failed: ") + strerror(rte_errno));
  sched_setaffinity(0, sizeof(cpus), &cpus);
  InstallSigbusGuard();  // (after EAL, whose memory setup has a SIGBUS handler of its own)
  done = true;
  return Status::Ok();
}

VhostBackend& VhostBackend::Instance() {
  static VhostBackend* backend = new VhostBackend();  // outlives rte_vhost's thread
  return *backend;
}

Status VhostBackend::AddPort(const PortConfig& config, DeviceListener* listener) {
  const char* path = config.path.c_str();
  gid_t gid = 0;
  if (!config.group.empty()) {
    Result<gid_t> g = LookUpGroup(config.group);
    if (!g.ok()) return Status(g.status().code(), "vm " + config.vm_name + ": " + g.status().message());
    gid = *g;
  }
  unlink(path);  // a stale socket from a previous run
  VS_RETURN_IF_ERROR(RegisterDriver(config.path));
  auto fail = [&](const char* what) {
    rte_vhost_driver_unregister(path);
    return Status(Code::kInternal, std::string(what) + " failed for " + config.path);
  };
  const std::string agent_path = AgentSocketPath(config.path);
  const bool by_agent = config.prove_sockets && config.proofs_by_agent;
  {
    // A port removed and added again (a VM that migrated away and back)
    // keeps its entry: devices of its first life may still name it.
    MutexLock lock(mu_);
    Port* same = nullptr;
    for (auto& p : ports_)
      if (p->config.path == config.path) same = p.get();
    if (same != nullptr) *same = Port{config, listener};
    else ports_.push_back(std::make_unique<Port>(Port{config, listener}));
  }
  // The proof socket listens before the port does: a guest that connected
  // may open it at once. (Its mode and group follow the port's below.)
  if (config.prove_sockets && !by_agent) {
    Status st = Proofs().Listen(config.path, config.max_devices);
    if (!st.ok()) {
      rte_vhost_driver_unregister(path);
      return Status(st.code(), "vm " + config.vm_name + ": " + st.message());
    }
  }
  if (rte_vhost_driver_start(path) != 0) {
    if (config.prove_sockets && !by_agent) Proofs().Close(config.path);
    return fail("driver_start");
  }
  if (by_agent) {
    // The agent's own function (decision 100): a socket of its own, so that
    // which device is the VM's authority is QEMU's wiring, never a guest's
    // claim.
    unlink(agent_path.c_str());
    Status st = RegisterDriver(agent_path);
    if (st.ok() && rte_vhost_driver_start(agent_path.c_str()) != 0) {
      rte_vhost_driver_unregister(agent_path.c_str());
      st = Status(Code::kInternal, "driver_start failed for " + agent_path);
    }
    if (!st.ok()) {
      rte_vhost_driver_unregister(path);
      return st;
    }
  }
  // driver_start has bound the socket (server mode binds synchronously); until
  // the chmod it has the mode the umask gave it, which is never wider than
  // 0660 under the unit's UMask=0077 (and owner-only for connect under 022).
  if (!config.group.empty()) {
    Status st = OpenToGroup(config.path, config.group, gid);
    if (st.ok() && config.prove_sockets && !by_agent)
      st = OpenToGroup(proof::SocketPath(config.path), config.group, gid);
    if (st.ok() && by_agent) st = OpenToGroup(agent_path, config.group, gid);
    if (!st.ok()) {
      if (config.prove_sockets && !by_agent) Proofs().Close(config.path);
      if (by_agent) rte_vhost_driver_unregister(agent_path.c_str());
      rte_vhost_driver_unregister(path);
      return Status(st.code(), "vm " + config.vm_name + ": " + st.message());
    }
  }
  VS_LOG(kInfo, "vhost-user port %s (vm %s, tenant %u%s%s%s) listening", path, config.vm_name.c_str(),
         config.tenant_id, config.group.empty() ? "" : ", group ", config.group.c_str(),
         by_agent ? ", sockets proved by the VM's agent on " : config.prove_sockets ? ", sockets proved on " : "",
         by_agent ? agent_path.c_str() : config.prove_sockets ? proof::SocketPath(config.path).c_str()
                                                              : "registrations not bound to sockets");
  return Status::Ok();
}

Status VhostBackend::RegisterDriver(const std::string& p) {
  const char* path = p.c_str();
  if (rte_vhost_driver_register(path, 0) != 0) return Status(Code::kInternal, "rte_vhost_driver_register " + p + " failed");
  auto fail = [&](const char* what) {
    rte_vhost_driver_unregister(path);
    return Status(Code::kInternal, std::string(what) + " failed for " + p);
  };
  // Setting features takes rte_vhost out of its built-in virtio-net mode.
  if (rte_vhost_driver_set_features(path, kDeviceFeatures) != 0) return fail("set_features");
  if (rte_vhost_driver_set_protocol_features(path, kProtocolFeatures) != 0) return fail("set_protocol_features");
  if (rte_vhost_driver_callback_register(path, &kDeviceOps) != 0) return fail("callback_register");
  return Status::Ok();
}

ProofServer& VhostBackend::Proofs() {
  std::call_once(proofs_once_, [this] {
    proofs_ = std::make_unique<ProofServer>(
        [this](const std::string& path, const FileId& f) { return DeviceWithRegionFile(path, f); },
        [this](const std::string& path) { return AttestedNetns(path); },
        [this](const std::string& path, BackendDevice* d, uint64_t token, DirectGrant* out) {
          DeviceListener* l = ListenerOf(path);
          return l != nullptr ? l->FetchDirect(d, token, out) : Status(Code::kNotFound, "no such port");
        },
        &counters_.proofs);
  });
  return *proofs_;
}

DeviceListener* VhostBackend::ListenerOf(const std::string& port_path) {
  MutexLock lock(mu_);
  for (const auto& p : ports_)
    if (p->config.path == port_path) return p->listener;
  return nullptr;
}

void VhostBackend::AttestNetns(const std::string& port_path, uint64_t cookie) {
  MutexLock lock(mu_);
  netns_[port_path] = cookie;
}

uint64_t VhostBackend::AttestedNetns(const std::string& port_path) {
  MutexLock lock(mu_);
  auto it = netns_.find(port_path);
  return it == netns_.end() ? 0 : it->second;
}

std::shared_ptr<BackendDevice> VhostBackend::DeviceWithRegionFile(const std::string& port_path, const FileId& f) {
  MutexLock lock(mu_);
  for (auto& [vid, conn] : conns_)
    if (conn.device && conn.port != nullptr && conn.port->config.path == port_path && conn.device->HasRegionFile(f))
      return conn.device;
  return nullptr;
}

Status VhostBackend::RemovePort(const std::string& path) {
  if (rte_vhost_driver_unregister(path.c_str()) != 0) return Status(Code::kNotFound, "no vhost-user port " + path);
  rte_vhost_driver_unregister(AgentSocketPath(path).c_str());  // (if it has one)
  if (proofs_) proofs_->Close(path);
  // Unregistering destroyed the port's devices but calls no
  // destroy_connection: forget its connections here (a port opened again
  // must not count them against max_devices).
  std::vector<std::pair<std::shared_ptr<BackendDevice>, Port*>> kept;
  {
    MutexLock lock(mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (it->second.port != nullptr && it->second.port->config.path == path) {
        if (it->second.kept) kept.emplace_back(std::move(it->second.kept), it->second.port);
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [device, port] : kept) EndKept(device, port, "its port was removed");
  return Status::Ok();
}

void VhostBackend::EndKept(const std::shared_ptr<BackendDevice>& kept, Port* port, const char* why) {
  kept->set_stopping();
  Listener(*port).Detach(kept.get());  // (not running: its connections end, nothing of its memory is read)
  VS_LOG(kInfo, "vm %s: device %lu (stopped, kept) ends: %s", port->config.vm_name.c_str(),
         static_cast<unsigned long>(kept->id()), why);
}

std::vector<std::shared_ptr<BackendDevice>> VhostBackend::Devices() {
  MutexLock lock(mu_);
  std::vector<std::shared_ptr<BackendDevice>> out;
  for (auto& [vid, conn] : conns_)
    if (conn.device) out.push_back(conn.device);
  return out;
}

std::shared_ptr<BackendDevice> VhostBackend::DeviceWithRequestRing(const PortConfig* port, uint64_t gpa) {
  MutexLock lock(mu_);
  for (auto& [vid, conn] : conns_) {
    const auto& d = conn.device;
    if (d && !conn.authority && !conn.paused && d->port() == port && !d->stopping() && !d->broken() &&
        d->request_ring_gpa() == gpa)
      return d;
  }
  return nullptr;
}

int VhostBackend::OnNewConnection(int vid) {
  char ifname[256] = {};
  rte_vhost_get_ifname(vid, ifname, sizeof(ifname));
  MutexLock lock(mu_);
  Port* port = nullptr;
  bool authority = false;
  for (auto& p : ports_) {
    if (p->config.path == ifname) port = p.get();
    if (p->config.proofs_by_agent && AgentSocketPath(p->config.path) == ifname) port = p.get(), authority = true;
  }
  if (port == nullptr) return -1;
  size_t open = 0, authorities = 0;
  for (const auto& [v, c] : conns_) open += c.port == port, authorities += c.port == port && c.authority;
  if (authority && authorities > 0) {
    counters_.connections_refused.fetch_add(1);
    VS_LOG(kWarn, "vm %s: a second frontend on the agent socket refused: one function is the VM's authority",
           port->config.vm_name.c_str());
    return -1;
  }
  if (open >= port->config.max_devices) {
    counters_.connections_refused.fetch_add(1);
    VS_LOG(kWarn, "vm %s: frontend refused: %zu devices open, max_devices_per_vm is %u", port->config.vm_name.c_str(),
           open, port->config.max_devices);
    return -1;
  }
  conns_[vid] = Conn{port, authority, nullptr, false, false};
  counters_.connections.fetch_add(1);
  rte_vhost_extern_callback_register(vid, &kExternOps, nullptr);
  VS_LOG(kInfo, "vm %s: frontend connected (vid %d%s)", port->config.vm_name.c_str(), vid,
         authority ? ", the agent's: the VM's socket-proof authority" : "");
  return 0;
}

void VhostBackend::OnDestroyConnection(int vid) {
  std::shared_ptr<BackendDevice> kept;
  Port* port = nullptr;
  {
    MutexLock lock(mu_);
    auto it = conns_.find(vid);
    if (it == conns_.end()) return;
    kept = std::move(it->second.kept);
    port = it->second.port;
    conns_.erase(it);
  }
  // A VM that stopped its device and then went: migrated while paused
  // (`virsh migrate` without --live: no dirty log, QEMU does not start it
  // on a stopped device) or killed. Its processes went with it: its
  // connections leave with the VM (their peers finish on kernel TCP
  // through RESYNC, decision 110), never as a process exit, whose EOF would
  // cut the streams of a VM that goes on running elsewhere.
  if (kept) {
    kept->set_left_with_vm();
    EndKept(kept, port, "its frontend went away: the VM left with its processes (migrated while paused, or gone)");
  }
}

int VhostBackend::OnNewDevice(int vid) {
  Port* port;
  bool authority;
  std::shared_ptr<BackendDevice> kept;
  {
    MutexLock lock(mu_);
    auto it = conns_.find(vid);
    if (it == conns_.end()) return -1;
    port = it->second.port;
    authority = it->second.authority;
    kept = std::move(it->second.kept);
    it->second.stop_asked = false;
  }
  std::shared_ptr<BackendDevice> device;
  if (kept) {
    // Stopped by its frontend and kept (decision 123): started again with
    // its rings where they were and as far as they went, it was paused
    // (QMP stop, cont) and goes on as it was; anything else (a driver reset
    // starts its rings afresh) ends it as its process's exit would.
    std::vector<BackendDevice::QueueState> before = kept->QueueStates();
    Status st = kept->Load();
    if (st.ok() && kept->QueueStates() == before) {
      device = std::move(kept);
      counters_.devices_resumed.fetch_add(1);
      VS_LOG(kInfo, "vm %s: device %lu resumed where it stopped (vid %d): the VM was paused; its connections go on",
             port->config.vm_name.c_str(), static_cast<unsigned long>(device->id()), vid);
    } else {
      EndKept(kept, port,
              st.ok() ? "started again with other rings or indices (its driver reset it)"
                      : "its new start could not be loaded");
    }
  }
  if (!device) {
    device = std::make_shared<BackendDevice>(vid, next_device_id_.fetch_add(1), &port->config, &counters_.dirty_log,
                                             authority);
    Status st = device->Load();
    if (!st.ok()) {
      counters_.devices_rejected.fetch_add(1);
      VS_LOG(kWarn, "vm %s: rejecting device (vid %d): %s", port->config.vm_name.c_str(), vid, st.ToString().c_str());
      return -1;
    }
    counters_.devices_started.fetch_add(1);
    VS_LOG(kInfo, "vm %s: device %lu started (vid %d, event_idx %d)", port->config.vm_name.c_str(),
           static_cast<unsigned long>(device->id()), vid, device->event_idx());
  }
  {
    MutexLock lock(mu_);
    conns_[vid].device = device;
    conns_[vid].paused = false;
  }
  Listener(*port).Attach(device);
  // Started with its dirty log on: a live migration is under way and this
  // vsocketd joined it late (restarted under a reconnecting QEMU in the
  // pre-copy). rte_vhost reports no feature change for features set before
  // the start, so this is the migration's start as far as this vsocketd
  // knows: the VM drains for it as decision 093 says (decision 111).
  bool late = false;
  if (device->logging()) {
    MutexLock lock(mu_);
    auto it = conns_.find(vid);
    late = it != conns_.end() && !it->second.logging;
    if (late) it->second.logging = true;
  }
  if (late) {
    counters_.dirty_log_starts.fetch_add(1);
    VS_LOG(kInfo, "vm %s: vid %d: dirty log on at the device's start (VHOST_F_LOG_ALL: a live migration under way)",
           port->config.vm_name.c_str(), vid);
    Listener(*port).MigrationChanged(device.get(), true);
  }
  return 0;
}

void VhostBackend::OnDestroyDevice(int vid) {
  std::shared_ptr<BackendDevice> device;
  Port* port = nullptr;
  bool logging = false;
  bool keep = false;
  {
    MutexLock lock(mu_);
    auto it = conns_.find(vid);
    if (it == conns_.end()) return;
    device = std::move(it->second.device);
    it->second.paused = false;
    port = it->second.port;
    // Stopped by its frontend (GET_VRING_BASE) with the dirty log off: a
    // VM pause or a driver reset, not yet told apart (decision 123). Its
    // connections are kept as they are, untouched, until its next start
    // or its frontend's going away says which. (With the log on it is a
    // live migration's switchover: decision 106 below.)
    keep = device && it->second.stop_asked && !it->second.logging && !device->logging() && !device->broken();
    it->second.stop_asked = false;
    if (keep) it->second.kept = device;  // (its next start comes on this same thread)
  }
  if (!device) return;
  if (keep) {
    // Detached around the GET_VRING_BASE already (OnPreMessage): the data
    // path no longer touches its memory, its connections keep their state.
    device->SyncBase();
    counters_.devices_stopped.fetch_add(1);
    counters_.devices_kept.fetch_add(1);
    VS_LOG(kInfo, "vm %s: device %lu stopped by its frontend: kept with its connections (a VM pause, or a reset: "
                  "its next start says which)",
           port->config.vm_name.c_str(), static_cast<unsigned long>(device->id()));
    return;
  }
  device->set_stopping();
  Listener(*port).Detach(device.get());
  {
    MutexLock lock(mu_);
    auto it = conns_.find(vid);
    logging = it != conns_.end() && it->second.logging;
    if (logging) it->second.logging = false;  // (the next device's follows its own features)
  }
  // Stopped with its log on: the switchover of a live migration (or its
  // QEMU went): the listener lifts what the log's start began (decision 093).
  if (logging) Listener(*port).MigrationChanged(device.get(), false);
  // GET_VRING_BASE replies with the library's last_avail_idx: make it ours.
  device->SyncBase();
  counters_.devices_stopped.fetch_add(1);
  VS_LOG(kInfo, "vm %s: device %lu stopped", port->config.vm_name.c_str(), static_cast<unsigned long>(device->id()));
}

int VhostBackend::OnFeaturesChanged(int vid, uint64_t features) {
  std::shared_ptr<BackendDevice> device;
  Port* port = nullptr;
  bool changed = false;
  bool logging = (features & proto::kFeatureLogAll) != 0;
  {
    MutexLock lock(mu_);
    auto it = conns_.find(vid);
    if (it == conns_.end()) return 0;
    device = it->second.device;
    port = it->second.port;
    changed = it->second.logging != logging;
    it->second.logging = logging;
  }
  if (!changed) return 0;
  (logging ? counters_.dirty_log_starts : counters_.dirty_log_stops).fetch_add(1);
  VS_LOG(kInfo, "vm %s: vid %d: dirty log %s (VHOST_F_LOG_ALL%s); all devices so far: %lu ranges, %lu bytes marked",
         port->config.vm_name.c_str(), vid, logging ? "on" : "off",
         logging ? " set: live migration began" : " cleared: live migration ended",
         static_cast<unsigned long>(counters_.dirty_log.writes.load()),
         static_cast<unsigned long>(counters_.dirty_log.bytes.load()));
  if (device) Listener(*port).MigrationChanged(device.get(), logging);
  return 0;
}

int VhostBackend::OnPreMessage(int vid, void* msg) {
  uint32_t request;
  std::memcpy(&request, msg, sizeof(request));  // VhostUserMsg starts with it
  if (IsReadOnly(request)) return RTE_VHOST_MSG_RESULT_NOT_HANDLED;
  std::shared_ptr<BackendDevice> device;
  Port* port = nullptr;
  {
    MutexLock lock(mu_);
    auto it = conns_.find(vid);
    if (it != conns_.end() && static_cast<Request>(request) == Request::kGetVringBase) it->second.stop_asked = true;
    if (it == conns_.end() || !it->second.device || it->second.paused) return RTE_VHOST_MSG_RESULT_NOT_HANDLED;
    it->second.paused = true;
    device = it->second.device;
    port = it->second.port;
  }
  counters_.reconfigurations.fetch_add(1);
  Listener(*port).Detach(device.get());
  device->SyncBase();
  return RTE_VHOST_MSG_RESULT_NOT_HANDLED;
}

int VhostBackend::OnPostMessage(int vid, void*) {
  std::shared_ptr<BackendDevice> device;
  Port* port = nullptr;
  {
    MutexLock lock(mu_);
    auto it = conns_.find(vid);
    if (it == conns_.end() || !it->second.paused || !it->second.device) return RTE_VHOST_MSG_RESULT_NOT_HANDLED;
    it->second.paused = false;
    device = it->second.device;
    port = it->second.port;
  }
  // The message may have moved rings or memory: reload and revalidate.
  Status st = device->Load();
  if (!st.ok()) {
    device->MarkBroken("reconfiguration rejected: " + st.ToString());
    return RTE_VHOST_MSG_RESULT_NOT_HANDLED;
  }
  Listener(*port).Attach(device);
  return RTE_VHOST_MSG_RESULT_NOT_HANDLED;
}

}  // namespace vsocket::vhost
