// vsocketctl vm add / vm remove: VMs added and removed at runtime
// (decision 105; docs/operator-guide.md "Adding and removing VMs").
//
//   vm add NAME --KEY VALUE...  checked as the configuration file's VM
//       would be, kept in the VMs directory (vms_dir.h), put in the VM
//       table (the worker swaps it in: pairing finds its addresses), its
//       tenant followed and its record published in the etcd directory
//       (seen by this host's watch) before its port opens (decision 90's
//       order: peers place it here before its connections ask them).
//   vm remove NAME  for a VM vm add added. vsocketctl drains it first (its
//       accelerated connections leave the rings with clean fences, as
//       `drain` does) and waits; here: what is still on the rings is reset
//       (kRemove, as a migration's detach), its port closes (its sessions
//       end: its libraries go on on kernel TCP), its record is withdrawn,
//       its tenant no longer followed if it was the last, its file deleted.
// Every other VM's devices, connections and pairs are left alone: nothing
// here touches a connection not of the VM added or removed.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#include "base/log.h"
#include "base/unique_fd.h"
#include "base/unix_addr.h"
#include "host-backend/daemon.h"
#include "host-backend/vms_dir.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {
namespace {

constexpr int kFollowMs = 1000;           // a VM of a tenant followed already: its record seen by our watch
constexpr int kFollowNewTenantMs = 3000;  // a tenant new here: the watch ends and the directory is read again

// PATH as a vhost-user socket path for a new port: its directory exists,
// and PATH is nothing yet, or a stale socket nobody listens on (AddPort
// removes that). Never a file of another kind (AddPort would unlink it).
Status SocketPathFree(const std::string& path) {
  std::string dir = path.substr(0, path.rfind('/'));
  struct stat st;
  if (!dir.empty() && (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)))
    return Status(Code::kInvalidArgument, "socket " + path + ": directory " + dir + " does not exist");
  if (path.size() + 16 >= sizeof(sockaddr_un::sun_path))  // (+".agent", ".proof")
    return Status(Code::kInvalidArgument, "socket " + path + ": path too long for a Unix socket");
  auto addr = UnixAddress(path);
  if (lstat(path.c_str(), &st) != 0) return Status::Ok();
  if (!S_ISSOCK(st.st_mode)) return Status(Code::kAlreadyExists, "socket " + path + " exists and is not a socket");
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd && connect(fd.get(), AsSockaddr(*addr), sizeof(*addr)) == 0)
    return Status(Code::kAlreadyExists, "socket " + path + " is in use (something listens on it)");
  return Status::Ok();
}

std::string Quoted(const std::string& s) { return "\"" + s + "\""; }

}  // namespace

std::set<uint32_t> Daemon::TenantsOf(const VmTable::Vms& vms) {
  std::set<uint32_t> out;
  for (const vhost::PortConfig& p : vms) out.insert(p.tenant_id);
  return out;
}

std::string Daemon::VmCommand(const std::vector<std::string>& words, bool json) {
  if (words.size() >= 3 && words[1] == "add") return VmAdd(words, json);
  if (words.size() == 3 && words[1] == "remove") return VmRemove(words[2], json, false);
  if (words.size() == 3 && words[1] == "remove-begin") return VmRemove(words[2], json, true);
  return CtlError("usage: vm add NAME --socket PATH --tenant T [--addresses A[,B...]] [--KEY VALUE...] | vm remove NAME",
                  json);
}

std::string Daemon::VmAdd(const std::vector<std::string>& words, bool json) {
  auto error = [&](const std::string& msg) { return CtlError(msg, json); };
  Result<VmDropIn> in = ParseVmAdd({words.begin() + 2, words.end()});
  if (!in.ok()) return error(in.status().message());
  MutexLock ops(vm_ops_mu_);
  {
    MutexLock lock(ports_mu_);
    if (stopping_) return error("vsocketd is stopping");
  }
  const std::shared_ptr<const VmTable::Vms> now = vms_.Get();
  const std::string& name = in->vm.vm_name;
  for (const vhost::PortConfig& p : *now) {
    if (p.vm_name == name) return error("there is a VM named '" + name + "' already (vsocketctl vms lists them)");
    if (p.path == in->vm.path) return error("socket " + p.path + " is VM '" + p.vm_name + "''s");
  }
  if (Status st = CheckAddressesFree(*now, in->vm); !st.ok()) return error(st.message());
  if (Status st = SocketPathFree(in->vm.path); !st.ok()) return error(st.message());
  if (next_index_ >= kMaxVms)
    return error("this vsocketd has had " + std::to_string(kMaxVms) +
                 " VMs since it started: restart it to add more (its connections resync)");
  // The configuration as it would be with the VM, checked as at a start:
  // whatever a start would refuse, vm add refuses.
  DaemonConfig trial = config_;
  trial.vms = *now;
  trial.vms.push_back(in->vm);
  if (Status st = Validate(&trial); !st.ok()) return error(st.message());
  vhost::PortConfig vm = trial.vms.back();  // (as Validate settled it: max_devices, direct)
  vm.index = next_index_;

  const std::string dir = VmsDir(config_);
  if (Status st = WriteVmDropIn(dir, *in); !st.ok()) return error(st.message() + " (" + name + " not added)");
  auto next = std::make_shared<VmTable::Vms>(*now);
  next->push_back(vm);
  std::shared_ptr<const VmTable::Vms> added = std::move(next);
  vms_.Set(added);
  ++next_index_;
  auto undo = [&](const std::string& why) {
    peering_.DirectoryVmAway(name);
    vms_.Set(now);
    conns_.RequestLocalPorts(now);
    worker_.Wake();
    peering_.DirectoryTenants(TenantsOf(*now));
    (void)RemoveVmDropIn(dir, name);
    VS_LOG(kWarn, "operator: vm add %s failed: %s", name.c_str(), why.c_str());
    return error(name + " not added: " + why);
  };
  // The worker's pairing knows it before anything of it can register.
  uint64_t seq = conns_.RequestLocalPorts(added);
  worker_.Wake();
  for (int i = 0; i < 5000 && conns_.drains_applied() < seq; ++i) usleep(1000);
  if (conns_.drains_applied() < seq) return undo("vsocketd's worker did not answer in 5 s");
  // Published (and seen) before its port opens: the hosts its connections
  // pair with must already place it here (decision 90).
  const bool new_tenant = TenantsOf(*now).count(vm.tenant_id) == 0;
  if (new_tenant) peering_.DirectoryTenants(TenantsOf(*added));
  // (An incoming VM, a QEMU migration's destination: when its first device
  // starts, decision 116.)
  if (!vm.incoming) peering_.DirectoryVmHere(vm, new_tenant ? kFollowNewTenantMs : kFollowMs);
  {
    MutexLock lock(ports_mu_);
    Status st = stopping_ ? Status(Code::kUnavailable, "vsocketd is stopping")
                          : vhost::VhostBackend::Instance().AddPort(vm, &worker_);
    if (!st.ok()) return undo(st.message());
    port_open_.insert(vm.index);
  }
  std::string note;
  if (const directory::EtcdLocator* d = peering_.etcd_locator()) {
    directory::EtcdLocatorHealth h = d->Health();
    for (uint32_t t : h.refused_tenants)
      if (t == vm.tenant_id)
        note = "; etcd refuses tenant " + std::to_string(t) +
               " to this host (grant it to this host's etcd role, docs/multi-host.md): it pairs on this host only";
  }
  VS_LOG(kInfo, "operator: vm add %s (tenant %u, index %u, %s)%s", name.c_str(), vm.tenant_id, vm.index,
         vm.path.c_str(), note.c_str());
  const std::string file = dir + "/" + name + ".conf";
  if (json)
    return "{\"vm\":" + Quoted(name) + ",\"state\":\"added\",\"tenant\":" + std::to_string(vm.tenant_id) +
           ",\"socket\":" + Quoted(vm.path) + ",\"kept_in\":" + Quoted(file) +
           ",\"new_tenant\":" + (new_tenant ? "true" : "false") + "}\n";
  return name + ": added (tenant " + std::to_string(vm.tenant_id) + ", socket " + vm.path + "); kept in " + file +
         note + "\n";
}

std::string Daemon::VmRemove(const std::string& name, bool json, bool begin) {
  auto error = [&](const std::string& msg) { return CtlError(msg, json); };
  MutexLock ops(vm_ops_mu_);
  std::optional<vhost::PortConfig> port = PortNamed(name);
  if (!port) return error("no VM named '" + name + "' (vsocketctl vms lists them)");
  const std::string dir = VmsDir(config_);
  if (!HasVmDropIn(dir, name))
    return error(name + " is in vsocketd's configuration (its file, --port or the environment), not added by vm add: "
                        "take it out there and restart vsocketd (or move it: migrate begin)");
  const std::shared_ptr<const VmTable::Vms> now = vms_.Get();
  if (now->size() == 1) return error(name + " is this vsocketd's only VM: it serves one at least");
  if (begin) {
    // Checked, then drained: its connections leave the rings with clean
    // fences (vsocketctl waits for them, then asks `vm remove`).
    if (conns_.away(port->index)) return json ? "{\"vm\":" + Quoted(name) + ",\"state\":\"away\"}\n"
                                              : name + ": runs on another host\n";
    if (!Apply(port->index, ConnManager::VmOp::kDrain, proto::Reason::kOperator))
      return error("vsocketd's worker did not answer in 5 s");
    VS_LOG(kInfo, "operator: vm remove %s: draining first", name.c_str());
    return json ? "{\"vm\":" + Quoted(name) + ",\"state\":\"draining\"}\n" : name + ": draining\n";
  }
  uint64_t reset0 = conns_.counters().migration_resets.load();
  // Whatever the drain before could not move is reset at both ends (never
  // left to end short), as at a migration's detach.
  if (!Apply(port->index, ConnManager::VmOp::kRemove, proto::Reason::kOperator))
    return error("vsocketd's worker did not answer in 5 s: " + name + " was not removed");
  uint64_t reset = conns_.counters().migration_resets.load() - reset0;
  {
    MutexLock lock(ports_mu_);
    if (port_open_.erase(port->index) != 0) {
      // Ends its vhost-user sessions: its libraries go on on kernel TCP.
      Status st = vhost::VhostBackend::Instance().RemovePort(port->path);
      if (!st.ok()) VS_LOG(kWarn, "vm %s: %s", name.c_str(), st.ToString().c_str());
    }
  }
  peering_.DirectoryVmAway(name);
  auto next = std::make_shared<VmTable::Vms>();
  for (const vhost::PortConfig& p : *now)
    if (p.vm_name != name) next->push_back(p);
  std::shared_ptr<const VmTable::Vms> left = std::move(next);
  vms_.Set(left);
  uint64_t seq = conns_.RequestLocalPorts(left);
  worker_.Wake();
  for (int i = 0; i < 5000 && conns_.drains_applied() < seq; ++i) usleep(1000);
  if (TenantsOf(*left).count(port->tenant_id) == 0) peering_.DirectoryTenants(TenantsOf(*left));
  // A VM of this name added later is a new VM: no attestation carried over.
  vhost::VhostBackend::Instance().AttestNetns(port->path, 0);
  SaveAttested();
  std::string note;
  if (Status st = RemoveVmDropIn(dir, name); !st.ok()) note = "; " + st.message() + ": it comes back at the next start";
  (void)MarkVmLeft(dir, name, false);  // (a VM of this name added later has not left)
  VS_LOG(kInfo, "operator: vm remove %s: %lu connection(s) still on the rings reset%s", name.c_str(),
         static_cast<unsigned long>(reset), note.c_str());
  if (json)
    return "{\"vm\":" + Quoted(name) + ",\"state\":\"removed\",\"reset\":" + std::to_string(reset) + "}\n";
  return name + ": removed: its vhost-user port is closed; " + std::to_string(reset) +
         " connection(s) still on the rings were reset" + note + "\n";
}

}  // namespace vsocket::backend
