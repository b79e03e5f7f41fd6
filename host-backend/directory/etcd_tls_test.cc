// The directory's client over TLS to a real etcd started with
// --client-cert-auth (skipped without the etcd binary): certificates made
// by deploy/make-certs.sh (openssl) in the test's own directory.
#include <arpa/inet.h>
#include <unistd.h>

#include <cstdlib>

#include "base/clock.h"
#include "base/log.h"
#include "gtest/gtest.h"
#include "host-backend/directory/etcd_client.h"
#include "host-backend/directory/etcd_locator.h"
#include "host-backend/directory/etcd_publisher.h"
#include "host-backend/directory/etcd_rbac.h"
#include "host-backend/directory/etcd_test_env.h"

namespace vsocket::directory {
namespace {

// host-backend/directory/make-certs.sh links to deploy/make-certs.sh (BUILD).
bool MakeCerts(const std::string& args) {
  std::string script = "host-backend/directory/make-certs.sh";
  if (const char* srcdir = std::getenv("TEST_SRCDIR")) {
    const char* workspace = std::getenv("TEST_WORKSPACE");
    script = std::string(srcdir) + "/" + (workspace ? workspace : "vsocket") + "/" + script;
  }
  std::string cmd = "timeout 60 /bin/bash '" + script + "' " + args + " >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

class EtcdTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogLevel(LogLevel::kError);
    if (EtcdTestServer::Binary().empty())
      GTEST_SKIP() << "no etcd binary (apt-get install etcd-server; deploy/install-deps.sh)";
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/etcd-certs";
    // etcd's server certificate names localhost; clients' CNs are users.
    ASSERT_TRUE(MakeCerts("--san localhost '" + dir_ + "' etcd-server"));
    ASSERT_TRUE(MakeCerts("'" + dir_ + "' root hostA hostB"));
    ASSERT_TRUE(MakeCerts("--ca-name rogue-ca '" + dir_ + "' intruder"));
    etcd_.set_extra_args({"--cert-file=" + dir_ + "/etcd-server.crt", "--key-file=" + dir_ + "/etcd-server.key",
                          "--trusted-ca-file=" + dir_ + "/ca.crt", "--client-cert-auth"});
    etcd_.set_tls(Options("root"));
    Status st = etcd_.Start();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  // A client with `name`'s certificate ("" for none), trusting `ca`.
  EtcdClientOptions Options(const std::string& name, const std::string& ca = "ca") {
    EtcdClientOptions o = EtcdClientOptions::Timeouts(2000, 500, 2000);
    o.tls = true;
    o.ca_file = dir_ + "/" + ca + ".crt";
    if (!name.empty()) {
      o.cert_file = dir_ + "/" + name + ".crt";
      o.key_file = dir_ + "/" + name + ".key";
    }
    return o;
  }
  std::shared_ptr<EtcdClient> Client(const EtcdClientOptions& o) {
    return std::make_shared<EtcdClient>(std::vector<std::string>{"localhost:" + std::to_string(etcd_.port())}, o);
  }

  std::string dir_;
  EtcdTestServer etcd_;
};

TEST_F(EtcdTlsTest, WithItsCertificateAHostPublishesAndFollowsTheDirectory) {
  auto a = Client(Options("hostA"));
  ASSERT_TRUE(a->Put("/t/k", "v").ok());
  auto got = a->GetPrefix("/t/");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->kvs.at(0).value, "v");
  EtcdLocator::Options lo;
  lo.backoff_min_ms = 50;
  lo.tenants = {7};
  EtcdLocator loc(a, lo);
  loc.Start();
  ASSERT_TRUE(loc.WaitSynced(5000)) << loc.Health().last_error;
  EtcdPublisher pub(Client(Options("hostB")), "hostB", HostRecord{"192.0.2.2:7300", {"tcp"}},
                    std::map<std::string, VmRecord>{{"vm1", {7, {"198.51.100.5"}}}}, EtcdPublisher::Options{});
  pub.Start();
  ASSERT_TRUE(pub.WaitPublished(5000)) << pub.Health().last_error;
  EXPECT_TRUE(Eventually([&] { return loc.Find(7, V4("198.51.100.5")) == "hostB"; }, 2000));
  EXPECT_TRUE(loc.Health().connected);
  pub.Stop();
  EXPECT_TRUE(Eventually([&] { return loc.Find(7, V4("198.51.100.5")).empty(); }, 2000));
  loc.Stop();
}

TEST_F(EtcdTlsTest, NoCertificateAnotherCAsOrAnUntrustedServerIsRefused) {
  EXPECT_EQ(Client(Options(""))->Put("/t/k", "v").status().code(), Code::kUnavailable);
  EXPECT_EQ(Client(Options("intruder"))->Put("/t/k", "v").status().code(), Code::kUnavailable);
  // This host trusts another CA than the one that signed etcd's certificate.
  EXPECT_EQ(Client(Options("hostA", "rogue-ca"))->Put("/t/k", "v").status().code(), Code::kUnavailable);
  // Plain HTTP to a TLS port.
  EtcdClientOptions plain = Options("hostA");
  plain.tls = false;
  EXPECT_FALSE(Client(plain)->Put("/t/k", "v").ok());
  EXPECT_TRUE(Client(Options("hostA"))->GetPrefix("/t/")->kvs.empty());
}

// etcd's gateway cannot take the user from a certificate's CN: with auth on
// it refuses certificates that have one. A host then has a certificate
// without a CN (who may connect at all) and its user and password (what it
// may write).
TEST_F(EtcdTlsTest, WithAuthOnAHostIsItsUserOverACertificateWithoutCommonName) {
  std::string cmd = "cd '" + dir_ + "' && printf 'extendedKeyUsage=clientAuth\\n' > nocn.ext && " +
                    "timeout 30 openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout nocn.key "
                    "-subj /O=vsocket -out nocn.csr && timeout 30 openssl x509 -req -in nocn.csr -CA ca.crt "
                    "-CAkey ca.key -CAcreateserial -days 2 -extfile nocn.ext -out nocn.crt";
  ASSERT_EQ(std::system(("(" + cmd + ") >/dev/null 2>&1").c_str()), 0) << cmd;
  auto as = [&](const std::string& cert, const std::string& user, const std::string& password) {
    EtcdClientOptions o = Options(cert);
    o.user = user;
    o.password = password;
    return Client(o);
  };
  Status st = EnableAuth(*as("nocn", "", ""), "rootpw");
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto root = as("nocn", "root", "rootpw");
  for (const char* host : {"hostA", "hostB"}) {
    st = GrantHost(*root, kDefaultPrefix, host, std::string(host) + "-pw");
    ASSERT_TRUE(st.ok()) << st.ToString();
    st = GrantTenant(*root, kDefaultTenantPrefix, host, 7);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  auto a = as("nocn", "hostA", "hostA-pw");
  auto own = a->Put(HostKey(kDefaultPrefix, "hostA"), "{}");
  EXPECT_TRUE(own.ok()) << own.status().ToString();
  EXPECT_EQ(a->Put(HostKey(kDefaultPrefix, "hostB"), "{}").status().code(), Code::kPermissionDenied);
  EXPECT_EQ(a->Put(VmKey(kDefaultTenantPrefix, 7, "hostB", "vm1"), "{}").status().code(), Code::kPermissionDenied);
  EXPECT_TRUE(a->Put(VmKey(kDefaultTenantPrefix, 7, "hostA", "vm1"), "{}").ok());
  EXPECT_TRUE(a->GetPrefix(kDefaultPrefix).ok());
  // A certificate naming hostA does not make its holder hostA: refused.
  auto cn = as("hostA", "hostA", "hostA-pw")->Put(HostKey(kDefaultPrefix, "hostA"), "{}");
  EXPECT_EQ(cn.status().code(), Code::kPermissionDenied);
  EXPECT_NE(cn.status().message().find("CommonName"), std::string::npos) << cn.status().ToString();
}

}  // namespace
}  // namespace vsocket::directory
