// vsocket-guestd's service: hands each of the VM's vSocket devices (one per
// virtio-net-pci function attached to vsocketd) to one application process
// at a time over a Unix socket (grant.h), and stands
// between it and the hardware it cannot touch: the process's kicks
// (eventfds) become doorbell writes, the device's interrupt (INTx through
// uio) becomes the process's wake-ups. When the process goes, the device is
// reset and set up afresh for the next one.
//
// vsocketd going away (a crash, a restart) is invisible to a process here
// (its liveness is the agent's socket, not vsocketd's): QEMU says it with
// the function's link (VIRTIO_NET_F_STATUS, a configuration interrupt). A
// link that goes down ends the grant on that function as if the process
// had gone (its socket closed, the function reset and set up afresh), so
// the library takes the backend for lost and finishes its connections on
// kernel TCP (RESYNC), as a process-mode library does when vsocketd's
// socket hangs up; until a link is up again, a process that asks is told
// kBackendAway.
#pragma once

#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"
#include "guest/agent/vm_device.h"

namespace vsocket::agent {

struct AgentServerCounters {
  uint64_t grants = 0;
  uint64_t proved = 0;          // sockets vouched for to vsocketd (decision 100)
  uint64_t proofs_refused = 0;  // not a connected TCP socket, not bound, or vsocketd said no
  uint64_t proofs_wrong_netns = 0;  // (of proofs_refused) a socket of another network namespace than the agent's
  uint64_t refused_busy = 0;
  uint64_t regrants = 0;  // a process that held a device asked again: that device afresh
  uint64_t link_downs = 0;     // a granted function's link went down: vsocketd gone, its process told
  uint64_t refused_away = 0;   // no free function had its link up
  uint64_t refused_failed = 0;  // a free function could not be set up (huge pages?)
  uint64_t kicks = 0;
  uint64_t interrupts = 0;
  // A function vsocketd said it could not interrupt (QEMU started it with
  // INTx disabled, decision 129): its queues stopped and started again.
  uint64_t queue_restarts = 0;
  uint64_t memory_limits = 0;  // devices limited to their function's memory before a grant (decision 130)
};

class AgentServer {
 public:
  // Listens on `path` (mode 0600, root's processes only, without `proofs`;
  // with them 0777: every function is limited to its own memory, decision
  // 130; docs/vm-mode.md) and sets the devices up: the functions in `bdfs`
  // (empty: every 1af4:1041 function of the VM). With `proofs` (the VM's
  // port has prove_sockets = agent) the last of them is the agent's own:
  // it opens a session there and vsocketd must answer its HELLO with
  // kFeatureProofAuthority (it does only for the function QEMU attached to
  // the port's agent socket), or Listen fails; that function is never
  // granted, and processes prove their sockets at PATH.proof
  // (vhost/user/proof.h: kBind with the grant's memfd, then kProve per
  // socket; decision 100). Without `proofs` no function is asked (a
  // function reset before a live migration has been seen to stall that
  // migration's drain: docs/vm-mode.md) and there is no PATH.proof.
  static Result<std::unique_ptr<AgentServer>> Listen(const std::string& path, const VmDeviceOptions& options,
                                                     bool proofs = false, std::vector<std::string> bdfs = {});
  ~AgentServer();
  // Serves until *stop is set (a signal handler's flag).
  Status Run(const volatile sig_atomic_t* stop);
  const AgentServerCounters& counters() const { return counters_; }
  bool proves_sockets() const { return authority_ != nullptr; }

 private:
  // One device and the process it is granted to.
  struct Slot {
    std::string bdf;
    std::unique_ptr<VmDevice> device;
    UniqueFd client;
    pid_t pid = 0;  // the client's (SO_PEERCRED)
    UniqueFd kick[2];
    UniqueFd call[2];
    uint64_t grant_serial = 0;  // which grant the current client holds
    bool link_up = true;        // (a device without the status word: always)
    bool limited = false;       // vsocketd limited this set-up's device to its memory (decision 130)
  };
  // A process's proof channel: bound to the slot whose memory it passed,
  // for that grant only.
  struct ProofChannel {
    UniqueFd fd;
    size_t slot = SIZE_MAX;
    uint64_t grant_serial = 0;
  };
  AgentServer(std::string path, VmDeviceOptions options) : path_(std::move(path)), options_(std::move(options)) {}
  Status OpenDevice(size_t slot);
  // Opens `bdf` with a session of the agent's own, which vsocketd must
  // take for the VM's authority (kept in authority_).
  Status OpenAuthority(const std::string& bdf);
  void AcceptProof();
  // One message on channel c; false: the channel is done.
  bool ServeProof(ProofChannel& c);
  Status Grant(UniqueFd client);
  void Release(size_t slot);  // the process went: reset the device
  // The function's link as the device says now; a granted function whose
  // link went down is released (its process told by the hang-up).
  void CheckLink(size_t slot);
  // A device vsocketd cannot interrupt (VmDevice::BackendCannotCall):
  // its queues restarted with INTx on, its process woken to look again.
  void RestartIfCannotCall(VmDevice& device, UniqueFd* calls);
  // Writes a slot's two wake-up eventfds (`calls`: its call[2]; nullptr or
  // closed ones: no process): its process looks at its rings again.
  static void WakeProcess(UniqueFd* calls);
  // Decision 130: the VM's authority limits slot's device to the memory
  // the agent gave it (its DMA pages), waiting (bounded) for vsocketd to
  // have started it. Without the authority: nothing to do.
  Status Limit(Slot& s);
  // vsocketd flags a device it knows no limit for (a device new to it): the
  // authority limits it again, then it is kicked and its process woken.
  void LimitIfAsked(Slot& s);
  void OnEvent(uint64_t tag);
  Status Watch(int fd, uint64_t tag);

  std::string path_;
  VmDeviceOptions options_;
  UniqueFd listen_;
  UniqueFd epoll_;
  std::vector<Slot> slots_;
  std::unique_ptr<VmDevice> authority_;  // the VM's socket-proof authority, if any
  std::string authority_bdf_;
  UniqueFd proof_listen_;
  std::vector<ProofChannel> proofs_;  // (a closed one's fd is -1: its entry is reused)
  // The network namespace the agent vouches for (its own: the one whose
  // addresses are the VM's): a socket of any other is no proof (a
  // look-alike 4-tuple, decision 127). By cookie where the kernel has
  // SO_NETNS_COOKIE, else by the namespace file's inode (SIOCGSKNS).
  bool netns_by_cookie_ = false;
  uint64_t netns_ = 0;
  uint64_t next_grant_serial_ = 1;
  int64_t last_link_look_ns_ = 0;
  AgentServerCounters counters_;
};

}  // namespace vsocket::agent
