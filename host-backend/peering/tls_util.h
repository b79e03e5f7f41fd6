// Internals shared by TlsContext and TlsChannel (host-backend/peering only):
// framing constants, a socket BIO without SIGPIPE, certificate names and the
// OpenSSL error queue as text.
#pragma once

#include <openssl/types.h>

#include <cstddef>
#include <string>

namespace vsocket::peering {

constexpr size_t kFrameHeaderBytes = 4;  // u32 little-endian payload length
// One TLS 1.3 record carries at most 16 KiB of plaintext; writing and
// reading in record-sized pieces keeps each SSL call to one record.
constexpr size_t kTlsRecordBytes = 16 * 1024;

// A BIO over a connected non-blocking socket it does not own. Unlike
// BIO_s_socket it sends with MSG_NOSIGNAL, so a peer that vanished gives
// EPIPE instead of killing the process, and it remembers the errno of the
// last failed send/recv for error messages. EAGAIN sets the BIO retry flags,
// which OpenSSL turns into SSL_ERROR_WANT_READ/WANT_WRITE.
BIO* NewSocketBio(int fd);
// errno of the last failed send/recv on a BIO from NewSocketBio (0 if none).
int SocketBioErrno(BIO* bio);

// The subject CN of `cert` as UTF-8; empty if it has none (or cert is null).
std::string CommonName(const X509* cert);

// Why `cert` may not be a peer host's certificate by its extended key
// usage, or "" if it may: a peer host both dials and accepts, so it needs
// an extendedKeyUsage extension naming both serverAuth and clientAuth
// (RFC 5280 would read a missing extension as "any use"; we do not).
std::string HostUsageProblem(X509* cert);

// The first error on this thread's OpenSSL error queue, then clears the
// queue. `reason` is ERR_GET_REASON of an SSL-library error, else 0.
struct SslError {
  int reason = 0;
  std::string text;  // e.g. "wrong version number"; empty if the queue was empty
};
SslError TakeSslError();

}  // namespace vsocket::peering
