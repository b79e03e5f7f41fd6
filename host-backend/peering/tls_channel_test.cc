// TlsChannel over real loopback TCP, both ends driven by one poll loop in
// this thread. Certificates come from deploy/make-certs.sh: hosts "alpha" and
// "beta" under the test CA, and an "alpha"/"beta" pair of the same names
// under an unrelated CA ("rogue").
#include "host-backend/peering/tls_channel.h"

#include <gtest/gtest.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "base/log.h"
#include "host-backend/peering/tls_test_util.h"

namespace vsocket::peering {
namespace {

using testing::Checksum;
using testing::ConnectedPair;
using testing::HandshakeParty;
using testing::Party;
using testing::RawTlsClient;
using testing::RunUntilDone;
using Progress = TlsChannel::Progress;
using Messages = std::vector<std::vector<uint8_t>>;

// An error message check that prints the whole message when it fails.
::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

std::vector<uint8_t> RandomBytes(std::mt19937& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// One direction of traffic plus the receiving half of the other: sends
// `to_send` (retrying when the queue is full), collects what arrives, and
// finishes once everything left and `expect` messages arrived, or on error.
struct Flow {
  explicit Flow(TlsChannel* channel, Messages send = {}) : ch(channel), to_send(std::move(send)) {}

  TlsChannel* ch;
  Messages to_send;
  size_t expect = 0;
  size_t next = 0;
  Messages received;
  Status error;

  Party party() {
    return Party{ch->fd(), [this]() -> short {
                   while (next < to_send.size()) {
                     Status s = ch->Send(to_send[next]);
                     if (s.code() == Code::kResourceExhausted) break;
                     if (!s.ok()) return Stop(s);
                     ++next;
                   }
                   // The event-loop contract: on any readiness, Receive then Flush.
                   if (Status s = ch->Receive(&received); !s.ok()) return Stop(s);
                   if (Status s = ch->Flush(); !s.ok()) return Stop(s);
                   if (next == to_send.size() && !ch->WantsWrite() && received.size() >= expect) return 0;
                   return POLLIN | (ch->WantsWrite() ? POLLOUT : 0);
                 }};
  }
  short Stop(Status s) {
    error = std::move(s);
    return 0;
  }
};

// Receives until the channel reports an error (kept in *error).
Party ReceiveUntilError(TlsChannel& ch, Messages* got, Status* error) {
  return Party{ch.fd(), [&ch, got, error]() -> short {
                 *error = ch.Receive(got);
                 return error->ok() ? POLLIN : 0;
               }};
}

class TlsChannelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // VSOCKET_LOG_LEVEL=debug shows every channel failure as it latches.
    LogLevel level;
    if (const char* env = std::getenv("VSOCKET_LOG_LEVEL"); env && ParseLogLevel(env, &level)) {
      SetLogLevel(level);
    }
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = std::string(tmp ? tmp : "/tmp") + "/certs";
    Status s = testing::RunMakeCerts({dir_, "alpha", "beta"});
    ASSERT_TRUE(s.ok()) << s.ToString();
    s = testing::RunMakeCerts({"--ca-name", "rogue-ca", dir_ + "/rogue", "alpha", "beta"});
    ASSERT_TRUE(s.ok()) << s.ToString();
    // CN and subjectAltName apart: CN=alpha-alias naming DNS:alpha, and
    // CN=beta-alias naming DNS:gamma.
    s = testing::RunMakeCerts({"--san", "alpha", dir_, "alpha-alias"});
    ASSERT_TRUE(s.ok()) << s.ToString();
    s = testing::RunMakeCerts({"--san", "gamma", dir_, "beta-alias"});
    ASSERT_TRUE(s.ok()) << s.ToString();
    // Extended key usage: none, or only one of the two a peer host needs.
    s = testing::RunMakeCerts({"--eku", "none", dir_, "no-usage"});
    ASSERT_TRUE(s.ok()) << s.ToString();
    s = testing::RunMakeCerts({"--eku", "serverAuth", dir_, "server-only"});
    ASSERT_TRUE(s.ok()) << s.ToString();
    // Revocation, under a CA of its own (DIR/crl): c1, c2, c3; CRLs that
    // revoke nothing, c3, and c2 + c3; and one from another CA.
    const std::string crl = dir_ + "/crl";
    s = testing::RunMakeCerts({"--ca-name", "crl-ca", crl, "c1", "c2", "c3"});
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (auto [revoke, name] : {std::pair{"", "none"}, {"c3", "c3"}, {"c2", "c2-c3"}}) {
      std::vector<std::string> args{"--crl", "--ca-name", "crl-ca", crl};
      if (*revoke != '\0') args.push_back(revoke);
      s = testing::RunMakeCerts(args);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_EQ(std::rename((crl + "/crl-ca.crl").c_str(), (crl + "/revoked-" + name + ".crl").c_str()), 0);
    }
    s = testing::RunMakeCerts({"--crl", "--ca-name", "rogue-ca", dir_ + "/rogue"});
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  // A host of the CRL tests' CA, with the CRL `revoked` ("none", "c3",
  // "c2-c3"; empty: no CRL).
  static TlsConfig CrlConfig(const std::string& host, const std::string& revoked) {
    const std::string base = dir_ + "/crl/";
    return TlsConfig{base + host + ".crt", base + host + ".key", base + "crl-ca.crt",
                     revoked.empty() ? "" : base + "revoked-" + revoked + ".crl"};
  }
  static std::unique_ptr<TlsContext> CrlContext(const std::string& host, const std::string& revoked) {
    auto ctx = TlsContext::Create(CrlConfig(host, revoked));
    EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
    return ctx.ok() ? std::move(ctx).value() : nullptr;
  }

  // `host`'s certificate and key, from the test CA or the rogue one; every
  // context trusts the test CA, so a rogue end still accepts an honest peer
  // and only the honest end's verdict is under test.
  static TlsConfig Config(const std::string& host, bool rogue = false) {
    const std::string base = rogue ? dir_ + "/rogue/" : dir_ + "/";
    return TlsConfig{base + host + ".crt", base + host + ".key", dir_ + "/ca.crt", ""};
  }

  static std::unique_ptr<TlsContext> Context(const std::string& host, bool rogue = false) {
    auto ctx = TlsContext::Create(Config(host, rogue));
    EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
    return ctx.ok() ? std::move(ctx).value() : nullptr;
  }

  struct Channels {
    std::unique_ptr<TlsChannel> client;
    std::unique_ptr<TlsChannel> server;
    Progress client_progress = Progress::kWantWrite;
    Progress server_progress = Progress::kWantRead;
  };

  // Connects client_ctx to server_ctx over loopback and runs both handshakes
  // to their end.
  static Channels Handshake(TlsContext& client_ctx, TlsContext& server_ctx, const std::string& expected_peer) {
    Channels c;
    auto pair = ConnectedPair();
    EXPECT_TRUE(pair.ok()) << pair.status().ToString();
    if (!pair.ok()) return c;
    c.client = TlsChannel::Client(client_ctx, std::move(pair->client), expected_peer);
    c.server = TlsChannel::Server(server_ctx, std::move(pair->server));
    EXPECT_TRUE(
        RunUntilDone({HandshakeParty(*c.client, &c.client_progress), HandshakeParty(*c.server, &c.server_progress)}))
        << "handshake did not finish in time";
    return c;
  }

  static Channels Established() {
    Channels c = Handshake(*alpha_, *beta_, "beta");
    EXPECT_EQ(c.client_progress, Progress::kDone) << c.client->error().ToString();
    EXPECT_EQ(c.server_progress, Progress::kDone) << c.server->error().ToString();
    return c;
  }

  void SetUp() override {
    alpha_ = Context("alpha");
    beta_ = Context("beta");
    ASSERT_TRUE(alpha_ && beta_);
  }
  void TearDown() override {
    alpha_.reset();
    beta_.reset();
  }

  static std::string dir_;
  static std::unique_ptr<TlsContext> alpha_;
  static std::unique_ptr<TlsContext> beta_;
};

std::string TlsChannelTest::dir_;
std::unique_ptr<TlsContext> TlsChannelTest::alpha_;
std::unique_ptr<TlsContext> TlsChannelTest::beta_;

// --- Context setup ---------------------------------------------------------

TEST_F(TlsChannelTest, ContextKnowsItsOwnName) {
  EXPECT_EQ(alpha_->own_name(), "alpha");
  EXPECT_EQ(beta_->own_name(), "beta");
}

TEST_F(TlsChannelTest, ContextReportsUnreadableFile) {
  TlsConfig config = Config("alpha");
  config.cert_file = dir_ + "/missing.crt";
  auto ctx = TlsContext::Create(config);
  ASSERT_FALSE(ctx.ok());
  EXPECT_TRUE(Contains(ctx.status().message(), "cannot read certificate file"));
  EXPECT_TRUE(Contains(ctx.status().message(), "No such file or directory"));
}

TEST_F(TlsChannelTest, ContextReportsKeyNotMatchingCertificate) {
  TlsConfig config = Config("alpha");
  config.key_file = Config("beta").key_file;
  auto ctx = TlsContext::Create(config);
  ASSERT_FALSE(ctx.ok());
  EXPECT_TRUE(Contains(ctx.status().message(), "does not match certificate"));
}

// Issue 17, finding 8: a key other users can read is refused, with the mode
// and the fix in the message; the daemon's group may read it.
TEST_F(TlsChannelTest, ContextRefusesAPrivateKeyOthersCanRead) {
  const std::string key = dir_ + "/copied.key";
  std::ifstream in(Config("alpha").key_file);
  std::ofstream(key) << in.rdbuf();
  TlsConfig config = Config("alpha");
  config.key_file = key;
  ASSERT_EQ(chmod(key.c_str(), 0644), 0);
  auto ctx = TlsContext::Create(config);
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(ctx.status().code(), Code::kPermissionDenied);
  EXPECT_TRUE(Contains(ctx.status().message(), "accessible to other users (mode 0644)")) << ctx.status().message();
  ASSERT_EQ(chmod(key.c_str(), 0602), 0);
  EXPECT_FALSE(TlsContext::Create(config).ok());
  ASSERT_EQ(chmod(key.c_str(), 0640), 0);
  EXPECT_TRUE(TlsContext::Create(config).ok());
}

TEST_F(TlsChannelTest, ContextReportsFilesThatAreNotPem) {
  const std::string junk = dir_ + "/junk.pem";
  std::ofstream(junk) << "not a certificate\n";
  TlsConfig config = Config("alpha");
  config.cert_file = junk;
  auto ctx = TlsContext::Create(config);
  ASSERT_FALSE(ctx.ok());
  EXPECT_TRUE(Contains(ctx.status().message(), "holds no usable PEM certificate"));

  config = Config("alpha");
  config.key_file = junk;
  ASSERT_EQ(chmod(junk.c_str(), 0600), 0);  // (a key others can read is refused before it is read)
  ctx = TlsContext::Create(config);
  ASSERT_FALSE(ctx.ok());
  EXPECT_TRUE(Contains(ctx.status().message(), "holds no unencrypted PEM private key"));

  config = Config("alpha");
  config.ca_file = junk;
  ctx = TlsContext::Create(config);
  ASSERT_FALSE(ctx.ok());
  EXPECT_TRUE(Contains(ctx.status().message(), "CA file"));
}

// --- Handshake -------------------------------------------------------------

TEST_F(TlsChannelTest, MutualHandshakeVerifiesBothNames) {
  Channels c = Established();
  EXPECT_EQ(c.client->peer_name(), "beta");
  EXPECT_EQ(c.server->peer_name(), "alpha");
  EXPECT_TRUE(c.client->error().ok());
  EXPECT_TRUE(c.server->error().ok());
  EXPECT_FALSE(c.client->WantsWrite());
}

// One identity rule on both sides (RFC 6125): a certificate names its DNS
// subjectAltNames, its CN only when it has none.
TEST_F(TlsChannelTest, ServerIdentifiesClientByTheClientsRule) {
  Channels plain = Established();
  EXPECT_TRUE(plain.server->PeerIs("alpha"));
  EXPECT_FALSE(plain.server->PeerIs("beta"));
  EXPECT_EQ(plain.server->PeerNames(), "DNS:alpha");
  auto alias = Context("alpha-alias");
  ASSERT_TRUE(alias);
  Channels c = Handshake(*alias, *beta_, "beta");
  ASSERT_EQ(c.client_progress, Progress::kDone) << c.client->error().ToString();
  ASSERT_EQ(c.server_progress, Progress::kDone) << c.server->error().ToString();
  EXPECT_TRUE(c.server->PeerIs("alpha"));
  EXPECT_FALSE(c.server->PeerIs("alpha-alias")) << "the CN counts only without DNS names";
  EXPECT_EQ(c.server->PeerNames(), "DNS:alpha");
}

TEST_F(TlsChannelTest, ClientIgnoresTheCnOfACertificateWithNames) {
  auto alias = Context("beta-alias");
  ASSERT_TRUE(alias);
  Channels by_cn = Handshake(*alpha_, *alias, "beta-alias");
  EXPECT_EQ(by_cn.client_progress, Progress::kFailed);
  EXPECT_EQ(by_cn.client->error().code(), Code::kPermissionDenied);
  Channels by_san = Handshake(*alpha_, *alias, "gamma");
  EXPECT_EQ(by_san.client_progress, Progress::kDone) << by_san.client->error().ToString();
  EXPECT_EQ(by_san.server_progress, Progress::kDone) << by_san.server->error().ToString();
}

TEST_F(TlsChannelTest, ServerRefusesClientWithoutCertificate) {
  auto pair = ConnectedPair();
  ASSERT_TRUE(pair.ok());
  auto raw = RawTlsClient::Create(std::move(pair->client), "", "");
  ASSERT_TRUE(raw);
  auto server = TlsChannel::Server(*beta_, std::move(pair->server));
  Progress server_progress{};
  ASSERT_TRUE(
      RunUntilDone({Party{raw->fd(), [&] { return raw->Handshake(); }}, HandshakeParty(*server, &server_progress)}));
  EXPECT_EQ(server_progress, Progress::kFailed);
  EXPECT_EQ(server->error().code(), Code::kPermissionDenied);
  EXPECT_TRUE(Contains(server->error().message(), "peer presented no certificate"));
  // The client learns why from the server's alert.
  std::string client_error;
  ASSERT_TRUE(RunUntilDone({Party{raw->fd(), [&]() -> short {
                                    client_error = raw->ReadError();
                                    return client_error.empty() ? POLLIN : 0;
                                  }}}));
  EXPECT_TRUE(Contains(client_error, "certificate required"));
}

// Issue 17, finding 8: a peer host both dials and accepts, so its
// certificate must carry both extended key usages; OpenSSL alone took one
// without the extension at all. Our own is checked at start.
TEST_F(TlsChannelTest, ContextRefusesACertificateWithoutBothKeyUsages) {
  auto none = TlsContext::Create(Config("no-usage"));
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(Contains(none.status().message(), "has no extended key usage")) << none.status().message();
  auto one = TlsContext::Create(Config("server-only"));
  ASSERT_FALSE(one.ok());
  EXPECT_TRUE(Contains(one.status().message(), "lacks extended key usage clientAuth")) << one.status().message();
}

TEST_F(TlsChannelTest, ServerRefusesAClientCertificateWithoutBothKeyUsages) {
  for (const char* host : {"no-usage", "server-only"}) {
    auto pair = ConnectedPair();
    ASSERT_TRUE(pair.ok());
    auto raw = RawTlsClient::Create(std::move(pair->client), dir_ + "/" + host + ".crt", dir_ + "/" + host + ".key");
    ASSERT_TRUE(raw);
    auto server = TlsChannel::Server(*beta_, std::move(pair->server));
    Progress server_progress{};
    ASSERT_TRUE(
        RunUntilDone({Party{raw->fd(), [&] { return raw->Handshake(); }}, HandshakeParty(*server, &server_progress)}));
    EXPECT_EQ(server_progress, Progress::kFailed) << host;
    EXPECT_EQ(server->error().code(), Code::kPermissionDenied) << host;
    EXPECT_TRUE(Contains(server->error().message(), "extended key usage")) << host << ": " << server->error().message();
  }
}

TEST_F(TlsChannelTest, ContextRefusesACrlFileWithoutACrlOfItsCa) {
  TlsConfig config = CrlConfig("c1", "none");
  config.crl_file = dir_ + "/rogue/rogue-ca.crl";
  auto ctx = TlsContext::Create(config);
  ASSERT_FALSE(ctx.ok());
  EXPECT_TRUE(Contains(ctx.status().message(), "not signed by a CA of tls_ca")) << ctx.status().message();
  config.crl_file = dir_ + "/crl/c1.crt";  // PEM, but not a CRL
  ctx = TlsContext::Create(config);
  ASSERT_FALSE(ctx.ok());
  EXPECT_TRUE(Contains(ctx.status().message(), "holds no PEM CRL")) << ctx.status().message();
  config.crl_file = dir_ + "/crl/missing.crl";
  ctx = TlsContext::Create(config);
  ASSERT_FALSE(ctx.ok());
  EXPECT_TRUE(Contains(ctx.status().message(), "cannot read CRL file")) << ctx.status().message();
  auto good = CrlContext("c1", "c2-c3");
  ASSERT_TRUE(good);
  EXPECT_EQ(good->revoked(), 2u);
  EXPECT_TRUE(good->crl_warning().empty());
}

// A revoked certificate is refused on both sides; one the CRL does not
// list still passes.
TEST_F(TlsChannelTest, RevokedCertificatesAreRefusedOnBothSides) {
  auto server = CrlContext("c1", "c3");
  auto revoked = CrlContext("c3", "none");
  auto good = CrlContext("c2", "c3");
  ASSERT_TRUE(server && revoked && good);
  Channels c = Handshake(*revoked, *server, "c1");
  EXPECT_EQ(c.server_progress, Progress::kFailed);
  EXPECT_EQ(c.server->error().code(), Code::kPermissionDenied);
  EXPECT_TRUE(Contains(c.server->error().message(), "'c3' is revoked")) << c.server->error().message();
  // The client side: c2 trusts c3's CRL and dials c3.
  Channels d = Handshake(*good, *revoked, "c3");
  EXPECT_EQ(d.client_progress, Progress::kFailed);
  EXPECT_TRUE(Contains(d.client->error().message(), "'c3' is revoked")) << d.client->error().message();
  Channels e = Handshake(*good, *server, "c1");
  EXPECT_EQ(e.client_progress, Progress::kDone);
  EXPECT_EQ(e.server_progress, Progress::kDone);
}

// A link set up before a CRL listed its peer: verifying the peer again
// against a context with the new CRL says so (vsocketd cuts that link).
TEST_F(TlsChannelTest, ReverifyFollowsANewCrl) {
  auto c1 = CrlContext("c1", "none");
  auto c2 = CrlContext("c2", "none");
  ASSERT_TRUE(c1 && c2);
  Channels c = Handshake(*c1, *c2, "c2");
  ASSERT_EQ(c.client_progress, Progress::kDone);
  ASSERT_EQ(c.server_progress, Progress::kDone);
  auto same = CrlContext("c1", "c3");
  auto newer = CrlContext("c1", "c2-c3");
  ASSERT_TRUE(same && newer);
  EXPECT_TRUE(c.client->Reverify(*same).ok()) << c.client->Reverify(*same).ToString();
  Status st = c.client->Reverify(*newer);
  EXPECT_EQ(st.code(), Code::kPermissionDenied);
  EXPECT_TRUE(Contains(st.message(), "'c2' is revoked")) << st.ToString();
  // The server side verifies its client (c1) the same way.
  auto c2_new = CrlContext("c2", "c2-c3");
  ASSERT_TRUE(c2_new);
  EXPECT_TRUE(c.server->Reverify(*c2_new).ok()) << c.server->Reverify(*c2_new).ToString();
}

TEST_F(TlsChannelTest, ServerRefusesClientCertificateFromAnotherCa) {
  auto rogue_alpha = Context("alpha", /*rogue=*/true);
  Channels c = Handshake(*rogue_alpha, *beta_, "beta");
  EXPECT_EQ(c.server_progress, Progress::kFailed);
  EXPECT_EQ(c.server->error().code(), Code::kPermissionDenied);
  EXPECT_TRUE(Contains(c.server->error().message(), "peer certificate not signed by our CA"));
  EXPECT_TRUE(Contains(c.server->error().message(), "'alpha'"));
  EXPECT_TRUE(c.server->peer_name().empty());
  // TLS 1.3: the client finished before the server judged its certificate
  // and hears about it on its next read.
  ASSERT_EQ(c.client_progress, Progress::kDone);
  Messages got;
  Status error;
  ASSERT_TRUE(RunUntilDone({ReceiveUntilError(*c.client, &got, &error)}));
  EXPECT_EQ(error.code(), Code::kPermissionDenied);
  EXPECT_TRUE(Contains(error.message(), "peer rejected our certificate (unknown CA)"));
  EXPECT_TRUE(got.empty());
}

TEST_F(TlsChannelTest, ClientRefusesServerWithOtherName) {
  Channels c = Handshake(*alpha_, *beta_, "gamma");
  EXPECT_EQ(c.client_progress, Progress::kFailed);
  EXPECT_EQ(c.client->error().code(), Code::kPermissionDenied);
  EXPECT_TRUE(Contains(c.client->error().message(), "peer name beta, expected gamma"));
  EXPECT_EQ(c.server_progress, Progress::kFailed);
  EXPECT_TRUE(Contains(c.server->error().message(), "peer rejected our certificate"));
}

TEST_F(TlsChannelTest, ClientRefusesServerCertificateFromAnotherCa) {
  auto rogue_beta = Context("beta", /*rogue=*/true);
  Channels c = Handshake(*alpha_, *rogue_beta, "beta");
  EXPECT_EQ(c.client_progress, Progress::kFailed);
  EXPECT_EQ(c.client->error().code(), Code::kPermissionDenied);
  EXPECT_TRUE(Contains(c.client->error().message(), "peer certificate not signed by our CA"));
  EXPECT_TRUE(Contains(c.client->error().message(), "'beta'"));
  EXPECT_EQ(c.server_progress, Progress::kFailed);
  EXPECT_TRUE(Contains(c.server->error().message(), "peer rejected our certificate (unknown CA)"));
}

TEST_F(TlsChannelTest, ServerFailsCleanlyOnNonTlsClient) {
  auto pair = ConnectedPair();
  ASSERT_TRUE(pair.ok());
  const std::string garbage = "hello, this is not TLS at all\r\n\r\n";
  ASSERT_EQ(::send(pair->client.get(), garbage.data(), garbage.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(garbage.size()));
  auto server = TlsChannel::Server(*beta_, std::move(pair->server));
  Progress progress{};
  ASSERT_TRUE(RunUntilDone({HandshakeParty(*server, &progress)}));
  EXPECT_EQ(progress, Progress::kFailed);
  EXPECT_EQ(server->error().code(), Code::kDataLoss);
  EXPECT_TRUE(Contains(server->error().message(), "not a TLS peer"));
}

TEST_F(TlsChannelTest, ClientFailsCleanlyOnNonTlsServer) {
  auto pair = ConnectedPair();
  ASSERT_TRUE(pair.ok());
  const std::string garbage = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
  ASSERT_EQ(::send(pair->server.get(), garbage.data(), garbage.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(garbage.size()));
  auto client = TlsChannel::Client(*alpha_, std::move(pair->client), "beta");
  Progress progress{};
  ASSERT_TRUE(RunUntilDone({HandshakeParty(*client, &progress)}));
  EXPECT_EQ(progress, Progress::kFailed);
  EXPECT_EQ(client->error().code(), Code::kDataLoss);
  EXPECT_TRUE(Contains(client->error().message(), "not a TLS peer"));
}

TEST_F(TlsChannelTest, ServerRefusesTls12Client) {
  auto pair = ConnectedPair();
  ASSERT_TRUE(pair.ok());
  auto raw = RawTlsClient::Create(std::move(pair->client), Config("alpha").cert_file, Config("alpha").key_file,
                                  TLS1_2_VERSION);
  ASSERT_TRUE(raw);
  auto server = TlsChannel::Server(*beta_, std::move(pair->server));
  Progress progress{};
  ASSERT_TRUE(RunUntilDone({Party{raw->fd(), [&] { return raw->Handshake(); }}, HandshakeParty(*server, &progress)}));
  EXPECT_EQ(progress, Progress::kFailed);
  EXPECT_FALSE(raw->handshake_done());
  EXPECT_EQ(server->error().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(server->error().message(), "peer does not speak TLS 1.3"));
}

TEST_F(TlsChannelTest, PeerClosingDuringHandshakeIsUnavailable) {
  auto pair = ConnectedPair();
  ASSERT_TRUE(pair.ok());
  auto server = TlsChannel::Server(*beta_, std::move(pair->server));
  pair->client.reset();
  Progress progress{};
  ASSERT_TRUE(RunUntilDone({HandshakeParty(*server, &progress)}));
  EXPECT_EQ(progress, Progress::kFailed);
  EXPECT_EQ(server->error().code(), Code::kUnavailable);
  EXPECT_TRUE(Contains(server->error().message(), "peer closed the connection during the handshake"));
}

TEST_F(TlsChannelTest, ClientNeedsAnExpectedPeerName) {
  auto pair = ConnectedPair();
  ASSERT_TRUE(pair.ok());
  auto client = TlsChannel::Client(*alpha_, std::move(pair->client), "");
  EXPECT_EQ(client->Handshake(), Progress::kFailed);
  EXPECT_TRUE(Contains(client->error().message(), "expected peer name is empty"));
}

// --- Messages --------------------------------------------------------------

TEST_F(TlsChannelTest, MessagesRoundTripBothDirections) {
  Channels c = Established();
  std::mt19937 rng(42);
  Flow to_server(c.client.get());
  Flow to_client(c.server.get());
  for (Flow* f : {&to_server, &to_client}) {
    // Edges around the record size and the limit, then many small ones.
    for (size_t n : {0, 1, 100, 16383, 16384, 16385, 65535, 65536}) f->to_send.push_back(RandomBytes(rng, n));
    for (int i = 0; i < 3000; ++i) f->to_send.push_back(RandomBytes(rng, rng() % 300));
  }
  to_server.expect = to_client.to_send.size();
  to_client.expect = to_server.to_send.size();
  ASSERT_TRUE(RunUntilDone({to_server.party(), to_client.party()}));
  ASSERT_TRUE(to_server.error.ok()) << to_server.error.ToString();
  ASSERT_TRUE(to_client.error.ok()) << to_client.error.ToString();

  for (auto [sender, receiver] : {std::pair{&to_server, &to_client}, std::pair{&to_client, &to_server}}) {
    ASSERT_EQ(receiver->received.size(), sender->to_send.size());
    for (size_t i = 0; i < sender->to_send.size(); ++i) {
      ASSERT_EQ(receiver->received[i].size(), sender->to_send[i].size()) << "message " << i;
      ASSERT_EQ(Checksum(receiver->received[i]), Checksum(sender->to_send[i])) << "message " << i;
    }
  }
}

TEST_F(TlsChannelTest, FullQueueRefusesThenDeliversEverything) {
  Channels c = Established();
  std::mt19937 rng(7);
  // The server does not read: the socket fills, then the send queue.
  Messages sent;
  Status s;
  while ((s = c.client->Send(sent.emplace_back(RandomBytes(rng, TlsChannel::kMaxMessage)))).ok()) {
    ASSERT_LT(sent.size(), 1000u) << "the send queue never filled";
  }
  sent.pop_back();  // refused, not queued
  EXPECT_EQ(s.code(), Code::kResourceExhausted);
  EXPECT_TRUE(Contains(s.message(), "send queue full"));
  EXPECT_TRUE(c.client->WantsWrite());
  EXPECT_GE(sent.size() * (TlsChannel::kMaxMessage + 4), TlsChannel::kMaxQueued);

  Flow sender(c.client.get());
  Flow receiver(c.server.get());
  receiver.expect = sent.size();
  ASSERT_TRUE(RunUntilDone({sender.party(), receiver.party()}));
  ASSERT_TRUE(receiver.error.ok()) << receiver.error.ToString();
  ASSERT_EQ(receiver.received.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) EXPECT_EQ(Checksum(receiver.received[i]), Checksum(sent[i]));
}

TEST_F(TlsChannelTest, OversizeMessageIsRefusedBeforeSending) {
  Channels c = Established();
  std::vector<uint8_t> big(TlsChannel::kMaxMessage + 1);
  Status s = c.client->Send(big);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "65537 bytes exceeds the 65536-byte limit"));
  // Refusing it does not break the channel.
  Flow sender(c.client.get(), Messages{{1, 2, 3}});
  Flow receiver(c.server.get());
  receiver.expect = 1;
  ASSERT_TRUE(RunUntilDone({sender.party(), receiver.party()}));
  ASSERT_EQ(receiver.received, (Messages{{1, 2, 3}}));
}

TEST_F(TlsChannelTest, OversizeLengthFromPeerIsDataLoss) {
  auto pair = ConnectedPair();
  ASSERT_TRUE(pair.ok());
  auto raw = RawTlsClient::Create(std::move(pair->client), Config("alpha").cert_file, Config("alpha").key_file);
  ASSERT_TRUE(raw);
  auto server = TlsChannel::Server(*beta_, std::move(pair->server));
  Progress progress{};
  ASSERT_TRUE(RunUntilDone({Party{raw->fd(), [&] { return raw->Handshake(); }}, HandshakeParty(*server, &progress)}));
  ASSERT_EQ(progress, Progress::kDone) << server->error().ToString();
  ASSERT_TRUE(raw->handshake_done());
  // A valid message, then a length of 65537 (little-endian) and some bytes.
  ASSERT_TRUE(raw->WriteRaw({2, 0, 0, 0, 'o', 'k', 0x01, 0x00, 0x01, 0x00, 'x', 'y'}));
  Messages got;
  Status error;
  ASSERT_TRUE(RunUntilDone({ReceiveUntilError(*server, &got, &error)}));
  EXPECT_EQ(got, (Messages{{'o', 'k'}}));
  EXPECT_EQ(error.code(), Code::kDataLoss);
  EXPECT_TRUE(Contains(error.message(), "peer sent a message of 65537 bytes, over the 65536-byte limit"));
  // Latched: later calls report the same error.
  EXPECT_EQ(server->Receive(&got).message(), error.message());
  EXPECT_EQ(server->Send(std::vector<uint8_t>{1}).message(), error.message());
}

// A KeyUpdate with update_requested obliges the server to answer with a
// KeyUpdate of its own (RFC 8446 section 4.6.3). OpenSSL 3.0 processes it in
// SSL_read and sends the reply with the next SSL_write, here one whose record
// is stuck behind a full socket: the old-key record, the reply and new-key
// records must leave in that order across several readiness events.
TEST_F(TlsChannelTest, KeyUpdateWhileSocketIsFullKeepsBothDirectionsWorking) {
  auto pair = ConnectedPair();
  ASSERT_TRUE(pair.ok());
  auto raw = RawTlsClient::Create(std::move(pair->client), Config("alpha").cert_file, Config("alpha").key_file);
  ASSERT_TRUE(raw);
  auto server = TlsChannel::Server(*beta_, std::move(pair->server));
  Progress progress{};
  ASSERT_TRUE(RunUntilDone({Party{raw->fd(), [&] { return raw->Handshake(); }}, HandshakeParty(*server, &progress)}));
  ASSERT_EQ(progress, Progress::kDone) << server->error().ToString();

  // Fill the server's socket and send queue; the client reads nothing yet.
  std::mt19937 rng(3);
  Messages sent;
  size_t sent_bytes = 0;
  Status s;
  while ((s = server->Send(sent.emplace_back(RandomBytes(rng, TlsChannel::kMaxMessage)))).ok()) {
    sent_bytes += 4 + sent.back().size();
  }
  sent.pop_back();
  ASSERT_EQ(s.code(), Code::kResourceExhausted);

  ASSERT_TRUE(raw->RequestKeyUpdate());
  ASSERT_TRUE(raw->WriteRaw({5, 0, 0, 0, 'h', 'e', 'l', 'l', 'o'}));

  Flow server_side(server.get());
  server_side.expect = 1;
  std::vector<uint8_t> client_got;
  bool client_ok = true;
  ASSERT_TRUE(RunUntilDone({server_side.party(), Party{raw->fd(), [&]() -> short {
                                                         client_ok = raw->ReadSome(&client_got);
                                                         if (!client_ok || client_got.size() >= sent_bytes) return 0;
                                                         return POLLIN;
                                                       }}}));
  ASSERT_TRUE(server_side.error.ok()) << server_side.error.ToString();
  ASSERT_TRUE(client_ok);
  EXPECT_EQ(server_side.received, (Messages{{'h', 'e', 'l', 'l', 'o'}}));
  ASSERT_EQ(client_got.size(), sent_bytes);
  size_t pos = 0;
  for (const auto& m : sent) {
    ASSERT_EQ(client_got[pos], m.size() & 0xff);
    ASSERT_TRUE(std::equal(m.begin(), m.end(), client_got.begin() + static_cast<ptrdiff_t>(pos + 4)));
    pos += 4 + m.size();
  }
  // And the server still sends after the key change.
  Flow after(server.get(), Messages{{42}});
  ASSERT_TRUE(RunUntilDone({after.party()}));
  client_got.clear();
  ASSERT_TRUE(RunUntilDone({Party{raw->fd(), [&]() -> short {
                                    client_ok = raw->ReadSome(&client_got);
                                    return client_ok && client_got.size() < 5 ? POLLIN : 0;
                                  }}}));
  EXPECT_EQ(client_got, (std::vector<uint8_t>{1, 0, 0, 0, 42}));
}

// --- Close -----------------------------------------------------------------

TEST_F(TlsChannelTest, OrderlyCloseIsUnavailableAfterQueuedMessages) {
  Channels c = Established();
  for (uint8_t i = 0; i < 3; ++i) ASSERT_TRUE(c.client->Send(std::vector<uint8_t>{i}).ok());
  c.client->Close();
  EXPECT_EQ(c.client->Send(std::vector<uint8_t>{9}).code(), Code::kFailedPrecondition);
  Messages got;
  Status error;
  ASSERT_TRUE(RunUntilDone({ReceiveUntilError(*c.server, &got, &error)}));
  EXPECT_EQ(got, (Messages{{0}, {1}, {2}}));
  EXPECT_EQ(error.code(), Code::kUnavailable);
  EXPECT_TRUE(Contains(error.message(), "peer closed the channel"));
}

TEST_F(TlsChannelTest, AbruptCloseIsUnavailable) {
  Channels c = Established();
  c.client.reset();  // fd closed without close_notify
  Messages got;
  Status error;
  ASSERT_TRUE(RunUntilDone({ReceiveUntilError(*c.server, &got, &error)}));
  EXPECT_EQ(error.code(), Code::kUnavailable);
  EXPECT_TRUE(Contains(error.message(), "peer closed the connection without close_notify"));
}

// The test binary keeps SIGPIPE's default action: sending to a vanished
// peer must be an error, not a dead process.
TEST_F(TlsChannelTest, SendingToVanishedPeerIsAnErrorNotSigpipe) {
  Channels c = Established();
  c.server.reset();
  Status s;
  std::vector<uint8_t> msg(1000, 7);
  for (int i = 0; i < 200 && s.ok(); ++i) {
    s = c.client->Send(msg);
    ::usleep(5000);
  }
  EXPECT_EQ(s.code(), Code::kUnavailable);
  EXPECT_TRUE(Contains(s.message(), "connection error"));
}

// --- Exporter --------------------------------------------------------------

TEST_F(TlsChannelTest, ExportedKeysAgreeAcrossEndsAndDifferByLabel) {
  Channels c = Established();
  auto client_key = c.client->ExportKey("EXPORTER-vsocket-pairing");
  auto server_key = c.server->ExportKey("EXPORTER-vsocket-pairing");
  auto other_key = c.client->ExportKey("EXPORTER-vsocket-other");
  ASSERT_TRUE(client_key.ok() && server_key.ok() && other_key.ok());
  EXPECT_EQ(client_key.value(), server_key.value());
  EXPECT_NE(client_key.value(), other_key.value());
  EXPECT_NE(client_key.value(), (std::array<uint8_t, 32>{}));

  Channels again = Established();
  auto next_key = again.client->ExportKey("EXPORTER-vsocket-pairing");
  ASSERT_TRUE(next_key.ok());
  EXPECT_NE(next_key.value(), client_key.value()) << "keys must be per connection";
}

TEST_F(TlsChannelTest, ExportKeyNeedsAFinishedHandshake) {
  auto pair = ConnectedPair();
  ASSERT_TRUE(pair.ok());
  auto client = TlsChannel::Client(*alpha_, std::move(pair->client), "beta");
  auto key = client->ExportKey("EXPORTER-vsocket-pairing");
  ASSERT_FALSE(key.ok());
  EXPECT_EQ(key.status().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(key.status().message(), "handshake not finished"));
}

}  // namespace
}  // namespace vsocket::peering
