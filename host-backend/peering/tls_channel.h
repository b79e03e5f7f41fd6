// The backend-to-backend control channel of vsocketd: TLS 1.3 with mutual
// certificate authentication over one non-blocking TCP socket, carrying
// length-prefixed messages. Everything is non-blocking so a channel lives in
// the single epoll-driven worker thread next to the vhost devices.
//
// Trust model: every backend has a certificate (CN = its host name) signed by
// one deployment CA (`ca_file`). Both ends verify the peer's chain against
// that CA; the client additionally checks that the server is the host it
// meant to reach (`expected_peer`); the server learns the client's verified
// name and decides itself whether that host is a configured peer.
// deploy/make-certs.sh makes a test CA and host certificates.
//
// Event-loop contract (level-triggered epoll, which is what worker.cc uses):
//   * Handshake phase: call Handshake() once, then again whenever the fd is
//     readable (kWantRead) or writable (kWantWrite), until kDone or kFailed.
//   * Afterwards: keep EPOLLIN armed, arm EPOLLOUT while WantsWrite(); on
//     either event call Receive() and then Flush(). TLS may have to write
//     while reading (a KeyUpdate reply, an alert) and read while writing; the
//     channel remembers which direction blocked and retries it from either
//     call, and WantsWrite() covers a read that waits for the socket to drain.
//   * Errors latch: after the first failure every call returns the same
//     Status (error()); the caller drops the channel.
//
// Not thread-safe; one thread owns a channel. OpenSSL's per-thread error
// queue is cleared before every call into it.
#pragma once

#include <openssl/types.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"

namespace vsocket::peering {

struct TlsConfig {
  std::string cert_file;  // PEM: our certificate, optionally followed by intermediates
  std::string key_file;   // PEM: its private key, unencrypted
  std::string ca_file;    // PEM: the CA(s) peer certificates must chain to
  // PEM: revocation lists (optional). When set, a peer certificate is
  // refused unless a CRL of its issuer is here and does not list it.
  std::string crl_file;
};

// Immutable after Create(); shared by every channel of this backend (client
// and server side). Channels keep their own reference to the underlying
// SSL_CTX, so a channel may outlive the TlsContext.
class TlsContext {
 public:
  // TLS 1.3 only; peers must present a certificate chaining to ca_file,
  // with the extended key usages serverAuth and clientAuth, not revoked by
  // crl_file if one is configured. Fails with a message naming the file and
  // the reason: unreadable file, no certificate/key in it, key does not
  // match certificate, certificate without a CN or without both key
  // usages, a CRL file without a CRL our CA signed.
  static Result<std::unique_ptr<TlsContext>> Create(const TlsConfig& config);

  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  // CN of our own certificate (the name peers will see).
  const std::string& own_name() const { return own_name_; }
  // With a CRL file: how many certificates its CRLs revoke, and a warning
  // for the log if one is past its next update (every peer of that CA is
  // refused until the file is renewed); empty otherwise.
  size_t revoked() const { return revoked_; }
  const std::string& crl_warning() const { return crl_warning_; }

 private:
  friend class TlsChannel;  // SSL_new(ctx_)

  TlsContext(SSL_CTX* ctx, std::string own_name) : ctx_(ctx), own_name_(std::move(own_name)) {}

  SSL_CTX* ctx_;  // owned (one reference)
  std::string own_name_;
  size_t revoked_ = 0;
  std::string crl_warning_;
};

class TlsChannel {
 public:
  // Largest message payload (inclusive), and the bound on bytes queued by
  // Send() but not yet accepted by the socket.
  static constexpr size_t kMaxMessage = 64 * 1024;
  static constexpr size_t kMaxQueued = 1024 * 1024;

  // fd: a connected non-blocking TCP socket (ownership taken).
  // Client side: `expected_peer` must be one of the server certificate's
  // subjectAltName DNS names, or its CN if it has none (RFC 6125; exact
  // names, no wildcards). The server identifies its client by the same rule
  // (PeerIs).
  static std::unique_ptr<TlsChannel> Client(TlsContext& ctx, UniqueFd fd, std::string expected_peer);
  // Server side: peer_name() is the verified client name after the
  // handshake; the caller decides whether it is a configured peer.
  static std::unique_ptr<TlsChannel> Server(TlsContext& ctx, UniqueFd fd);

  ~TlsChannel();
  TlsChannel(const TlsChannel&) = delete;
  TlsChannel& operator=(const TlsChannel&) = delete;

  enum class Progress { kWantRead, kWantWrite, kDone, kFailed };

  // One non-blocking handshake step; call again when the fd is ready as
  // asked. kFailed: error() says why, e.g. "peer certificate not signed by
  // our CA", "peer presented no certificate", "peer name X, expected Y",
  // "not a TLS peer", "peer rejected our certificate".
  //
  // TLS 1.3 caveat: the client finishes its handshake before the server has
  // checked the client certificate. A client whose certificate the server
  // refuses sees kDone here and the refusal ("peer rejected our
  // certificate ...") on its next Receive(). Treat a peer as established
  // only once its first message arrived.
  Progress Handshake();

  // CN of the peer's verified certificate; empty before kDone. For logs:
  // a peer's identity is PeerIs.
  const std::string& peer_name() const { return peer_name_; }
  // After kDone: whether the peer's verified certificate names `name` by the
  // rule the client side applies to the server (see Client).
  bool PeerIs(const std::string& name) const;
  // The names PeerIs accepts, for messages: "DNS:a, DNS:b" or "CN=c".
  std::string PeerNames() const;
  // After kDone: verifies the peer's certificate chain again against `ctx`
  // (a context made later, e.g. with a new CRL): OK, or why it no longer
  // passes (revoked, expired, usage).
  Status Reverify(const TlsContext& ctx) const;
  // Why the channel failed; OK while it has not.
  const Status& error() const { return error_; }

  // Queues one message (u32 little-endian length + bytes) and sends what the
  // socket takes now; never blocks. kInvalidArgument if msg exceeds
  // kMaxMessage, kResourceExhausted if the queue would exceed kMaxQueued
  // (nothing queued; retry once !WantsWrite()); neither latches.
  Status Send(std::span<const uint8_t> msg);
  // Sends queued bytes until the socket would block.
  Status Flush();
  // True while bytes are queued or a read waits for the socket to drain:
  // arm EPOLLOUT.
  bool WantsWrite() const;

  // Appends every complete message received so far. Reads until the socket
  // would block, or stops after about 1 MiB per call at a point where
  // OpenSSL holds no buffered data (the rest still makes the fd readable),
  // so one busy peer cannot starve the worker. Messages appended before an
  // error are valid. Errors: peer closed (kUnavailable), garbage or oversize
  // length (kDataLoss), certificate refused by the peer (kPermissionDenied),
  // other TLS errors.
  Status Receive(std::vector<std::vector<uint8_t>>* out);

  // RFC 5705 / RFC 8446 section 7.5 exporter: both ends get the same 32
  // bytes for the same label, different bytes for different labels or
  // connections. Only after kDone.
  Result<std::array<uint8_t, 32>> ExportKey(std::string_view label) const;

  int fd() const { return fd_.get(); }

  // Orderly close: flushes what the socket takes, sends close_notify and
  // shuts down the write side (best effort, non-blocking). Later calls fail
  // with kFailedPrecondition. The fd stays open until destruction so the
  // caller can still remove it from epoll.
  void Close();

 private:
  enum class State { kHandshake, kOpen, kFailed, kClosed };

  TlsChannel(UniqueFd fd, bool is_client, std::string expected_peer);
  void Init(TlsContext& ctx);

  // Latches `status` as error(); returns it for `return Fail(...)`.
  Status Fail(Status status);
  // Describes a failed SSL_* call (SSL_get_error() result plus the error
  // queue, which it clears) in words; does not latch.
  Status SslFailure(int ssl_error, bool in_handshake);
  Status CheckOpen() const;
  Status FinishHandshake();
  // Moves complete messages from in_ to out; kDataLoss on a bad length.
  Status ParseMessages(std::vector<std::vector<uint8_t>>* out);

  struct SslFree {
    void operator()(SSL* ssl) const;
  };

  // Declared before ssl_ so the SSL (whose BIO names this fd) dies first.
  UniqueFd fd_;
  std::unique_ptr<SSL, SslFree> ssl_;
  const bool is_client_;
  const std::string expected_peer_;
  State state_ = State::kHandshake;
  Status error_;
  std::string peer_name_;
  // CN of the certificate the peer presented, recorded by the verify
  // callback even when verification fails (for "peer name X, expected Y").
  std::string presented_name_;

  // Outgoing plaintext: [out_head_, out_.size()) not yet accepted by TLS.
  std::vector<uint8_t> out_;
  size_t out_head_ = 0;
  // Length of an SSL_write that returned WANT_*: OpenSSL requires the retry
  // with the same length and bytes (the buffer may move, see
  // SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER). 0 = no retry pending.
  size_t write_retry_len_ = 0;
  bool read_wants_write_ = false;  // SSL_read returned WANT_WRITE
  bool write_wants_read_ = false;  // SSL_write returned WANT_READ

  // Incoming plaintext: at most one incomplete message plus one read.
  std::vector<uint8_t> in_;
  size_t in_len_ = 0;
};

const char* ToString(TlsChannel::Progress progress);

}  // namespace vsocket::peering
