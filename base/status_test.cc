#include "base/status.h"

#include <gtest/gtest.h>

namespace vsocket {
namespace {

TEST(StatusTest, OkHasNoErrno) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.sys_errno(), 0);
}

TEST(StatusTest, FromErrnoKeepsErrnoAndMapsCode) {
  Status s = Status::FromErrno("connect", ECONNREFUSED);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kUnavailable);
  EXPECT_EQ(s.sys_errno(), ECONNREFUSED);
  EXPECT_NE(s.message().find("connect"), std::string::npos);
}

TEST(StatusTest, CodeWithoutErrnoMapsToPlausibleErrno) {
  EXPECT_EQ(Status(Code::kDataLoss, "x").sys_errno(), EPROTO);
  EXPECT_EQ(Status(Code::kResourceExhausted, "x").sys_errno(), EAGAIN);
}

Status Fails() { return Status(Code::kOutOfRange, "bad"); }
Status Propagates() {
  VS_RETURN_IF_ERROR(Fails());
  return Status::Ok();
}

TEST(StatusTest, ReturnIfErrorPropagates) { EXPECT_EQ(Propagates().code(), Code::kOutOfRange); }

TEST(ResultTest, HoldsValueOrStatus) {
  Result<int> a = 5;
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, 5);
  Result<int> b = Status(Code::kNotFound, "none");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kNotFound);
}

}  // namespace
}  // namespace vsocket
