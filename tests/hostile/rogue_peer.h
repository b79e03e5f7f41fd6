// A peer host that authenticates properly and then says what it likes: the
// red-team suite's attacker on the fabric (issue 17, finding 7).
//
// It holds a certificate of the daemon's CA (deploy/make-certs.sh), is a
// configured peer of the daemon under test (the vsocketd.conf it writes),
// and does what a vsocketd does to reach it: the TLS 1.3 handshake on
// peer_listen, then the tcp fabric's data link keyed by the TLS session
// (LINK_HELLO with the exported key), until LINK_READY. From then on it
// sends raw frames of its choosing (proto/fabric.h) on either channel and
// reads what the daemon sends back. The daemon is unmodified production
// code; only this side lies.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"
#include "host-backend/peering/tls_channel.h"
#include "proto/fabric.h"
#include "tests/integration/daemon_fixture.h"

namespace vsocket::testing {

// A frame as it arrived (or is to be sent): header and payload.
struct PeerFrame {
  proto::FrameHeader h;
  std::vector<uint8_t> payload;
};

class RoguePeer {
 public:
  // Of two hosts the one whose name sorts first connects
  // (docs/multi-host.md): the rogue sorts first, so it never has to listen.
  static constexpr const char* kName = "arogue";
  static constexpr const char* kDaemonName = "hostA";
  static constexpr std::chrono::milliseconds kWait{5000};

  RoguePeer();   // a private temp directory
  ~RoguePeer();  // closes both channels, removes the directory

  // Certificates for both hosts from one CA (deploy/make-certs.sh) into
  // `dir`; one set serves any number of sessions.
  static Status MakeCertificates(const std::string& dir);
  // (Re)writes `dir`/ca.crl, the CA's revocation list, revoking the
  // certificates of `hosts` (and those revoked before).
  static Status MakeCrl(const std::string& dir, const std::vector<std::string>& hosts = {});
  // The locator (`locator_lines`: "TENANT ADDRESS HOST") and a vsocketd.conf
  // in which the rogue is the daemon's only peer, with the certificates in
  // `certs`; start the daemon with --config config_path().
  // `crl`: the daemon's tls_crl (none if empty).
  Status Prepare(const std::string& certs, const std::vector<std::string>& locator_lines,
                 const std::string& crl = "");
  const std::string& config_path() const { return config_path_; }
  // The daemon's peer_listen port (on 127.0.0.1).
  int listen_port() const { return port_; }

  // The TLS handshake, then the data link, until the daemon says
  // LINK_READY (the session is up on both sides).
  Status Connect(Daemon& daemon);

  // Control channel (TLS): pairing frames.
  bool SendControl(const proto::FrameHeader& h, std::span<const uint8_t> payload = {});
  // Data link: per-connection frames (DATA with its payload).
  bool SendLink(const proto::FrameHeader& h, std::span<const uint8_t> payload = {});
  // Raw bytes on the data link: a frame in parts (EncodeFrame, then any
  // split of it), as a slow or lying peer sends it.
  bool SendLinkBytes(std::span<const uint8_t> bytes);
  static std::vector<uint8_t> EncodeFrame(const proto::FrameHeader& h, std::span<const uint8_t> payload);

  using Match = std::function<bool(const PeerFrame&)>;
  // The first frame received on that channel (earlier or within `limit`)
  // that `match` accepts, taken out of the received ones; nullopt if none
  // came in time.
  std::optional<PeerFrame> AwaitControl(const Match& match, std::chrono::milliseconds limit = kWait);
  std::optional<PeerFrame> AwaitLink(const Match& match, std::chrono::milliseconds limit = kWait);
  // Whether the daemon closed the data link (reads until `limit` or EOF).
  bool LinkClosedWithin(std::chrono::milliseconds limit);

  // Why the last call failed (a channel error, a frame that did not parse).
  const std::string& error() const { return error_; }

 private:
  // Reads whatever either channel has, waiting at most `wait_ms`.
  void Pump(int wait_ms);
  std::optional<PeerFrame> Await(std::vector<PeerFrame>& from, const Match& match, std::chrono::milliseconds limit);
  void ParseLink();

  std::string dir_;
  std::string config_path_;
  int port_ = 0;  // the daemon's peer_listen
  std::unique_ptr<peering::TlsContext> ctx_;
  std::unique_ptr<peering::TlsChannel> tls_;
  UniqueFd link_;
  bool link_eof_ = false;
  std::vector<uint8_t> link_in_;  // bytes of frames not yet complete
  std::vector<PeerFrame> control_frames_, link_frames_;
  std::string error_;
};

// A PairInfo payload as the requester sees the connection.
std::vector<uint8_t> PairInfoPayload(const proto::Endpoint& local, const proto::Endpoint& peer, proto::Role role);

}  // namespace vsocket::testing
