// vsocketctl: the operator's view of a running vsocketd.
//
//   vsocketctl [--socket PATH] [--json] COMMAND
//     devices       guest devices (one per attached guest process)
//     vms           per VM: tenant, devices, connections, bytes
//     tenants       per tenant totals
//     connections   every registered connection: mode, reason, bytes each way
//     links         per peer host: fabric link state, frames, bytes, batching
//     fallbacks     connections left on kernel TCP, by reason, per VM and tenant
//     counters      daemon counters
//     metrics       Prometheus text exposition
//     stats         everything, JSON
//     drain [VM] [--wait SEC]   move VM's (or every VM's) connections to kernel TCP
//     undrain [VM]              let them accelerate again
//     drained [VM]              how many are still on the rings
//     migrate begin VM [--wait SEC]   VM leaves this host (drain, then detach)
//     migrate end VM                  VM runs here (arrived, or its move called off)
//     locator [set TENANT ADDRESS HOST | reload]   the static locator
//     attest VM     run inside VM's network namespace: that namespace is VM's
//     vm add NAME --socket PATH --tenant T [--addresses A[,B...]] [--KEY VALUE...]
//     vm remove NAME [--wait SEC]   VMs added and removed at runtime (decision 105)
// The socket defaults to $VSOCKET_CTL_SOCKET, else /run/vsocket/vsocketd.sock.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef SO_NETNS_COOKIE
#define SO_NETNS_COOKIE 71
#endif

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

constexpr char kUsage[] =
    "usage: vsocketctl [--socket PATH] [--json] COMMAND\n"
    "The operator's view of a running vsocketd.\n"
    "  devices       guest devices (one per attached guest process)\n"
    "  vms           per VM: tenant, devices, connections, bytes\n"
    "  tenants       per tenant totals\n"
    "  connections   every registered connection: mode, reason, bytes each way\n"
    "  links         per peer host: fabric link state, frames, bytes, batching\n"
    "  fallbacks     connections left on kernel TCP, by reason, per VM and tenant\n"
    "  counters      daemon counters\n"
    "  metrics       Prometheus text exposition\n"
    "  stats         everything, JSON\n"
    "  drain [VM]    move VM's (or every VM's) accelerated connections to kernel\n"
    "                TCP with clean fences; new ones stay there until undrain\n"
    "                (--wait SEC: until none is still leaving the rings, exit 1\n"
    "                if some still are after SEC seconds)\n"
    "  undrain [VM]  let them accelerate again\n"
    "  drained [VM]  whether VM drains, how many connections are still leaving\n"
    "                the rings, how many are accelerated\n"
    "  migrate begin VM   VM is about to move to another host: its connections\n"
    "                leave the rings with clean fences (like drain), then its\n"
    "                vhost-user sessions end and its port closes; connections\n"
    "                still on the rings after --wait SEC (default 10) are reset\n"
    "  migrate end VM     VM runs here (it arrived, or its move was called off):\n"
    "                its port opens, its connections accelerate again\n"
    "  locator       the static locator's entries (TENANT ADDRESS HOST); with\n"
    "                locator = etcd[s]://...: its health and the cached entries\n"
    "  locator set TENANT ADDRESS[/PREFIX] HOST   where a guest address runs now\n"
    "  locator reload     read the locator file again\n"
    "  attest VM     run inside VM's network namespace (ip netns exec, nsenter):\n"
    "                vsocketd then refuses socket proofs from any other (a\n"
    "                look-alike connection a guest process built in a\n"
    "                namespace of its own)\n"
    "  vm add NAME --socket PATH --tenant T [--addresses A[,B...]] [--group G]\n"
    "                [--prove-sockets true|false|agent] [--direct off|same-tenant|same-vm]\n"
    "                [--incoming true]\n"
    "                a VM added at runtime (every VM key of vsocketd.conf but away):\n"
    "                its port opens, its addresses pair, it is published in the etcd\n"
    "                directory (--incoming true, a QEMU migration's destination: when\n"
    "                its first device starts), and it is kept in the VMs directory (vms_dir) so\n"
    "                that vsocketd finds it again when it restarts. After `vm`,\n"
    "                --socket is the VM's: vsocketctl's own goes before the command\n"
    "  vm remove NAME    a VM vm add added: its connections leave the rings with\n"
    "                clean fences (like drain; those still on them after --wait\n"
    "                SEC, default 10, are reset), its port closes, its record\n"
    "                leaves the directory and its file the VMs directory\n"
    "  -s, --socket PATH   vsocketd's control socket (default $VSOCKET_CTL_SOCKET,\n"
    "                      else /run/vsocket/vsocketd.sock; root or group vsocket)\n"
    "  -j, --json          JSON instead of a table\n"
    "  -h, --help          this text\n";

int Usage() {
  std::fputs(kUsage, stderr);
  return 2;
}

}  // namespace

namespace {

// Sends one command line; false (after saying why) if there is no answer
// within timeout_ms (vm add waits for the worker, up to 5 s, and for its
// directory record to come back, up to 3 s: vm commands get longer).
bool Ask(const std::string& path, const std::string& line, std::string* out, int timeout_ms = 5000) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    std::fprintf(stderr, "vsocketctl: socket path too long\n");
    return false;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::fprintf(stderr, "vsocketctl: cannot reach vsocketd at %s: %s\n", path.c_str(), std::strerror(errno));
    close(fd);
    return false;
  }
  if (write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    std::fprintf(stderr, "vsocketctl: write: %s\n", std::strerror(errno));
    close(fd);
    return false;
  }
  out->clear();
  char buf[65536];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) {
      std::fprintf(stderr, "vsocketctl: no answer from vsocketd\n");
      close(fd);
      return false;
    }
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      std::fprintf(stderr, "vsocketctl: read: %s\n", std::strerror(errno));
      close(fd);
      return false;
    }
    if (n == 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return true;
}

bool IsError(const std::string& out) { return out.rfind("error:", 0) == 0 || out.rfind("{\"error\"", 0) == 0; }

// A `drained` answer (text or JSON) that says no connection is still
// leaving the rings.
bool NoneLeaving(const std::string& out) {
  return out.find(" 0 connection(s) still leaving") != std::string::npos || out.find("\"leaving\":0,") != std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  const char* env = std::getenv("VSOCKET_CTL_SOCKET");
  std::string path = env ? env : "/run/vsocket/vsocketd.sock";
  std::string command;
  bool json = false;
  int wait_s = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (command == "vm" || command.rfind("vm ", 0) == 0) {
      // Everything after `vm` is the VM's (--socket too), but --json and --wait.
      if (a == "--json" || a == "-j") json = true;
      else if (a == "--wait" && i + 1 < argc) wait_s = std::atoi(argv[++i]);
      else if (a.empty() || a.find_first_of(" \t\n") != std::string::npos) return Usage();
      else command += " " + a;
      continue;
    }
    if ((a == "--socket" || a == "-s") && i + 1 < argc) path = argv[++i];
    else if (a == "--json" || a == "-j") json = true;
    else if (a == "--wait" && i + 1 < argc) wait_s = std::atoi(argv[++i]);
    else if (a == "--help" || a == "-h") return std::fputs(kUsage, stdout) < 0 ? 1 : 0;
    else if (!a.empty() && a[0] == '-') return Usage();
    else if (command.empty()) command = a;
    else if (command == "drain" || command == "undrain" || command == "drained") command += " " + a;  // the VM
    else if (command.rfind("migrate", 0) == 0 || command.rfind("locator", 0) == 0) command += " " + a;
    else if (command == "attest") command += " " + a;
    else return Usage();
  }
  if (command.empty()) return Usage();
  if (command.rfind("attest", 0) == 0) {
    // The cookie of the network namespace this runs in: the kernel's name
    // for it, the same for every socket made there.
    if (command == "attest") return Usage();
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    uint64_t cookie = 0;
    socklen_t len = sizeof(cookie);
    if (s < 0 || getsockopt(s, SOL_SOCKET, SO_NETNS_COOKIE, &cookie, &len) != 0 || cookie == 0) {
      std::fprintf(stderr, "vsocketctl: this kernel gives no network namespace cookie (SO_NETNS_COOKIE, Linux 5.14+)\n");
      return 1;
    }
    close(s);
    command += " " + std::to_string(cookie);
  }
  bool migrate_begin = command.rfind("migrate begin ", 0) == 0;
  bool vm_remove = command.rfind("vm remove ", 0) == 0 && command.find(' ', 10) == std::string::npos;
  if (wait_s >= 0 && command.rfind("drain ", 0) != 0 && command != "drain" && !migrate_begin && !vm_remove)
    return Usage();
  if (vm_remove) {
    // Its connections leave the rings first, with clean fences (a drain),
    // until none is left on them or --wait SEC (default 10) passed; then
    // vsocketd removes it (what is still on the rings is reset).
    // (vsocketd checks that it may remove the VM before it drains it.)
    std::string vm = command.substr(10), out;
    if (!Ask(path, "vm remove-begin " + vm + (json ? " --json" : "") + "\n", &out, 15000)) return 1;
    if (IsError(out)) {
      std::fwrite(out.data(), 1, out.size(), stdout);
      return 1;
    }
    for (int i = 0; out.find("draining") != std::string::npos && i <= (wait_s < 0 ? 10 : wait_s) * 10; ++i) {
      if (!Ask(path, "drained " + vm + "\n", &out)) return 1;
      if (IsError(out) || (NoneLeaving(out) && out.find(", 0 accelerated") != std::string::npos)) break;
      out = "draining";
      usleep(100000);
    }
    if (!Ask(path, command + (json ? " --json" : "") + "\n", &out, 15000)) return 1;
    if (IsError(out)) (void)Ask(path, "undrain " + vm + "\n", &command);  // (not removed: as it was)
    std::fwrite(out.data(), 1, out.size(), stdout);
    return IsError(out) ? 1 : 0;
  }
  std::string out;
  if (!Ask(path, command + (json ? " --json" : "") + "\n", &out, command.rfind("vm ", 0) == 0 ? 15000 : 5000)) return 1;
  if (migrate_begin && !IsError(out)) {
    // Until the drain moved every connection off the rings (or --wait SEC,
    // default 10, passed: one that cannot move, half-closed, gets that long
    // to finish), then the VM leaves: detach.
    std::string vm = command.substr(14);
    for (int i = 0; i <= (wait_s < 0 ? 10 : wait_s) * 10; ++i) {
      if (!Ask(path, "drained " + vm + "\n", &out)) return 1;
      if (IsError(out) || (NoneLeaving(out) && out.find(", 0 accelerated") != std::string::npos)) break;
      usleep(100000);
    }
    if (!Ask(path, "migrate detach " + vm + (json ? " --json" : "") + "\n", &out)) return 1;
  } else if (wait_s >= 0 && !IsError(out)) {
    // Until none is still leaving the rings (the drain is applied by
    // vsocketd's worker right after it answered: the first answer may
    // predate it).
    std::string query = "drained" + command.substr(5) + (json ? " --json" : "") + "\n";
    for (int i = 0; i <= wait_s * 10; ++i) {
      if (!Ask(path, query, &out)) return 1;
      if (IsError(out) || NoneLeaving(out)) break;
      usleep(100000);
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    return NoneLeaving(out) ? 0 : 1;
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return IsError(out) ? 1 : 0;
}
