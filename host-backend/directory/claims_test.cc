#include "host-backend/directory/claims.h"

#include "gtest/gtest.h"

namespace vsocket::directory {
namespace {

std::vector<bool> Of(const std::vector<Claim>& c) { return Contested(c); }

TEST(Contested, DisjointClaimsOfTwoHostsStand) {
  EXPECT_EQ(Of({{7, "198.51.100.1", "a"}, {7, "198.51.100.2", "b"}, {7, "203.0.113.0/24", "a"}}),
            (std::vector<bool>{false, false, false}));
}

TEST(Contested, TheSameAddressFromTwoHostsIsContestedBothWays) {
  EXPECT_EQ(Of({{7, "198.51.100.1", "a"}, {7, "198.51.100.1", "b"}}), (std::vector<bool>{true, true}));
}

TEST(Contested, AnAddressInsideAnotherHostsRangeContestsBoth) {
  // A /32 inside a /28 and a /26 around it: each overlaps hostA's.
  EXPECT_EQ(Of({{7, "198.51.100.0/28", "a"}, {7, "198.51.100.9", "b"}, {7, "198.51.100.0/26", "c"},
                {7, "198.51.100.200", "b"}}),
            (std::vector<bool>{true, true, true, false}));
}

TEST(Contested, NestedClaimsOfOneHostAndOtherTenantsAreFine) {
  EXPECT_EQ(Of({{7, "198.51.100.0/24", "a"}, {7, "198.51.100.9", "a"}, {8, "198.51.100.9", "b"},
                {7, "2001:db8::1", "a"}, {7, "2001:db8::/64", "a"}, {8, "2001:db8::1", "c"}}),
            (std::vector<bool>{false, false, false, false, false, false}));
}

TEST(Contested, AnIpv6AddressInAnotherHostsPrefixIsContested) {
  EXPECT_EQ(Of({{7, "2001:db8::/64", "a"}, {7, "2001:db8::5", "b"}, {7, "2001:db8:1::5", "b"}}),
            (std::vector<bool>{true, true, false}));
}

TEST(Contested, AClaimClosedBeforeTheNextDoesNotHideAnEnclosingOne) {
  // a's /24 encloses b's /28 (closed at .15) and c's .20 after it.
  EXPECT_EQ(Of({{7, "198.51.100.0/24", "a"}, {7, "198.51.100.0/28", "a"}, {7, "198.51.100.20", "c"}}),
            (std::vector<bool>{true, false, true}));
}

TEST(Contested, UnparsableClaimsAreLeftToTheParser) {
  EXPECT_EQ(Of({{7, "nope", "a"}, {7, "nope", "b"}, {7, "198.51.100.1/33", "b"}}),
            (std::vector<bool>{false, false, false}));
}

}  // namespace
}  // namespace vsocket::directory
