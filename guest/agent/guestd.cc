// vsocket-guestd: the in-guest agent of VM mode (issue 35, decision 84).
//
// Owns the VM's vSocket device (QEMU's virtio-net-pci attached to vsocketd
// over vhost-user) from user space through uio_pci_generic. By default it
// opens vSocket's session on it itself (HELLO) and checks the data path
// with checksummed ECHOes; with --serve it hands the device to one
// application process at a time over a Unix socket (agent_server.h,
// grant.h), the process's session running on AgentTransport.
//
// Usage: vsocket-guestd [--pci BDF] [--echo N] [--echo-bytes B] [--hold]
//        vsocket-guestd --serve [PATH] [--proofs] [--pci BDF] [--huge-pages N]
//   --serve [PATH]   serve processes at PATH (default /run/vsocket/agent.sock)
//                    until SIGTERM/SIGINT
//   --proofs         the VM's port proves sockets through this agent
//                    (prove_sockets = agent, decision 100): the last vSocket
//                    function is the agent's own, its socket-proof authority;
//                    processes prove their sockets at PATH.proof
//   --pci BDF        the function (default: every vSocket function with
//                    --serve, the only one without)
//   --mac-prefix P   a 1af4:1041 function a network driver holds is vSocket's
//                    only if its MAC starts with P (default 02:76:73;
//                    decision 119); "any": every such function
//   --echo N         ECHO round trips after HELLO (default 16)
//   --echo-bytes B   payload of each (default 4096, at most 4096)
//   --huge-pages N   2 MiB pages for rings and buffers (default 2)
//   --hold           keep the device and session until SIGTERM/SIGINT
//   --list           print the vSocket functions (one BDF a line; those left
//                    alone on stderr) and exit: 0 if there is one, 1 if none
//                    (vsocket-guest-setup check counts with it)
// Exit status: 0 on success, 1 on failure (the reason on stderr).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "guest/agent/agent_server.h"
#include "guest/agent/vm_device.h"

namespace {

volatile sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

constexpr char kUsage[] =
    "usage: vsocket-guestd [--pci BDF] [--mac-prefix P] [--echo N] [--echo-bytes B] [--huge-pages N] "
    "[--hold | --serve [PATH] [--proofs] | --list]\n";

// "" (any) or 1-6 colon-separated hex bytes.
bool ValidMacPrefix(const std::string& p) {
  if (p.empty()) return true;
  if (p.size() > 17 || p.size() % 3 != 2) return false;
  for (size_t i = 0; i < p.size(); ++i)
    if (i % 3 == 2 ? p[i] != ':' : !isxdigit(static_cast<unsigned char>(p[i]))) return false;
  return true;
}

int Usage(const char* why) {
  fprintf(stderr, "vsocket-guestd: %s\n%s", why, kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace vsocket;
  agent::VmDeviceOptions o;
  long echoes = 16, echo_bytes = 4096;
  bool hold = false, proofs = false, list = false;
  std::string serve;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (a == "--pci") {
      const char* v = next();
      if (!v) return Usage("--pci needs a BDF");
      o.bdf = v;
    } else if (a == "--echo" || a == "--echo-bytes" || a == "--huge-pages") {
      const char* v = next();
      char* end = nullptr;
      long n = v ? strtol(v, &end, 10) : -1;
      if (!v || *end != '\0' || n < 0) return Usage((a + " needs a number").c_str());
      if (a == "--echo") echoes = n;
      else if (a == "--echo-bytes") echo_bytes = n;
      else o.huge_pages = static_cast<size_t>(n);
    } else if (a == "--mac-prefix") {
      const char* v = next();
      if (!v) return Usage("--mac-prefix needs a prefix such as 02:76:73, or any");
      o.mac_prefix = std::string(v) == "any" ? "" : v;
      if (!ValidMacPrefix(o.mac_prefix)) return Usage("--mac-prefix: 1 to 6 hex bytes, colon-separated (02:76:73), or any");
    } else if (a == "--serve") {
      serve = "/run/vsocket/agent.sock";
      if (i + 1 < argc && argv[i + 1][0] != '-') serve = argv[++i];
    } else if (a == "--hold") {
      hold = true;
    } else if (a == "--list") {
      list = true;
    } else if (a == "--proofs") {
      proofs = true;
    } else if (a == "-h" || a == "--help") {
      printf("%s  the in-guest agent of VM mode (docs/vm-mode.md); --serve is what the vsocket-guestd unit runs\n",
             kUsage);
      return 0;
    } else {
      return Usage(("unknown argument " + a).c_str());
    }
  }
  if (echo_bytes < 1 || echo_bytes > static_cast<long>(proto::kMaxEchoPayload)) return Usage("--echo-bytes: 1..4096");

  if (list) {
    auto found = agent::PciFunction::VsocketFunctions(o.mac_prefix);
    if (!found.ok()) {
      fprintf(stderr, "vsocket-guestd: %s\n", found.status().message().c_str());
      return 1;
    }
    for (const std::string& bdf : *found) printf("%s\n", bdf.c_str());
    return 0;
  }
  if (!serve.empty()) {
    if (o.huge_pages < 8) o.huge_pages = 8;  // room for the session's connections' rings
    auto server = agent::AgentServer::Listen(serve, o, proofs);
    if (!server.ok()) {
      fprintf(stderr, "vsocket-guestd: cannot serve: %s\n", server.status().ToString().c_str());
      return 1;
    }
    signal(SIGTERM, OnSignal);
    signal(SIGINT, OnSignal);
    printf("vsocket-guestd: serving the VM's vSocket device on %s%s\n", serve.c_str(),
           (*server)->proves_sockets() ? " (socket proofs: the VM's authority)" : "");
    fflush(stdout);
    vsocket::Status st = (*server)->Run(&g_stop);
    const agent::AgentServerCounters& c = (*server)->counters();
    printf("vsocket-guestd: stopping: %llu grants, %llu refused (busy), %llu kicks, %llu interrupts, "
           "%llu sockets vouched for, %llu proofs refused (%llu of another network namespace), %llu grants ended by a link down, "
           "%llu refused (link down), %llu refused (no function could be set up), %llu queue restarts, %llu devices limited\n",
           static_cast<unsigned long long>(c.grants), static_cast<unsigned long long>(c.refused_busy),
           static_cast<unsigned long long>(c.kicks), static_cast<unsigned long long>(c.interrupts),
           static_cast<unsigned long long>(c.proved), static_cast<unsigned long long>(c.proofs_refused),
           static_cast<unsigned long long>(c.proofs_wrong_netns),
           static_cast<unsigned long long>(c.link_downs), static_cast<unsigned long long>(c.refused_away),
           static_cast<unsigned long long>(c.refused_failed), static_cast<unsigned long long>(c.queue_restarts),
           static_cast<unsigned long long>(c.memory_limits));
    if (!st.ok()) fprintf(stderr, "vsocket-guestd: %s\n", st.ToString().c_str());
    return st.ok() ? 0 : 1;
  }
  auto t0 = std::chrono::steady_clock::now();
  auto ms = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  };
  auto dev = agent::VmDevice::Open(o);
  if (!dev.ok()) {
    fprintf(stderr, "vsocket-guestd: cannot own the device: %s\n", dev.status().ToString().c_str());
    return 1;
  }
  agent::VmDevice& d = **dev;
  printf("vsocket-guestd: %s bound to uio_pci_generic, features %#llx, queue size %u (%lld ms)\n", d.bdf().c_str(),
         static_cast<unsigned long long>(d.features()), d.queue_size(), static_cast<long long>(ms()));
  auto ack = d.Hello(0);
  if (!ack.ok()) {
    fprintf(stderr, "vsocket-guestd: HELLO failed: %s\n", ack.status().ToString().c_str());
    return 1;
  }
  printf("vsocket-guestd: HELLO_ACK device %u, max_conns %u, features %#llx (%lld ms)\n", ack->device_id,
         ack->max_conns, static_cast<unsigned long long>(ack->features), static_cast<long long>(ms()));
  std::vector<uint8_t> payload(static_cast<size_t>(echo_bytes));
  for (long i = 0; i < echoes; ++i) {
    for (size_t k = 0; k < payload.size(); ++k) payload[k] = static_cast<uint8_t>(k * 31 + i * 7 + 1);
    vsocket::Status st = d.Echo(payload);
    if (!st.ok()) {
      fprintf(stderr, "vsocket-guestd: ECHO %ld failed: %s\n", i, st.ToString().c_str());
      return 1;
    }
  }
  printf("vsocket-guestd: %ld ECHOes of %ld bytes checked (%lld ms; %llu interrupts, %llu polls)\n", echoes,
         echo_bytes, static_cast<long long>(ms()), static_cast<unsigned long long>(d.counters().interrupts),
         static_cast<unsigned long long>(d.counters().polls));
  fflush(stdout);
  if (hold) {
    signal(SIGTERM, OnSignal);
    signal(SIGINT, OnSignal);
    while (!g_stop) pause();
    printf("vsocket-guestd: stopping, device reset\n");
  }
  return 0;
}
