// Tenants with overlapping addresses (issue 17, finding 4). Tenant IDs
// exist so that tenants may use the same IP addresses; the registry keys
// connections by tenant and 4-tuple, and pairing must look only within the
// tenant. Another tenant registering the mirror of a victim's 4-tuple must
// change nothing for the victim (no DOWNGRADE, still pairable with its real
// peer) and teach the attacker nothing (its own registration is not told
// that another tenant has that tuple).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "proto/control.h"
#include "tests/integration/control_channel.h"
#include "tests/integration/daemon_fixture.h"

namespace vsocket {
namespace {

using guest::ChannelOptions;
using guest::ControlChannel;
using proto::Endpoint;
using proto::Message;
using proto::MsgType;
using proto::Role;
using testing::Daemon;

Endpoint Ep(uint8_t last, uint16_t port) {
  Endpoint e;
  e.addr = {192, 0, 2, last};
  e.port = port;
  return e;
}

// A guest that registers connections with raw control messages.
class RawGuest {
 public:
  explicit RawGuest(const std::string& sock) {
    ChannelOptions o;
    o.frontend.socket_path = sock;
    o.frontend.region_bytes = 4u << 20;
    auto ch = ControlChannel::Open(o);
    EXPECT_TRUE(ch.ok()) << ch.status().ToString();
    if (ch.ok()) ch_ = std::move(ch).value();
    scratch_.resize(proto::kMaxMessageSize);
  }
  // REGISTER_CONN; returns the ack's reason ("" on failure).
  std::string Register(uint64_t id, Role role, Endpoint local, Endpoint peer) {
    if (!ch_) return "";
    auto& alloc = ch_->frontend().allocator();
    uint8_t* tx = alloc.Allocate(kRing, 64);
    uint8_t* rx = alloc.Allocate(kRing, 64);
    if (!tx || !rx) return "";
    proto::RegisterConn r{id, role, local, peer, reinterpret_cast<uint64_t>(tx), reinterpret_cast<uint64_t>(rx), kRing,
                          kRing};
    Message resp;
    if (!ch_->Call({MsgType::kRegisterConn, 0, r}, &resp, scratch_).ok()) return "";
    const auto* ack = std::get_if<proto::RegisterAck>(&resp.body);
    return ack ? proto::ToString(ack->reason) : "";
  }

 private:
  static constexpr uint32_t kRing = 64 * 1024;
  std::unique_ptr<ControlChannel> ch_;
  std::vector<uint8_t> scratch_;
};

class TenantsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.Start()); }
  void TearDown() override {
    EXPECT_TRUE(daemon_.Alive()) << "vsocketd survived";
    int st = daemon_.Kill(SIGTERM);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "vsocketd stopped cleanly: wait status " << st;
  }
  // The registry's view of vm's connection local -> peer: "mode reason".
  std::string State(const std::string& vm, uint16_t local_port) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // events are raised by the worker
    std::string json = daemon_.Command("connections --json");
    std::string key = "\"vm\":\"" + vm + "\"";
    for (size_t p = json.find(key); p != std::string::npos; p = json.find(key, p + 1)) {
      size_t start = json.rfind('{', p), end = json.find('}', p);
      std::string row = json.substr(start, end - start);
      if (row.find(":" + std::to_string(local_port) + "\"") == std::string::npos) continue;
      auto field = [&](const char* f) {
        size_t q = row.find(std::string("\"") + f + "\":\"");
        if (q == std::string::npos) return std::string("?");
        q += std::strlen(f) + 4;
        return row.substr(q, row.find('"', q) - q);
      };
      return field("mode") + " " + field("reason");
    }
    return "absent: " + json;
  }

  // Tenant 1: a client VM and a server VM; tenant 2: the attacker, with the
  // same addresses.
  Daemon daemon_{{"client:1,192.0.2.1", "server:1,192.0.2.2", "attacker:2,192.0.2.1;192.0.2.2"}};
};

// The attacker registers the mirror of the victim's pending connection.
TEST_F(TenantsTest, MirrorRegistrationOfAnotherTenantChangesNothing) {
  RawGuest client(daemon_.socket_path("client")), server(daemon_.socket_path("server")),
      attacker(daemon_.socket_path("attacker"));
  Endpoint c = Ep(1, 40000), s = Ep(2, 80);
  EXPECT_EQ(client.Register(1, Role::kClient, c, s), "pending");
  EXPECT_EQ(attacker.Register(1, Role::kServer, s, c), "pending");
  EXPECT_EQ(State("client", 40000), "kernel pending") << "the victim is told nothing";
  EXPECT_EQ(State("attacker", 80), "kernel pending") << "the attacker learns nothing";
  // The victim's real peer comes: they pair.
  EXPECT_EQ(server.Register(1, Role::kServer, s, c), "pending");
  EXPECT_EQ(State("client", 40000), "accelerated accelerated");
  EXPECT_EQ(State("server", 80), "accelerated accelerated");
  EXPECT_EQ(State("attacker", 80), "kernel pending");
}

// The attacker comes first; the victim's pair forms all the same.
TEST_F(TenantsTest, AttackerFirstChangesNothing) {
  RawGuest client(daemon_.socket_path("client")), server(daemon_.socket_path("server")),
      attacker(daemon_.socket_path("attacker"));
  Endpoint c = Ep(1, 40001), s = Ep(2, 81);
  EXPECT_EQ(attacker.Register(1, Role::kClient, c, s), "pending");
  EXPECT_EQ(server.Register(1, Role::kServer, s, c), "pending");
  EXPECT_EQ(State("server", 81), "kernel pending");
  EXPECT_EQ(State("attacker", 40001), "kernel pending");
  EXPECT_EQ(client.Register(1, Role::kClient, c, s), "pending");
  EXPECT_EQ(State("client", 40001), "accelerated accelerated");
  EXPECT_EQ(State("server", 81), "accelerated accelerated");
}

}  // namespace
}  // namespace vsocket
