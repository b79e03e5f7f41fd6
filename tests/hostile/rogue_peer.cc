#include "tests/hostile/rogue_peer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "host-backend/peering/tls_test_util.h"

namespace vsocket::testing {

namespace {

using Clock = std::chrono::steady_clock;
using proto::FrameHeader;
using proto::FrameType;

// The label both ends export the link key with (host-backend/peering/peers.cc).
constexpr const char* kLinkKeyLabel = "vsocket fabric link v1";

int MsLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

// A free port on 127.0.0.1 for the daemon's peer_listen (bound, read, closed:
// another process could take it in between; nothing on this machine hands out
// ports that fast).
int FreePort() {
  UniqueFd s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (!s || bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return 0;
  return ntohs(a.sin_port);
}

// A TCP connection to 127.0.0.1:port, non-blocking once connected; retried
// until `deadline` (the daemon may still be opening its listener).
Result<UniqueFd> ConnectLoopback(int port, Clock::time_point deadline) {
  for (;;) {
    UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (fd && connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
      int one = 1;
      setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      fcntl(fd.get(), F_SETFL, fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
      return fd;
    }
    if (Clock::now() >= deadline) return Status::FromErrno("connect to 127.0.0.1:" + std::to_string(port));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  return static_cast<bool>(f);
}

}  // namespace

std::vector<uint8_t> PairInfoPayload(const proto::Endpoint& local, const proto::Endpoint& peer, proto::Role role) {
  proto::PairInfo info;
  info.local = local;
  info.peer = peer;
  info.role = role;
  std::vector<uint8_t> out(proto::kPairInfoSize);
  proto::EncodePairInfo(info, out.data());
  return out;
}

RoguePeer::RoguePeer() {
  char tmpl[] = "/tmp/vsocket-rogue-XXXXXX";
  if (const char* d = mkdtemp(tmpl)) dir_ = d;
}

RoguePeer::~RoguePeer() {
  if (tls_) tls_->Close();
  tls_.reset();
  link_.reset();
  if (!dir_.empty()) {
    std::string cmd = "rm -rf '" + dir_ + "'";
    (void)!std::system(cmd.c_str());
  }
}

Status RoguePeer::MakeCertificates(const std::string& dir) {
  return peering::testing::RunMakeCerts({dir, kDaemonName, kName});
}

Status RoguePeer::MakeCrl(const std::string& dir, const std::vector<std::string>& hosts) {
  std::vector<std::string> args{"--crl", dir};
  args.insert(args.end(), hosts.begin(), hosts.end());
  return peering::testing::RunMakeCerts(args);
}

Status RoguePeer::Prepare(const std::string& certs, const std::vector<std::string>& locator_lines,
                          const std::string& crl) {
  if (dir_.empty()) return Status::FromErrno("mkdtemp");
  port_ = FreePort();
  if (port_ == 0) return Status::FromErrno("no free port on 127.0.0.1");
  std::string locator;
  for (const std::string& l : locator_lines) locator += l + "\n";
  config_path_ = dir_ + "/vsocketd.conf";
  std::string conf = std::string("host_name = ") + kDaemonName + "\n" +           //
                     "peer_listen = 127.0.0.1:" + std::to_string(port_) + "\n" +  //
                     "tls_cert = " + certs + "/" + kDaemonName + ".crt\n" +       //
                     "tls_key = " + certs + "/" + kDaemonName + ".key\n" +        //
                     "tls_ca = " + certs + "/ca.crt\n" +                          //
                     "locator = " + dir_ + "/locator\n" +                         //
                     "fabric = tcp\n" +                                           //
                     "links_per_peer = 1\n" +                                     //
                     (crl.empty() ? "" : "tls_crl = " + crl + "\n") +               //
                     "[peer " + kName + "]\n" +
                     // Never dialled: the rogue's name sorts first, so it is
                     // the one that connects.
                     "address = 127.0.0.1:9\n";
  if (!WriteFile(dir_ + "/locator", locator) || !WriteFile(config_path_, conf))
    return Status::FromErrno("writing the daemon's config in " + dir_);
  auto ctx =
      peering::TlsContext::Create({certs + "/" + kName + ".crt", certs + "/" + kName + ".key", certs + "/ca.crt", ""});
  if (!ctx.ok()) return ctx.status();
  ctx_ = std::move(ctx).value();
  return Status::Ok();
}

Status RoguePeer::Connect(Daemon& daemon) {
  // Generous: the daemon shares two cores with end-to-end tests.
  const auto deadline = Clock::now() + 2 * kWait;
  // (Again: a new session; nothing of the last one's channels carries over.)
  link_.reset();
  link_eof_ = false;
  link_in_.clear();
  control_frames_.clear();
  link_frames_.clear();
  error_.clear();
  // 1. The control channel: TLS 1.3, both certificates checked.
  auto fd = ConnectLoopback(port_, deadline);
  if (!fd.ok()) return fd.status();
  tls_ = peering::TlsChannel::Client(*ctx_, std::move(fd).value(), kDaemonName);
  for (;;) {
    auto p = tls_->Handshake();
    if (p == peering::TlsChannel::Progress::kDone) break;
    if (p == peering::TlsChannel::Progress::kFailed) return tls_->error();
    pollfd pfd{tls_->fd(), static_cast<short>(p == peering::TlsChannel::Progress::kWantWrite ? POLLOUT : POLLIN), 0};
    if (poll(&pfd, 1, MsLeft(deadline)) <= 0) return Status(Code::kDeadlineExceeded, "TLS handshake");
  }
  // 2. The data link may only come once the daemon finished its side of the
  // handshake and waits for it (TLS 1.3: the client is done first); else it
  // refuses the hello as one with an unknown key.
  for (;;) {
    Pump(0);
    if (daemon.Stats().find("\"state\":\"waiting-for-link\"") != std::string::npos) break;
    if (!error_.empty()) return Status(Code::kUnavailable, error_);
    if (Clock::now() >= deadline) return Status(Code::kDeadlineExceeded, "the daemon never waited for the link");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto key = tls_->ExportKey(kLinkKeyLabel);
  if (!key.ok()) return key.status();
  auto link = ConnectLoopback(port_, deadline);
  if (!link.ok()) return link.status();
  link_ = std::move(link).value();
  FrameHeader hello;
  hello.type = FrameType::kLinkHello;
  hello.value = 0;  // link index
  hello.aux = 1;    // of one
  if (!SendLink(hello, *key)) return Status(Code::kUnavailable, "link hello: " + error_);
  // 3. The daemon confirms on the TLS channel; the session is up.
  if (!AwaitControl([](const PeerFrame& f) { return f.h.type == FrameType::kLinkReady; },
                    std::chrono::milliseconds(MsLeft(deadline))))
    return Status(Code::kDeadlineExceeded, "no LINK_READY: " + error_);
  return Status::Ok();
}

bool RoguePeer::SendControl(const FrameHeader& h, std::span<const uint8_t> payload) {
  if (!tls_) return false;
  Status st = tls_->Send(EncodeFrame(h, payload));
  if (st.ok()) st = tls_->Flush();
  if (!st.ok()) error_ = "control channel: " + st.message();
  return st.ok();
}

bool RoguePeer::SendLink(const FrameHeader& h, std::span<const uint8_t> payload) {
  return SendLinkBytes(EncodeFrame(h, payload));
}

std::vector<uint8_t> RoguePeer::EncodeFrame(const FrameHeader& h, std::span<const uint8_t> payload) {
  FrameHeader with_len = h;
  with_len.len = static_cast<uint32_t>(payload.size());
  std::vector<uint8_t> out(proto::kFrameHeaderSize + payload.size());
  proto::EncodeFrameHeader(with_len, out.data());
  if (!payload.empty()) std::memcpy(out.data() + proto::kFrameHeaderSize, payload.data(), payload.size());
  return out;
}


bool RoguePeer::SendLinkBytes(std::span<const uint8_t> bytes) {
  if (!link_) return false;
  const auto deadline = Clock::now() + kWait;
  for (size_t off = 0; off < bytes.size();) {
    ssize_t n = send(link_.get(), bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      error_ = std::string("data link: ") + strerror(errno);
      return false;
    }
    // The daemon is not reading: keep taking what it sends meanwhile.
    Pump(std::min(10, MsLeft(deadline)));
    if (Clock::now() >= deadline) {
      error_ = "data link: the daemon took no bytes for 5 s";
      return false;
    }
  }
  return true;
}

void RoguePeer::Pump(int wait_ms) {
  pollfd fds[2];
  nfds_t n = 0;
  if (tls_) fds[n++] = {tls_->fd(), static_cast<short>(POLLIN | (tls_->WantsWrite() ? POLLOUT : 0)), 0};
  if (link_ && !link_eof_) fds[n++] = {link_.get(), POLLIN, 0};
  if (n == 0) return;
  if (poll(fds, n, wait_ms) <= 0) return;
  if (tls_) {  // a failed channel latches its error: Receive() repeats it
    std::vector<std::vector<uint8_t>> msgs;
    Status st = tls_->Receive(&msgs);
    if (st.ok()) st = tls_->Flush();
    for (const auto& m : msgs) {
      if (m.size() < proto::kFrameHeaderSize) {
        error_ = "short control message";
        continue;
      }
      auto h = proto::DecodeFrameHeader(
          std::span<const uint8_t, proto::kFrameHeaderSize>(m.data(), proto::kFrameHeaderSize));
      if (!h.ok()) {
        error_ = "control frame: " + h.status().message();
        continue;
      }
      control_frames_.push_back({*h, std::vector<uint8_t>(m.begin() + proto::kFrameHeaderSize, m.end())});
    }
    if (!st.ok()) error_ = "control channel: " + st.message();
  }
  if (link_ && !link_eof_) {
    uint8_t buf[64 * 1024];
    for (;;) {
      ssize_t got = recv(link_.get(), buf, sizeof(buf), 0);
      if (got > 0) {
        link_in_.insert(link_in_.end(), buf, buf + got);
        continue;
      }
      if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) link_eof_ = true;
      break;
    }
    ParseLink();
  }
}

void RoguePeer::ParseLink() {
  size_t off = 0;
  while (link_in_.size() - off >= proto::kFrameHeaderSize) {
    auto h = proto::DecodeFrameHeader(
        std::span<const uint8_t, proto::kFrameHeaderSize>(link_in_.data() + off, proto::kFrameHeaderSize));
    if (!h.ok()) {
      error_ = "link frame: " + h.status().message();
      link_in_.clear();
      return;
    }
    if (link_in_.size() - off - proto::kFrameHeaderSize < h->len) break;
    auto body = link_in_.begin() + static_cast<ptrdiff_t>(off + proto::kFrameHeaderSize);
    link_frames_.push_back({*h, std::vector<uint8_t>(body, body + h->len)});
    off += proto::kFrameHeaderSize + h->len;
  }
  link_in_.erase(link_in_.begin(), link_in_.begin() + static_cast<ptrdiff_t>(off));
}

std::optional<PeerFrame> RoguePeer::Await(std::vector<PeerFrame>& from, const Match& match,
                                          std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  for (;;) {
    for (auto it = from.begin(); it != from.end(); ++it)
      if (match(*it)) {
        PeerFrame f = std::move(*it);
        from.erase(it);
        return f;
      }
    if (Clock::now() >= deadline) return std::nullopt;
    Pump(std::min(50, MsLeft(deadline)));
  }
}

std::optional<PeerFrame> RoguePeer::AwaitControl(const Match& match, std::chrono::milliseconds limit) {
  return Await(control_frames_, match, limit);
}

std::optional<PeerFrame> RoguePeer::AwaitLink(const Match& match, std::chrono::milliseconds limit) {
  return Await(link_frames_, match, limit);
}

bool RoguePeer::LinkClosedWithin(std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (!link_eof_ && Clock::now() < deadline) Pump(std::min(50, MsLeft(deadline)));
  return link_eof_;
}

}  // namespace vsocket::testing
