// Guest-side settings: VSOCKET_* environment variables, else
// /etc/vsocket/vsocket.conf (KEY=value lines, same keys without the prefix),
// else defaults. Read once per process.
#pragma once

#include <cstdint>
#include <string>

namespace vsocket::guest {

struct GuestConfig {
  std::string socket_path;        // VSOCKET_SOCKET: the VM's vhost-user socket; empty = off
  bool enabled = true;            // VSOCKET_ENABLE=0 turns acceleration off
  uint32_t ring_bytes = 256 * 1024;  // VSOCKET_RING_KB: per direction and connection
  size_t region_bytes = 64u << 20;   // VSOCKET_REGION_MB: shared region per process
  int poll_us = 50;               // VSOCKET_POLL_US: spin before sleeping
  int upgrade_wait_ms = 0;        // VSOCKET_UPGRADE_WAIT_MS: reserved
  std::string report_path;        // VSOCKET_REPORT: per-connection report at close/exit
  std::string log_level = "warn"; // VSOCKET_LOG_LEVEL
};

const GuestConfig& Config();

}  // namespace vsocket::guest
