// vsocket-guestd's service: hands each of the VM's vSocket devices (one per
// virtio-net-pci function attached to vsocketd) to one application process
// at a time over a Unix socket (grant.h), and stands
// between it and the hardware it cannot touch: the process's kicks
// (eventfds) become doorbell writes, the device's interrupt (INTx through
// uio) becomes the process's wake-ups. When the process goes, the device is
// reset and set up afresh for the next one.
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
  uint64_t refused_busy = 0;
  uint64_t regrants = 0;  // a process that held a device asked again: that device afresh
  uint64_t kicks = 0;
  uint64_t interrupts = 0;
};

class AgentServer {
 public:
  // Listens on `path` (mode 0600: root's processes only until the agent
  // proves sockets for them) and sets the devices up: the functions in
  // `bdfs` (empty: every 1af4:1041 function of the VM).
  static Result<std::unique_ptr<AgentServer>> Listen(const std::string& path, const VmDeviceOptions& options,
                                                     std::vector<std::string> bdfs = {});
  ~AgentServer();
  // Serves until *stop is set (a signal handler's flag).
  Status Run(const volatile sig_atomic_t* stop);
  const AgentServerCounters& counters() const { return counters_; }

 private:
  // One device and the process it is granted to.
  struct Slot {
    std::string bdf;
    std::unique_ptr<VmDevice> device;
    UniqueFd client;
    pid_t pid = 0;  // the client's (SO_PEERCRED)
    UniqueFd kick[2];
    UniqueFd call[2];
  };
  AgentServer(std::string path, VmDeviceOptions options) : path_(std::move(path)), options_(std::move(options)) {}
  Status OpenDevice(size_t slot);
  Status Grant(UniqueFd client);
  void Release(size_t slot);  // the process went: reset the device
  void OnEvent(uint64_t tag);
  Status Watch(int fd, uint64_t tag);

  std::string path_;
  VmDeviceOptions options_;
  UniqueFd listen_;
  UniqueFd epoll_;
  std::vector<Slot> slots_;
  AgentServerCounters counters_;
};

}  // namespace vsocket::agent
