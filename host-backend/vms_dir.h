// VMs added at runtime (vsocketctl vm add/remove, decision 105): one
// drop-in file per VM, NAME.conf in the VMs directory, holding the VM's
// `[vm NAME]` section in vsocketd.conf's format. vsocketd reads them after
// the configuration file at every start; `vm add` writes one, `vm remove`
// deletes it. A VM of the configuration itself (file, --port, environment)
// has no drop-in and is not vm remove's to delete.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "host-backend/config.h"
#include "vhost/backend/vhost_backend.h"

namespace vsocket::backend {

// The VMs directory: vms_dir, else CTL_SOCKET.vms.d (beside
// CTL_SOCKET.attested: it lasts as long as the control socket's directory;
// the Debian package sets vms_dir = /var/lib/vsocket/vms.d).
std::string VmsDir(const DaemonConfig& config);

// A VM name vm add takes (it names a file): 1-64 of [A-Za-z0-9_.-], not
// starting with '.' or '-'.
bool IsVmName(const std::string& name);

// One VM as vm add gives it.
struct VmDropIn {
  vhost::PortConfig vm;
  std::string text;  // the file's text: "[vm NAME]" and the settings as given
};

// Parses `vm add`'s words after "add": NAME, then --KEY VALUE pairs, KEY a
// VM key of the configuration file ('-' for '_': --prove-sockets). Every VM
// key but `away` (a VM added at runtime runs here). Errors say which word.
Result<VmDropIn> ParseVmAdd(const std::vector<std::string>& words);

// The VM's addresses against the others' of the same tenant on this host:
// kAlreadyExists naming the VM that has one of them.
Status CheckAddressesFree(const std::vector<vhost::PortConfig>& vms, const vhost::PortConfig& vm);

// Reads DIR/*.conf (name order) and appends their VMs to config->vms. A
// missing directory is none. Each file must hold exactly one [vm NAME]
// section, NAME its own name, and no other keys; a VM configured elsewhere
// too is an error naming the file.
Status LoadVmsDir(const std::string& dir, DaemonConfig* config);

// DIR/NAME.conf: written whole (NAME.conf.tmp, fsync, rename; the directory
// made 0750 if missing), or removed. RemoveVmDropIn: kNotFound if there is
// none.
Status WriteVmDropIn(const std::string& dir, const VmDropIn& vm);
Status RemoveVmDropIn(const std::string& dir, const std::string& name);
bool HasVmDropIn(const std::string& dir, const std::string& name);

// A VM whose devices stopped with their dirty log on (a live migration's
// switchover: it runs elsewhere now, decision 116) is marked so in the VMs
// directory, DIR/NAME.left, until a device of it starts here again. A
// vsocketd started meanwhile takes it as `incoming` (ApplyVmsLeft): not in
// the directory until a device of it starts here, instead of publishing it
// again from its configuration while it runs on another host (decision
// 139). MarkVmLeft writes (left) or removes the mark (the directory made
// 0750 if missing); a missing mark is not an error.
Status MarkVmLeft(const std::string& dir, const std::string& name, bool left);
bool VmLeft(const std::string& dir, const std::string& name);
// Every VM of config->vms (not `away`) marked left becomes incoming; their
// names are returned.
std::vector<std::string> ApplyVmsLeft(const std::string& dir, DaemonConfig* config);

}  // namespace vsocket::backend
