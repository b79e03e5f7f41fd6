// TlsContext: loads our certificate, key and the CA once and fixes the
// policy every peering channel shares (TLS 1.3 only, mutual authentication).
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "host-backend/peering/tls_channel.h"
#include "host-backend/peering/tls_util.h"

namespace vsocket::peering {
namespace {

// Longest chain accepted: leaf + intermediates + root.
constexpr int kMaxVerifyDepth = 4;

struct CtxFree {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};

// Opening the file ourselves first gives "No such file or directory" /
// "Permission denied" instead of OpenSSL's generic "system lib".
Status CheckReadable(const char* what, const std::string& path) {
  if (path.empty()) return Status(Code::kInvalidArgument, std::string(what) + " not configured");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(std::string("cannot read ") + what + " '" + path + "'");
  ::close(fd);
  return Status::Ok();
}

Status SslFailure(Code code, std::string message) {
  SslError err = TakeSslError();
  if (!err.text.empty()) message += " (" + err.text + ")";
  return Status(code, std::move(message));
}

// Records the CN of the certificate the peer presented, so a failed
// handshake can name it ("peer name X, expected Y"): OpenSSL does not keep
// a peer certificate that failed verification. The verdict is unchanged.
//
// Also the extended key usage rule (HostUsageProblem) for the peer's own
// certificate: OpenSSL checks the usage of the role only when the extension
// is present.
int RememberPresentedName(int preverify_ok, X509_STORE_CTX* store) {
  auto* ssl = static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  auto* name = ssl != nullptr ? static_cast<std::string*>(SSL_get_app_data(ssl)) : nullptr;
  if (name != nullptr && name->empty()) *name = CommonName(X509_STORE_CTX_get0_cert(store));
  if (preverify_ok && X509_STORE_CTX_get_error_depth(store) == 0 &&
      !HostUsageProblem(X509_STORE_CTX_get_current_cert(store)).empty()) {
    X509_STORE_CTX_set_error(store, X509_V_ERR_INVALID_PURPOSE);
    return 0;
  }
  return preverify_ok;
}

struct CrlFree {
  void operator()(X509_CRL* crl) const { X509_CRL_free(crl); }
};

// Adds the CRLs of `path` to the context's store and turns revocation
// checks on. Every CRL must be signed by a CA of the store (one that is not
// would make every peer of that issuer fail as "unable to get CRL"); one
// past its next update is loaded all the same (OpenSSL then refuses that
// CA's peers: fail closed) and named in *warning.
Status LoadCrls(SSL_CTX* c, const std::string& path, size_t* revoked, std::string* warning) {
  BIO* bio = BIO_new_file(path.c_str(), "r");
  if (bio == nullptr) return SslFailure(Code::kNotFound, "cannot read CRL file '" + path + "'");
  std::vector<std::unique_ptr<X509_CRL, CrlFree>> crls;
  while (X509_CRL* crl = PEM_read_bio_X509_CRL(bio, nullptr, nullptr, nullptr)) crls.emplace_back(crl);
  BIO_free(bio);
  ERR_clear_error();  // (the end of the file reads as an error)
  if (crls.empty()) return Status(Code::kInvalidArgument, "CRL file '" + path + "' holds no PEM CRL");
  X509_STORE* store = SSL_CTX_get_cert_store(c);
  STACK_OF(X509_OBJECT)* objs = X509_STORE_get0_objects(store);
  for (auto& crl : crls) {
    bool signed_by_ca = false;
    for (int i = 0; i < sk_X509_OBJECT_num(objs) && !signed_by_ca; ++i) {
      X509* ca = X509_OBJECT_get0_X509(sk_X509_OBJECT_value(objs, i));
      signed_by_ca = ca != nullptr && X509_NAME_cmp(X509_get_subject_name(ca), X509_CRL_get_issuer(crl.get())) == 0 &&
                     X509_CRL_verify(crl.get(), X509_get0_pubkey(ca)) == 1;
    }
    ERR_clear_error();
    char issuer[256];
    X509_NAME_oneline(X509_CRL_get_issuer(crl.get()), issuer, sizeof(issuer));
    if (!signed_by_ca)
      return Status(Code::kInvalidArgument,
                    "CRL file '" + path + "': a CRL of '" + issuer + "' not signed by a CA of tls_ca");
    const ASN1_TIME* next = X509_CRL_get0_nextUpdate(crl.get());
    if (next != nullptr && X509_cmp_current_time(next) < 0 && warning->empty())
      *warning = std::string("the CRL of '") + issuer + "' in '" + path +
                 "' is past its next update: peers of that CA are refused until it is renewed";
    STACK_OF(X509_REVOKED)* rev = X509_CRL_get_REVOKED(crl.get());
    *revoked += rev != nullptr ? static_cast<size_t>(sk_X509_REVOKED_num(rev)) : 0;
    if (X509_STORE_add_crl(store, crl.get()) != 1) return SslFailure(Code::kInternal, "cannot add CRL");
  }
  X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK);
  return Status::Ok();
}

// A private key any other user may read (or write) is refused, as ssh
// refuses one: whoever reads it can impersonate this host to every peer.
// Group access is allowed (0640 root:vsocket, for a daemon run as vsocket).
Status CheckKeyMode(const std::string& path) {
  struct stat st{};
  if (stat(path.c_str(), &st) != 0) return Status::FromErrno("cannot stat private key file '" + path + "'");
  if ((st.st_mode & S_IRWXO) == 0) return Status::Ok();
  char mode[8];
  snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
  return Status(Code::kPermissionDenied, "private key file '" + path + "' is accessible to other users (mode " + mode +
                                             "): chmod 600 it (or 640 with the daemon's group)");
}

// A passphrase-protected key must fail to load, not prompt on the daemon's
// terminal.
int NoPassphrase(char* /*buf*/, int /*size*/, int /*rwflag*/, void* /*userdata*/) { return 0; }

Result<std::unique_ptr<EVP_PKEY, PkeyFree>> LoadKey(const std::string& path) {
  BIO* bio = BIO_new_file(path.c_str(), "r");
  if (bio == nullptr) return SslFailure(Code::kNotFound, "cannot read private key file '" + path + "'");
  EVP_PKEY* key = PEM_read_bio_PrivateKey(bio, nullptr, NoPassphrase, nullptr);
  BIO_free(bio);
  if (key == nullptr) {
    return SslFailure(Code::kInvalidArgument, "private key file '" + path + "' holds no unencrypted PEM private key");
  }
  ERR_clear_error();
  return std::unique_ptr<EVP_PKEY, PkeyFree>(key);
}

}  // namespace

Result<std::unique_ptr<TlsContext>> TlsContext::Create(const TlsConfig& config) {
  VS_RETURN_IF_ERROR(CheckReadable("certificate file", config.cert_file));
  VS_RETURN_IF_ERROR(CheckReadable("private key file", config.key_file));
  VS_RETURN_IF_ERROR(CheckKeyMode(config.key_file));
  VS_RETURN_IF_ERROR(CheckReadable("CA file", config.ca_file));
  ERR_clear_error();

  std::unique_ptr<SSL_CTX, CtxFree> ctx(SSL_CTX_new(TLS_method()));
  if (!ctx) return SslFailure(Code::kInternal, "SSL_CTX_new failed");
  SSL_CTX* c = ctx.get();

  if (SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION) != 1 || SSL_CTX_set_max_proto_version(c, TLS1_3_VERSION) != 1) {
    return SslFailure(Code::kInternal, "this OpenSSL cannot restrict itself to TLS 1.3");
  }
  // Send() appends to a vector that may reallocate between an SSL_write
  // that returned WANT_WRITE and its retry; the bytes stay the same.
  SSL_CTX_set_mode(c, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // Peers reconnect with a full handshake; no resumption, so no session
  // cache and no tickets (which would also be unsolicited post-handshake
  // traffic from the server).
  SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_options(c, SSL_OP_NO_TICKET);
  SSL_CTX_set_num_tickets(c, 0);
  SSL_CTX_set_default_passwd_cb(c, NoPassphrase);

  if (SSL_CTX_use_certificate_chain_file(c, config.cert_file.c_str()) != 1) {
    return SslFailure(Code::kInvalidArgument,
                      "certificate file '" + config.cert_file + "' holds no usable PEM certificate");
  }
  auto key = LoadKey(config.key_file);
  if (!key.ok()) return key.status();
  if (X509_check_private_key(SSL_CTX_get0_certificate(c), key->get()) != 1) {
    ERR_clear_error();
    return Status(Code::kInvalidArgument,
                  "private key '" + config.key_file + "' does not match certificate '" + config.cert_file + "'");
  }
  if (SSL_CTX_use_PrivateKey(c, key->get()) != 1 || SSL_CTX_check_private_key(c) != 1) {
    return SslFailure(Code::kInvalidArgument, "cannot use private key '" + config.key_file + "'");
  }
  if (SSL_CTX_load_verify_locations(c, config.ca_file.c_str(), nullptr) != 1) {
    return SslFailure(Code::kInvalidArgument, "CA file '" + config.ca_file + "' holds no usable PEM certificate");
  }

  // Both roles verify the peer; FAIL_IF_NO_PEER_CERT makes the server
  // request and require a client certificate (it is ignored on clients,
  // where TLS always has the server send one).
  SSL_CTX_set_verify(c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, RememberPresentedName);
  SSL_CTX_set_verify_depth(c, kMaxVerifyDepth);

  std::string own_name = CommonName(SSL_CTX_get0_certificate(c));
  if (own_name.empty()) {
    return Status(Code::kInvalidArgument,
                  "certificate '" + config.cert_file + "' has no common name (CN); peers identify us by it");
  }
  // Peers would refuse it at every handshake: say so at start.
  std::string usage = HostUsageProblem(SSL_CTX_get0_certificate(c));
  if (!usage.empty()) return Status(Code::kInvalidArgument, "certificate '" + config.cert_file + "' " + usage);
  size_t revoked = 0;
  std::string warning;
  if (!config.crl_file.empty()) {
    VS_RETURN_IF_ERROR(CheckReadable("CRL file", config.crl_file));
    VS_RETURN_IF_ERROR(LoadCrls(c, config.crl_file, &revoked, &warning));
  }
  ERR_clear_error();
  std::unique_ptr<TlsContext> out(new TlsContext(ctx.release(), std::move(own_name)));
  out->revoked_ = revoked;
  out->crl_warning_ = std::move(warning);
  return out;
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

}  // namespace vsocket::peering
