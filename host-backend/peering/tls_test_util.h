// Test support for host-backend/peering: loopback TCP pairs, a bounded
// single-threaded poll loop, certificates made by deploy/make-certs.sh, and a
// raw OpenSSL client that can do what TlsChannel never does (no certificate,
// malformed framing).
#pragma once

#include <openssl/types.h>
#include <poll.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"
#include "host-backend/peering/tls_channel.h"

namespace vsocket::peering::testing {

// Both ends of one TCP connection over 127.0.0.1 (ephemeral port), both
// non-blocking, the connect completed.
struct SocketPair {
  UniqueFd client;
  UniqueFd server;
};
Result<SocketPair> ConnectedPair();

// One participant of RunUntilDone: `step` makes progress without blocking
// and returns the poll events (POLLIN/POLLOUT) it waits for, 0 once finished.
struct Party {
  int fd;
  std::function<short()> step;
};

// Calls every step once, then again only when its fd reports readiness (or
// an error/hangup), until all steps returned 0 (true) or `limit` passed
// (false). Event-driven on purpose: a channel that asks for the wrong
// readiness stalls here and the test fails instead of spinning.
bool RunUntilDone(const std::vector<Party>& parties, std::chrono::milliseconds limit = std::chrono::seconds(10));

// A party that runs ch.Handshake() until kDone or kFailed, left in *result.
Party HandshakeParty(TlsChannel& ch, TlsChannel::Progress* result);

// Runs deploy/make-certs.sh (from the runfiles, via the package's symlink) with `args`; the error says
// how it failed.
Status RunMakeCerts(const std::vector<std::string>& args);

// FNV-1a 64 of a message, to compare streams compactly.
uint64_t Checksum(const std::vector<uint8_t>& bytes);

// A TLS client on plain OpenSSL that verifies nothing and presents
// `cert_file`/`key_file` (none if empty); TLS 1.3 unless `max_version`
// (e.g. TLS1_2_VERSION) caps it.
class RawTlsClient {
 public:
  static std::unique_ptr<RawTlsClient> Create(UniqueFd fd, const std::string& cert_file, const std::string& key_file,
                                              int max_version = 0);
  ~RawTlsClient();

  // Handshake step; returns poll events as Party::step does.
  short Handshake();
  bool handshake_done() const { return done_; }
  // Writes raw plaintext (no framing) in one SSL_write; true if all taken.
  bool WriteRaw(const std::vector<uint8_t>& bytes);
  // Asks for a TLS 1.3 KeyUpdate with update_requested: the peer must answer
  // with its own KeyUpdate from inside its SSL_read. Sent with the next write.
  bool RequestKeyUpdate();
  // Reads plaintext until the socket would block, appending to *got; false
  // on a TLS error or EOF.
  bool ReadSome(std::vector<uint8_t>* got);
  // Reads until the socket would block; returns the OpenSSL error text of
  // a failure ("" while none), e.g. the alert the server sent.
  std::string ReadError();
  int fd() const { return fd_.get(); }

 private:
  RawTlsClient() = default;
  UniqueFd fd_;
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
  bool done_ = false;
};

}  // namespace vsocket::peering::testing
