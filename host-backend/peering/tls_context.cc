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
int RememberPresentedName(int preverify_ok, X509_STORE_CTX* store) {
  auto* ssl = static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  auto* name = ssl != nullptr ? static_cast<std::string*>(SSL_get_app_data(ssl)) : nullptr;
  if (name != nullptr && name->empty()) *name = CommonName(X509_STORE_CTX_get0_cert(store));
  return preverify_ok;
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
  ERR_clear_error();
  return std::unique_ptr<TlsContext>(new TlsContext(ctx.release(), std::move(own_name)));
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

}  // namespace vsocket::peering
