// TlsChannel setup: creation, the non-blocking handshake, and turning
// OpenSSL failures into messages an operator can act on. The message data
// path is in tls_channel_io.cc.
#include "host-backend/peering/tls_channel.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>

#include "base/log.h"
#include "host-backend/peering/tls_util.h"

namespace vsocket::peering {
namespace {

// Alerts (RFC 8446 section 6.2) a peer sends when it refuses our certificate.
bool IsCertificateAlert(int alert) {
  switch (alert) {
    case SSL3_AD_BAD_CERTIFICATE:
    case SSL3_AD_UNSUPPORTED_CERTIFICATE:
    case SSL3_AD_CERTIFICATE_REVOKED:
    case SSL3_AD_CERTIFICATE_EXPIRED:
    case SSL3_AD_CERTIFICATE_UNKNOWN:
    case TLS1_AD_UNKNOWN_CA:
    case TLS1_AD_ACCESS_DENIED:
    case TLS13_AD_CERTIFICATE_REQUIRED: return true;
    default: return false;
  }
}

// How a certificate names a peer, on both sides (RFC 6125): its DNS
// subjectAltNames, its CN only when it has none; exact names.
constexpr unsigned kHostFlags = X509_CHECK_FLAG_NO_WILDCARDS;

// Record-layer reasons OpenSSL gives when the bytes are not TLS at all.
bool IsNotTlsReason(int reason) {
  switch (reason) {
    case SSL_R_WRONG_VERSION_NUMBER:
    case SSL_R_HTTP_REQUEST:
    case SSL_R_HTTPS_PROXY_REQUEST:
    case SSL_R_UNKNOWN_PROTOCOL:
    case SSL_R_PACKET_LENGTH_TOO_LONG:
    case SSL_R_RECORD_LENGTH_MISMATCH:
    case SSL_R_RECORD_TOO_SMALL:
    case SSL_R_BAD_RECORD_TYPE:
    case SSL_R_UNEXPECTED_RECORD:
    case SSL_R_UNEXPECTED_MESSAGE:
    case SSL_R_LENGTH_MISMATCH: return true;
    default: return false;
  }
}

// The verification error of a peer certificate, in words.
Status VerifyFailure(long result, const std::string& presented, const std::string& expected) {
  const std::string who = presented.empty() ? "peer certificate" : "peer certificate '" + presented + "'";
  const std::string detail = X509_verify_cert_error_string(result);
  switch (result) {
    case X509_V_ERR_HOSTNAME_MISMATCH:
      return Status(Code::kPermissionDenied,
                    "peer name " + (presented.empty() ? std::string("(no CN)") : presented) + ", expected " + expected);
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_CERT_SIGNATURE_FAILURE:
      return Status(Code::kPermissionDenied, "peer certificate not signed by our CA (" + who + ": " + detail + ")");
    case X509_V_ERR_CERT_REVOKED: return Status(Code::kPermissionDenied, who + " is revoked (tls_crl)");
    case X509_V_ERR_UNABLE_TO_GET_CRL:
      return Status(Code::kPermissionDenied, who + " rejected: tls_crl holds no CRL of its issuer");
    case X509_V_ERR_CRL_HAS_EXPIRED:
      return Status(Code::kPermissionDenied, who + " rejected: the CRL of its issuer in tls_crl is past its next "
                                                   "update (renew the file)");
    case X509_V_ERR_INVALID_PURPOSE:
      return Status(Code::kPermissionDenied, who + " rejected: it is not for TLS server and client authentication "
                                                   "(extended key usage serverAuth and clientAuth)");
    default: return Status(Code::kPermissionDenied, who + " rejected: " + detail);
  }
}

}  // namespace

bool TlsChannel::PeerIs(const std::string& name) const {
  if (state_ != State::kOpen || name.empty()) return false;
  const X509* cert = SSL_get0_peer_certificate(ssl_.get());
  return cert != nullptr &&
         X509_check_host(const_cast<X509*>(cert), name.data(), name.size(), kHostFlags, nullptr) == 1;
}

std::string TlsChannel::PeerNames() const {
  const X509* cert = ssl_ ? SSL_get0_peer_certificate(ssl_.get()) : nullptr;
  if (cert == nullptr) return "";
  std::string out;
  auto* names = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* g = sk_GENERAL_NAME_value(names, i);
    if (g->type != GEN_DNS) continue;
    const unsigned char* d = ASN1_STRING_get0_data(g->d.dNSName);
    out += (out.empty() ? "DNS:" : ", DNS:") + std::string(reinterpret_cast<const char*>(d), ASN1_STRING_length(g->d.dNSName));
  }
  GENERAL_NAMES_free(names);
  return out.empty() ? "CN=" + CommonName(cert) : out;
}

Status TlsChannel::Reverify(const TlsContext& ctx) const {
  X509* cert = ssl_ ? SSL_get0_peer_certificate(ssl_.get()) : nullptr;
  if (state_ != State::kOpen || cert == nullptr) return Status(Code::kFailedPrecondition, "no verified peer");
  X509_STORE_CTX* sc = X509_STORE_CTX_new();
  if (sc == nullptr) return Status(Code::kInternal, "X509_STORE_CTX_new failed");
  // The chain the peer sent (the client side's includes the leaf) and the
  // policy of a handshake in the same role: purpose, depth, CRL flags.
  bool ok = X509_STORE_CTX_init(sc, SSL_CTX_get_cert_store(ctx.ctx_), cert, SSL_get_peer_cert_chain(ssl_.get())) == 1 &&
            X509_STORE_CTX_set_default(sc, is_client_ ? "ssl_server" : "ssl_client") == 1;
  X509_VERIFY_PARAM_set_depth(X509_STORE_CTX_get0_param(sc), SSL_CTX_get_verify_depth(ctx.ctx_));
  long result = ok && X509_verify_cert(sc) == 1 ? X509_V_OK : X509_STORE_CTX_get_error(sc);
  if (ok && result == X509_V_OK && !HostUsageProblem(cert).empty()) result = X509_V_ERR_INVALID_PURPOSE;
  X509_STORE_CTX_free(sc);
  ERR_clear_error();
  if (!ok) return Status(Code::kInternal, "cannot set up a verification");
  if (result == X509_V_OK) return Status::Ok();
  return VerifyFailure(result, CommonName(cert), expected_peer_);
}

const char* ToString(TlsChannel::Progress progress) {
  switch (progress) {
    case TlsChannel::Progress::kWantRead: return "WANT_READ";
    case TlsChannel::Progress::kWantWrite: return "WANT_WRITE";
    case TlsChannel::Progress::kDone: return "DONE";
    case TlsChannel::Progress::kFailed: return "FAILED";
  }
  return "UNKNOWN";
}

void TlsChannel::SslFree::operator()(SSL* ssl) const { SSL_free(ssl); }

std::unique_ptr<TlsChannel> TlsChannel::Client(TlsContext& ctx, UniqueFd fd, std::string expected_peer) {
  std::unique_ptr<TlsChannel> ch(new TlsChannel(std::move(fd), true, std::move(expected_peer)));
  ch->Init(ctx);
  return ch;
}

std::unique_ptr<TlsChannel> TlsChannel::Server(TlsContext& ctx, UniqueFd fd) {
  std::unique_ptr<TlsChannel> ch(new TlsChannel(std::move(fd), false, ""));
  ch->Init(ctx);
  return ch;
}

TlsChannel::TlsChannel(UniqueFd fd, bool is_client, std::string expected_peer)
    : fd_(std::move(fd)), is_client_(is_client), expected_peer_(std::move(expected_peer)) {}

TlsChannel::~TlsChannel() = default;

// Setup failures latch like handshake failures: the factories always return
// a channel and the first Handshake() reports kFailed with the reason.
void TlsChannel::Init(TlsContext& ctx) {
  ERR_clear_error();
  if (!fd_.valid()) {
    (void)Fail(Status(Code::kInvalidArgument, "no socket"));
    return;
  }
  if (is_client_ && expected_peer_.empty()) {
    (void)Fail(Status(Code::kInvalidArgument, "expected peer name is empty"));
    return;
  }
  ssl_.reset(SSL_new(ctx.ctx_));
  BIO* bio = ssl_ ? NewSocketBio(fd_.get()) : nullptr;
  if (bio == nullptr) {
    (void)Fail(Status(Code::kInternal, "cannot create TLS session: " + TakeSslError().text));
    return;
  }
  SSL_set_bio(ssl_.get(), bio, bio);  // one reference, for both directions
  // Read by the verify callback (tls_context.cc).
  SSL_set_app_data(ssl_.get(), &presented_name_);
  if (is_client_) {
    // Exact names only: a DNS subjectAltName, or the CN when there is none
    // (RFC 6125, OpenSSL's default), no wildcards; PeerIs, on the server,
    // applies the same rule.
    SSL_set_hostflags(ssl_.get(), kHostFlags);
    if (SSL_set1_host(ssl_.get(), expected_peer_.c_str()) != 1) {
      (void)Fail(Status(Code::kInvalidArgument,
                        "invalid expected peer name '" + expected_peer_ + "': " + TakeSslError().text));
      return;
    }
    SSL_set_connect_state(ssl_.get());
  } else {
    SSL_set_accept_state(ssl_.get());
  }
  // At most one incomplete message plus one record read behind it.
  in_.resize(kFrameHeaderBytes + kMaxMessage + kTlsRecordBytes);
}

Status TlsChannel::Fail(Status status) {
  if (state_ != State::kFailed) {
    state_ = State::kFailed;
    error_ = std::move(status);
    VS_LOG(kDebug, "peering: TLS %s fd %d (peer '%s') failed: %s", is_client_ ? "client" : "server", fd_.get(),
           is_client_ ? expected_peer_.c_str() : peer_name_.c_str(), error_.message().c_str());
  }
  ERR_clear_error();
  return error_;
}

Status TlsChannel::SslFailure(int ssl_error, bool in_handshake) {
  const SslError err = TakeSslError();
  const int sys_errno = SocketBioErrno(SSL_get_rbio(ssl_.get()));
  const char* phase = in_handshake ? " during the handshake" : "";

  if (ssl_error == SSL_ERROR_ZERO_RETURN) {
    return Status(Code::kUnavailable, std::string("peer closed the channel") + phase);
  }
  if (ssl_error == SSL_ERROR_SYSCALL || err.reason == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
    if (sys_errno != 0) {
      return Status::FromErrno(std::string("connection error") + phase, sys_errno);
    }
    return Status(Code::kUnavailable, in_handshake ? "peer closed the connection during the handshake"
                                                   : "peer closed the connection without close_notify");
  }
  if (ssl_error != SSL_ERROR_SSL) {
    return Status(Code::kInternal, "unexpected SSL error " + std::to_string(ssl_error));
  }

  if (err.reason == SSL_R_CERTIFICATE_VERIFY_FAILED) {
    return VerifyFailure(SSL_get_verify_result(ssl_.get()), presented_name_, expected_peer_);
  }
  if (err.reason == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE) {
    return Status(Code::kPermissionDenied, "peer presented no certificate");
  }
  // A fatal alert from the peer arrives as reason SSL_AD_REASON_OFFSET + alert.
  if (err.reason >= SSL_AD_REASON_OFFSET && err.reason < SSL_AD_REASON_OFFSET + 256) {
    const int alert = err.reason - SSL_AD_REASON_OFFSET;
    const std::string text = SSL_alert_desc_string_long(alert);
    if (IsCertificateAlert(alert)) {
      return Status(Code::kPermissionDenied, "peer rejected our certificate (" + text + ")");
    }
    if (alert == SSL_AD_PROTOCOL_VERSION) {
      return Status(Code::kFailedPrecondition, "peer does not speak TLS 1.3 (" + text + ")");
    }
    return Status(Code::kUnavailable, "peer aborted the TLS session (" + text + ")");
  }
  if (err.reason == SSL_R_UNSUPPORTED_PROTOCOL) {
    return Status(Code::kFailedPrecondition, "peer does not speak TLS 1.3 (" + err.text + ")");
  }
  if (in_handshake && IsNotTlsReason(err.reason)) {
    return Status(Code::kDataLoss, "not a TLS peer (" + err.text + ")");
  }
  return Status(Code::kDataLoss, std::string("TLS error") + phase + ": " + (err.text.empty() ? "unknown" : err.text));
}

TlsChannel::Progress TlsChannel::Handshake() {
  switch (state_) {
    case State::kHandshake: break;
    case State::kOpen: return Progress::kDone;
    case State::kFailed:
    case State::kClosed: return Progress::kFailed;
  }
  ERR_clear_error();
  const int r = SSL_do_handshake(ssl_.get());
  if (r == 1) return FinishHandshake().ok() ? Progress::kDone : Progress::kFailed;
  const int e = SSL_get_error(ssl_.get(), r);
  if (e == SSL_ERROR_WANT_READ) return Progress::kWantRead;
  if (e == SSL_ERROR_WANT_WRITE) return Progress::kWantWrite;
  (void)Fail(SslFailure(e, true));
  return Progress::kFailed;
}

// OpenSSL already enforced all of this (verify mode, version bounds); the
// checks guard against a future change of the context silently opening the
// channel to unauthenticated peers.
Status TlsChannel::FinishHandshake() {
  const X509* cert = SSL_get0_peer_certificate(ssl_.get());
  if (cert == nullptr) return Fail(Status(Code::kPermissionDenied, "peer presented no certificate"));
  const long verify = SSL_get_verify_result(ssl_.get());
  if (verify != X509_V_OK) return Fail(VerifyFailure(verify, CommonName(cert), expected_peer_));
  if (SSL_version(ssl_.get()) != TLS1_3_VERSION) {
    return Fail(
        Status(Code::kFailedPrecondition, std::string("negotiated ") + SSL_get_version(ssl_.get()) + ", not TLS 1.3"));
  }
  std::string name = CommonName(cert);
  if (name.empty()) {
    return Fail(Status(Code::kPermissionDenied, "peer certificate has no common name (CN)"));
  }
  peer_name_ = std::move(name);
  state_ = State::kOpen;
  ERR_clear_error();
  return Status::Ok();
}

}  // namespace vsocket::peering
