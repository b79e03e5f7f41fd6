// EtcdClient against a real etcd (skipped without the etcd binary).
#include "host-backend/directory/etcd_client.h"

#include <atomic>
#include <thread>

#include "base/clock.h"
#include "gtest/gtest.h"
#include "host-backend/directory/etcd_test_env.h"

namespace vsocket::directory {
namespace {

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdTestServer::Binary().empty())
      GTEST_SKIP() << "no etcd binary (apt-get install etcd-server; deploy/install-deps.sh)";
    Status st = etcd_.Start();
    ASSERT_TRUE(st.ok()) << st.ToString();
    client_ = std::make_unique<EtcdClient>(std::vector<std::string>{etcd_.endpoint()});
  }
  EtcdTestServer etcd_;
  std::unique_ptr<EtcdClient> client_;
};

TEST(EtcdClientPrefix, PrefixEndIncrementsTheLastByte) {
  EXPECT_EQ(PrefixEnd("/a/"), "/a0");
  EXPECT_EQ(PrefixEnd("ab\xff"), "ac");
}

TEST_F(EtcdClientTest, PutThenGetPrefixReturnsOnlyThePrefixWithRevision) {
  auto r1 = client_->Put("/t/a", "1");
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  ASSERT_TRUE(client_->Put("/t/b", std::string("bin\0ary", 7)).ok());
  ASSERT_TRUE(client_->Put("/u/c", "other").ok());
  auto range = client_->GetPrefix("/t/");
  ASSERT_TRUE(range.ok()) << range.status().ToString();
  ASSERT_EQ(range->kvs.size(), 2u);
  EXPECT_EQ(range->kvs[0].key, "/t/a");
  EXPECT_EQ(range->kvs[0].value, "1");
  EXPECT_EQ(range->kvs[0].mod_revision, *r1);
  EXPECT_EQ(range->kvs[1].value, std::string("bin\0ary", 7));
  EXPECT_GE(range->revision, *r1 + 2);
  auto deleted = client_->DeletePrefix("/t/");
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 2);
  EXPECT_TRUE(client_->GetPrefix("/t/")->kvs.empty());
}

TEST_F(EtcdClientTest, APagedReadReturnsEveryKeyInOrderAtOneRevision) {
  EtcdClientOptions o;
  o.range_page_keys = 2;
  EtcdClient paged({etcd_.endpoint()}, o);
  std::vector<std::pair<std::string, std::string>> kvs;
  for (const char* k : {"/p/a", "/p/b", "/p/b\x01", "/p/c", "/p/d"}) kvs.emplace_back(k, std::string("v") + k);
  auto rev = paged.PutAll(kvs, 0);
  ASSERT_TRUE(rev.ok()) << rev.status().ToString();
  ASSERT_TRUE(paged.Put("/p0", "outside").ok());
  auto range = paged.GetPrefix("/p/");
  ASSERT_TRUE(range.ok()) << range.status().ToString();
  ASSERT_EQ(range->kvs.size(), 5u);
  for (size_t i = 0; i < kvs.size(); ++i) {
    EXPECT_EQ(range->kvs[i].key, kvs[i].first);
    EXPECT_EQ(range->kvs[i].value, kvs[i].second);
    EXPECT_EQ(range->kvs[i].mod_revision, *rev);  // (one transaction)
  }
  EXPECT_EQ(range->revision, *rev + 1);
}

TEST_F(EtcdClientTest, PutAllSplitsIntoTransactionsAndDeleteTakesOneKeyAlone) {
  std::vector<std::pair<std::string, std::string>> kvs;
  for (int i = 0; i < 250; ++i) kvs.emplace_back("/many/vm" + std::to_string(i), "x");
  auto lease = client_->GrantLease(60);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(client_->PutAll(kvs, *lease).ok());
  auto range = client_->GetPrefix("/many/");
  ASSERT_TRUE(range.ok());
  EXPECT_EQ(range->kvs.size(), 250u);
  EXPECT_EQ(range->kvs[0].lease, *lease);
  auto deleted = client_->Delete("/many/vm1");  // not vm10..vm19, vm100..
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 1);
  EXPECT_EQ(client_->GetPrefix("/many/")->kvs.size(), 249u);
  EXPECT_EQ(client_->Delete("/many/vm1").value(), 0);
}

TEST_F(EtcdClientTest, KeyOfAnUnrenewedShortLeaseDisappearsAtExpiry) {
  auto lease = client_->GrantLease(2);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_TRUE(client_->Put("/lease/k", "v", *lease).ok());
  auto kept = client_->KeepAlive(*lease);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_GE(*kept, 2);
  EXPECT_EQ(client_->GetPrefix("/lease/")->kvs.size(), 1u);
  EXPECT_EQ(client_->GetPrefix("/lease/")->kvs[0].lease, *lease);
  bool gone = false;
  for (int64_t deadline = MonotonicMs() + 10000; !gone && MonotonicMs() < deadline; usleep(100 * 1000))
    gone = client_->GetPrefix("/lease/")->kvs.empty();
  EXPECT_TRUE(gone) << "the key outlived its 2 s lease by 10 s";
  EXPECT_EQ(client_->KeepAlive(*lease).status().code(), Code::kNotFound);
}

TEST_F(EtcdClientTest, RevokeDeletesTheLeasesKeysAtOnce) {
  auto lease = client_->GrantLease(60);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(client_->Put("/rev/k", "v", *lease).ok());
  ASSERT_TRUE(client_->Revoke(*lease).ok());
  EXPECT_TRUE(client_->GetPrefix("/rev/")->kvs.empty());
}

TEST_F(EtcdClientTest, WatchDeliversAPutAndADeleteWithinASecond) {
  std::atomic<bool> stop{false};
  std::atomic<int64_t> put_at{0}, put_seen{0}, delete_seen{0};
  std::atomic<bool> created{false};
  Status result;
  std::thread watcher([&] {
    result = client_->Watch(
        "/w/", 0,
        [&](int64_t, const std::vector<EtcdEvent>& events) {
          created = true;
          for (const EtcdEvent& e : events) {
            if (e.type == EtcdEvent::Type::kPut && e.kv.key == "/w/x" && e.kv.value == "1") put_seen = MonotonicMs();
            if (e.type == EtcdEvent::Type::kDelete && e.kv.key == "/w/x") delete_seen = MonotonicMs();
          }
          return delete_seen == 0;
        },
        &stop, nullptr);
  });
  for (int64_t deadline = MonotonicMs() + 5000; !created && MonotonicMs() < deadline;) usleep(10 * 1000);
  ASSERT_TRUE(created);
  ASSERT_TRUE(client_->Put("/w/other-prefix-not", "no").ok());
  put_at = MonotonicMs();
  ASSERT_TRUE(client_->Put("/w/x", "1").ok());
  ASSERT_TRUE(client_->DeletePrefix("/w/x").ok());
  for (int64_t deadline = MonotonicMs() + 5000; delete_seen == 0 && MonotonicMs() < deadline;) usleep(10 * 1000);
  stop = true;
  watcher.join();
  EXPECT_TRUE(result.ok()) << result.ToString();
  ASSERT_NE(put_seen, 0);
  ASSERT_NE(delete_seen, 0);
  EXPECT_LT(put_seen - put_at, 1000);
  EXPECT_LT(delete_seen - put_at, 1000);
}

TEST_F(EtcdClientTest, WatchFromACompactedRevisionSaysOutOfRange) {
  auto r1 = client_->Put("/c/a", "1");
  ASSERT_TRUE(r1.ok());
  auto r2 = client_->Put("/c/a", "2");
  ASSERT_TRUE(r2.ok());
  ASSERT_TRUE(client_->Compact(*r2).ok());
  int64_t compacted = 0;
  Status st = client_->Watch(
      "/c/", *r1, [](int64_t, const std::vector<EtcdEvent>&) { return true; }, nullptr, &compacted);
  EXPECT_EQ(st.code(), Code::kOutOfRange) << st.ToString();
  EXPECT_EQ(compacted, *r2);
}

TEST_F(EtcdClientTest, UnreachableEtcdIsUnavailableWithinTheTimeout) {
  etcd_.Kill();
  int64_t t0 = MonotonicMs();
  auto r = client_->GetPrefix("/x");
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_LT(MonotonicMs() - t0, 3000);
  std::atomic<bool> stop{false};
  EXPECT_EQ(client_
                ->Watch(
                    "/x", 0, [](int64_t, const std::vector<EtcdEvent>&) { return true; }, &stop, nullptr)
                .code(),
            Code::kUnavailable);
}

}  // namespace
}  // namespace vsocket::directory
