#include "host-backend/peering/tls_util.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>

#include <cerrno>

namespace vsocket::peering {
namespace {

struct SocketBioData {
  int fd;
  int last_errno = 0;
  bool eof = false;  // recv returned 0
};

SocketBioData* Data(BIO* bio) { return static_cast<SocketBioData*>(BIO_get_data(bio)); }

int SocketWrite(BIO* bio, const char* buf, size_t len, size_t* written) {
  BIO_clear_retry_flags(bio);
  SocketBioData* d = Data(bio);
  ssize_t n;
  do {
    n = ::send(d->fd, buf, len, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n >= 0) {
    *written = static_cast<size_t>(n);
    return 1;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK) {
    BIO_set_retry_write(bio);
  } else {
    d->last_errno = errno;
  }
  return 0;
}

int SocketRead(BIO* bio, char* buf, size_t len, size_t* read) {
  BIO_clear_retry_flags(bio);
  SocketBioData* d = Data(bio);
  ssize_t n;
  do {
    n = ::recv(d->fd, buf, len, 0);
  } while (n < 0 && errno == EINTR);
  if (n > 0) {
    *read = static_cast<size_t>(n);
    return 1;
  }
  if (n == 0) {
    d->eof = true;
  } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
    BIO_set_retry_read(bio);
  } else {
    d->last_errno = errno;
  }
  return 0;
}

long SocketCtrl(BIO* bio, int cmd, long /*num*/, void* /*ptr*/) {
  switch (cmd) {
    case BIO_CTRL_FLUSH: return 1;  // send() does not buffer
    case BIO_CTRL_EOF:
      // OpenSSL asks this after a read of 0 bytes to tell an orderly TCP EOF
      // (SSL_R_UNEXPECTED_EOF_WHILE_READING) from a socket error.
      return Data(bio)->eof ? 1 : 0;
    default: return 0;  // unsupported, like BIO_s_mem does for unknown controls
  }
}

int SocketDestroy(BIO* bio) {
  delete Data(bio);
  BIO_set_data(bio, nullptr);
  return 1;
}

const BIO_METHOD* SocketMethod() {
  // Created once, thread-safe (magic static), never freed: OpenSSL BIOs keep
  // a pointer to it for their whole life.
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR, "vsocket socket");
    if (m == nullptr) return m;
    BIO_meth_set_write_ex(m, SocketWrite);
    BIO_meth_set_read_ex(m, SocketRead);
    BIO_meth_set_ctrl(m, SocketCtrl);
    BIO_meth_set_destroy(m, SocketDestroy);
    return m;
  }();
  return method;
}

}  // namespace

BIO* NewSocketBio(int fd) {
  const BIO_METHOD* method = SocketMethod();
  if (method == nullptr) return nullptr;
  BIO* bio = BIO_new(method);
  if (bio == nullptr) return nullptr;
  BIO_set_data(bio, new SocketBioData{fd});
  BIO_set_init(bio, 1);
  return bio;
}

int SocketBioErrno(BIO* bio) {
  SocketBioData* d = bio != nullptr ? Data(bio) : nullptr;
  return d != nullptr ? d->last_errno : 0;
}

std::string CommonName(const X509* cert) {
  if (cert == nullptr) return "";
  const X509_NAME* subject = X509_get_subject_name(cert);
  int index = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (index < 0) return "";
  const ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, index));
  unsigned char* utf8 = nullptr;
  int len = ASN1_STRING_to_UTF8(&utf8, data);
  if (len < 0) return "";
  std::string name(reinterpret_cast<char*>(utf8), static_cast<size_t>(len));
  OPENSSL_free(utf8);
  return name;
}

std::string HostUsageProblem(X509* cert) {
  if (cert == nullptr) return "no certificate";
  // (X509_get_extension_flags parses the extensions first.)
  if ((X509_get_extension_flags(cert) & EXFLAG_XKUSAGE) == 0)
    return "has no extended key usage (a peer host needs serverAuth and clientAuth)";
  uint32_t xku = X509_get_extended_key_usage(cert);
  std::string missing;
  if ((xku & XKU_SSL_SERVER) == 0) missing = "serverAuth";
  if ((xku & XKU_SSL_CLIENT) == 0) missing += std::string(missing.empty() ? "" : " and ") + "clientAuth";
  if (missing.empty()) return "";
  return "lacks extended key usage " + missing + " (a peer host both accepts and dials: it needs both)";
}

SslError TakeSslError() {
  SslError result;
  unsigned long code = ERR_get_error();
  if (code != 0) {
    if (ERR_GET_LIB(code) == ERR_LIB_SSL) result.reason = ERR_GET_REASON(code);
    const char* reason = ERR_reason_error_string(code);
    if (reason != nullptr) {
      result.text = reason;
    } else {
      char buf[256];
      ERR_error_string_n(code, buf, sizeof(buf));
      result.text = buf;
    }
  }
  ERR_clear_error();
  return result;
}

}  // namespace vsocket::peering
