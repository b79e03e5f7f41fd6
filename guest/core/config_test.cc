#include "guest/core/config.h"

#include <gtest/gtest.h>

namespace vsocket::guest {
namespace {

proto::Endpoint V4(uint8_t a, uint8_t b, uint8_t c, uint8_t d, uint16_t port) {
  proto::Endpoint e;
  e.addr = {a, b, c, d};
  e.port = port;
  return e;
}

TEST(RulesTest, FirstMatchWinsWithPrefixesAndPorts) {
  GuestConfig c;
  std::string error;
  ASSERT_TRUE(ParseRules("kernel 198.51.100.13, kernel 203.0.113.0/24:6379, accel *", &c.rules, &error)) << error;
  ASSERT_EQ(c.rules.size(), 3u);
  EXPECT_FALSE(AccelerationAllowed(c, V4(198, 51, 100, 13, 80)));
  EXPECT_TRUE(AccelerationAllowed(c, V4(198, 51, 100, 12, 80)));
  EXPECT_FALSE(AccelerationAllowed(c, V4(203, 0, 113, 7, 6379)));
  EXPECT_TRUE(AccelerationAllowed(c, V4(203, 0, 113, 7, 6380)));
}

TEST(RulesTest, PortOnlyAndIpv6) {
  GuestConfig c;
  std::string error;
  ASSERT_TRUE(ParseRules("kernel *:22,kernel [2001:db8::]/32", &c.rules, &error)) << error;
  EXPECT_FALSE(AccelerationAllowed(c, V4(198, 51, 100, 1, 22)));
  proto::Endpoint v6;
  v6.family = proto::Family::kIpv6;
  v6.addr = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5};
  v6.port = 443;
  EXPECT_FALSE(AccelerationAllowed(c, v6));
  v6.addr[3] = 0xb9;
  EXPECT_TRUE(AccelerationAllowed(c, v6));
}

TEST(RulesTest, NoRulesMeansAccelerate) {
  GuestConfig c;
  EXPECT_TRUE(AccelerationAllowed(c, V4(1, 2, 3, 4, 5)));
}

TEST(RulesTest, BadRulesAreRejectedWithReason) {
  std::vector<DestinationRule> r;
  std::string error;
  EXPECT_FALSE(ParseRules("allow 1.2.3.4", &r, &error));
  EXPECT_NE(error.find("accel or kernel"), std::string::npos);
  EXPECT_FALSE(ParseRules("kernel 1.2.3.4/33", &r, &error));
  EXPECT_FALSE(ParseRules("kernel 1.2.3.4:0", &r, &error));
  EXPECT_FALSE(ParseRules("kernel not-an-address", &r, &error));
}

}  // namespace
}  // namespace vsocket::guest
