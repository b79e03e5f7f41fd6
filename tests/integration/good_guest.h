// A well-behaved guest for the hostile-guest tests: checksummed echoes over
// its own device, in the background, until stopped. Any error fails the test.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "proto/control.h"
#include "tests/integration/control_channel.h"

namespace vsocket::testing {

// A well-behaved guest echoing in the background until stopped.
class GoodGuest {
 public:
  explicit GoodGuest(const std::string& sock) {
    guest::ChannelOptions o;
    o.frontend.socket_path = sock;
    auto ch = guest::ControlChannel::Open(o);
    EXPECT_TRUE(ch.ok()) << ch.status().ToString();
    if (!ch.ok()) return;
    ch_ = std::move(ch).value();
    thread_ = std::thread([this] { Run(); });
  }
  ~GoodGuest() { StopAndCheck(); }
  // Returns the number of verified echoes; fails the test on any error.
  // Gives the guest up to 10 s for its first echo (a short test under a
  // sanitizer on a loaded machine may end before it got one through).
  uint64_t StopAndCheck() {
    for (int i = 0; i < 1000 && ok_.load() == 0 && errors_.load() == 0 && thread_.joinable(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    EXPECT_EQ(errors_.load(), 0u);
    return ok_.load();
  }

 private:
  void Run() {
    std::mt19937 rng(99);
    std::vector<uint8_t> payload(1024), scratch(proto::kMaxMessageSize);
    while (!stop_) {
      size_t len = rng() % payload.size();
      for (size_t i = 0; i < len; ++i) payload[i] = static_cast<uint8_t>(rng());
      std::span<const uint8_t> p(payload.data(), len);
      uint32_t crc = proto::Crc32c(p);
      proto::Message resp;
      Status st = ch_->Call({proto::MsgType::kEcho, 1, proto::Echo{crc, p}}, &resp, scratch, 5000);
      const auto* e = std::get_if<proto::Echo>(&resp.body);
      if (!st.ok() || !e || e->checksum != crc || proto::Crc32c(e->payload) != crc) errors_++;
      else ok_++;
    }
  }

  std::unique_ptr<guest::ControlChannel> ch_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> ok_{0}, errors_{0};
};

}  // namespace vsocket::testing
