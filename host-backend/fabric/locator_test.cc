#include "host-backend/fabric/locator.h"

#include <arpa/inet.h>

#include "gtest/gtest.h"

namespace vsocket::fabric {
namespace {

proto::Endpoint V4(const char* a) {
  proto::Endpoint e;
  inet_pton(AF_INET, a, e.addr.data());
  e.port = 80;
  return e;
}

TEST(StaticLocator, LongestPrefixOfTheSameTenantWins) {
  auto l = StaticLocator::Parse(
      "# tenant address host\n"
      "7 198.51.100.0/24 hostA\n"
      "7 198.51.100.21 hostB   # one VM moved\n"
      "8 198.51.100.21 hostC\n"
      "7 2001:db8::/32 hostA\n",
      "loc");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ((*l)->Find(7, V4("198.51.100.21")), "hostB");
  EXPECT_EQ((*l)->Find(7, V4("198.51.100.22")), "hostA");
  EXPECT_EQ((*l)->Find(8, V4("198.51.100.21")), "hostC");
  EXPECT_EQ((*l)->Find(8, V4("198.51.100.22")), "");  // other tenants never match
  EXPECT_EQ((*l)->Find(9, V4("198.51.100.21")), "");
  proto::Endpoint v6;
  v6.family = proto::Family::kIpv6;
  inet_pton(AF_INET6, "2001:db8::5", v6.addr.data());
  EXPECT_EQ((*l)->Find(7, v6), "hostA");
}

TEST(StaticLocator, MergeReplacesTheSameTenantAndPrefixOnly) {
  auto l = StaticLocator::Parse("7 198.51.100.0/24 hostA\n7 198.51.100.21 hostA\n8 198.51.100.21 hostC\n", "loc");
  ASSERT_TRUE(l.ok());
  auto moved = StaticLocator::Parse("7 198.51.100.21 hostB\n7 203.0.113.5 hostB\n", "set");
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ((*l)->Merge(**moved), 1u);  // one replaced, one added
  EXPECT_EQ((*l)->size(), 4u);
  EXPECT_EQ((*l)->Find(7, V4("198.51.100.21")), "hostB");
  EXPECT_EQ((*l)->Find(7, V4("198.51.100.22")), "hostA");  // the /24 stays
  EXPECT_EQ((*l)->Find(8, V4("198.51.100.21")), "hostC");  // another tenant's entry stays
  EXPECT_EQ((*l)->Find(7, V4("203.0.113.5")), "hostB");
  // The same prefix written with host bits set is the same entry.
  auto same = StaticLocator::Parse("7 198.51.100.77/24 hostC\n", "set");
  ASSERT_TRUE(same.ok());
  EXPECT_EQ((*l)->Merge(**same), 1u);
  EXPECT_EQ((*l)->Find(7, V4("198.51.100.22")), "hostC");
  // Text() reads back as the same table.
  auto again = StaticLocator::Parse((*l)->Text(), "text");
  ASSERT_TRUE(again.ok()) << (*l)->Text();
  EXPECT_EQ((*again)->Text(), (*l)->Text());
  EXPECT_EQ((*again)->Find(7, V4("198.51.100.21")), "hostB");
}

TEST(StaticLocator, ClearErrorsWithLineNumbers) {
  auto bad = [](const char* text) { return StaticLocator::Parse(text, "f").status().message(); };
  EXPECT_NE(bad("7 198.51.100.1\n").find("f:1: expected TENANT"), std::string::npos);
  EXPECT_NE(bad("\n0 198.51.100.1 h\n").find("f:2: tenant"), std::string::npos);
  EXPECT_NE(bad("7 198.51.100.300 h\n").find("not an IPv4"), std::string::npos);
  EXPECT_NE(bad("7 198.51.100.0/33 h\n").find("prefix"), std::string::npos);
  EXPECT_NE(bad("7 198.51.100.1 h extra\n").find("expected"), std::string::npos);
}

}  // namespace
}  // namespace vsocket::fabric
