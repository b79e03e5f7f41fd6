// Guest-side settings: VSOCKET_* environment variables, else
// /etc/vsocket/vsocket.conf (KEY=value lines, same keys without the prefix),
// else defaults. Read once per process.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "proto/control.h"

namespace vsocket::guest {

// Where the library looks for vSocket when VSOCKET_SOCKET (or SOCKET= in
// /etc/vsocket/vsocket.conf) names nothing: vsocket-guestd's socket, the
// agent's default inside a VM (docs/vm-mode.md, decision 108).
inline constexpr const char* kDefaultAgentSocket = "/run/vsocket/agent.sock";

// One per-destination rule: "accel|kernel ADDR[/PREFIX][:PORT]" ("*" for
// any address); the first rule matching a connection's peer decides.
struct DestinationRule {
  bool accelerate = true;
  proto::Family family = proto::Family::kIpv4;
  bool any_address = false;
  std::array<uint8_t, 16> addr{};
  int prefix = 32;
  uint16_t port = 0;  // 0: any
};

enum class UpgradePolicy : uint8_t { kAuto, kAlways };

struct GuestConfig {
  // VSOCKET_SOCKET: vsocketd's port (process mode) or vsocket-guestd's
  // socket (in a VM); which one, the library finds out (decision 108).
  // Unset: kDefaultAgentSocket (socket_is_default); set empty: off.
  std::string socket_path = kDefaultAgentSocket;
  bool socket_is_default = true;
  bool enabled = true;               // VSOCKET_ENABLE=0 turns acceleration off
  uint32_t ring_bytes = 256 * 1024;  // VSOCKET_RING_KB: per direction and connection
  size_t region_bytes = 64u << 20;   // VSOCKET_REGION_MB: shared region per process
  int poll_us = 50;                  // VSOCKET_POLL_US: spin at least this long before sleeping
  int poll_max_us = 400;    // VSOCKET_POLL_MAX_US: at most this, for waits that usually end sooner (0: fixed poll_us)
  bool poll_auto = true;    // VSOCKET_POLL_AUTO=0: poll even where vsocketd shares our few CPUs (cpu_share.h)
  bool doorbell = true;     // VSOCKET_DOORBELL=0: one TX_TAIL/CONSUMED message per count (A/B runs)
  bool ring_hold = true;    // VSOCKET_RING_HOLD=0: do not offer kFeatureRingHold (the fabric then copies)
  bool direct = true;       // VSOCKET_DIRECT=0: do not offer kFeatureDirect (decision 97: no direct pairs)
  // VSOCKET_UPGRADE: when a connection registers for acceleration (decision 51).
  // kAuto: at its first I/O where vsocketd has CPUs of its own; where it
  // shares this process's few CPUs, only once the connection streams
  // (stream_detector.h). kAlways: at its first I/O.
  UpgradePolicy upgrade = UpgradePolicy::kAuto;
  uint32_t stream_window = 256 * 1024;  // VSOCKET_STREAM_KB: the detector's window
  uint32_t busy_events = 2;  // VSOCKET_BUSY_EVENTS: events per wait that make a loop busy (0: never; decision 83)
  std::string report_path;  // VSOCKET_REPORT: per-connection report at close/exit
  std::string log_level = "warn";      // VSOCKET_LOG_LEVEL
  std::vector<DestinationRule> rules;  // VSOCKET_RULES, comma-separated
};

namespace config_internal {
extern std::atomic<const GuestConfig*> g_config;  // set once loaded, never freed
const GuestConfig& LoadOnce();
}  // namespace config_internal

// The process's configuration, read from the environment at its first use.
// Inline (an acquire load, a plain load on x86): the held path reads it on
// every call.
inline const GuestConfig& Config() {
  const GuestConfig* c = config_internal::g_config.load(std::memory_order_acquire);
  return __builtin_expect(c != nullptr, 1) ? *c : config_internal::LoadOnce();
}

// Parses VSOCKET_RULES syntax; false (and *error set) on a bad rule.
bool ParseRules(const std::string& text, std::vector<DestinationRule>* out, std::string* error);
// Whether the rules allow accelerating a connection to `peer`.
bool AccelerationAllowed(const GuestConfig& config, const proto::Endpoint& peer);

}  // namespace vsocket::guest
