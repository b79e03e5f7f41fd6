#include "base/log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

namespace vsocket {
namespace {

// Runs fn with stderr sent to a temporary file; returns what it wrote.
template <typename Fn>
std::string CaptureStderr(Fn fn) {
  std::fflush(stderr);
  FILE* tmp = std::tmpfile();
  int saved = dup(2);
  dup2(fileno(tmp), 2);
  fn();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::string out;
  std::rewind(tmp);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), tmp)) > 0) out.append(buf, n);
  std::fclose(tmp);
  return out;
}

size_t Count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

void Flood(int n) {
  for (int i = 0; i < n; ++i) VS_LOG(kWarn, "flood %d", i);
}

// A call site in a loop (a hostile guest making vsocketd warn per request)
// prints a burst a second, and says how many it dropped.
TEST(Log, OneSitePrintsABurstASecondAndCountsTheRest) {
  std::string first = CaptureStderr([] { Flood(1000); });
  EXPECT_EQ(Count(first, "flood "), kLogBurst);
  EXPECT_EQ(Count(first, "dropped"), 0u);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  std::string next = CaptureStderr([] { Flood(1); });
  EXPECT_EQ(Count(next, "flood 0"), 1u);
  EXPECT_NE(next.find("(980 more lines like the next were dropped)"), std::string::npos) << next;
}

// Another site is not silenced by the first one's flood.
TEST(Log, SitesAreLimitedSeparately) {
  std::string out = CaptureStderr([] {
    Flood(100);
    VS_LOG(kWarn, "another site");
  });
  EXPECT_EQ(Count(out, "another site"), 1u);
}

}  // namespace
}  // namespace vsocket
