#include "host-backend/peering/tls_test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

namespace vsocket::peering::testing {

Result<SocketPair> ConnectedPair() {
  UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener) return Status::FromErrno("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;  // ephemeral
  socklen_t len = sizeof(addr);
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listener.get(), 1) != 0 ||
      ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Status::FromErrno("bind/listen on 127.0.0.1");
  }
  SocketPair pair;
  pair.client.reset(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!pair.client) return Status::FromErrno("socket");
  if (::connect(pair.client.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 && errno != EINPROGRESS) {
    return Status::FromErrno("connect");
  }
  // The loopback handshake completes in the kernel, so a blocking accept
  // returns at once; then wait for the client side to see it too.
  pair.server.reset(::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
  if (!pair.server) return Status::FromErrno("accept");
  pollfd pfd{pair.client.get(), POLLOUT, 0};
  if (::poll(&pfd, 1, 5000) != 1) return Status(Code::kDeadlineExceeded, "connect did not complete");
  int err = 0;
  socklen_t err_len = sizeof(err);
  ::getsockopt(pair.client.get(), SOL_SOCKET, SO_ERROR, &err, &err_len);
  if (err != 0) return Status::FromErrno("connect", err);
  return pair;
}

bool RunUntilDone(const std::vector<Party>& parties, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<short> want(parties.size());
  for (size_t i = 0; i < parties.size(); ++i) want[i] = parties[i].step();
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<size_t> who;
    for (size_t i = 0; i < parties.size(); ++i) {
      if (want[i] == 0) continue;
      fds.push_back(pollfd{parties[i].fd, want[i], 0});
      who.push_back(i);
    }
    if (fds.empty()) return true;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(left.count()));
    if (n < 0 && errno != EINTR) return false;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents != 0) want[who[k]] = parties[who[k]].step();
    }
  }
}

Party HandshakeParty(TlsChannel& ch, TlsChannel::Progress* result) {
  return Party{ch.fd(), [&ch, result]() -> short {
                 *result = ch.Handshake();
                 switch (*result) {
                   case TlsChannel::Progress::kWantRead: return POLLIN;
                   case TlsChannel::Progress::kWantWrite: return POLLOUT;
                   default: return 0;
                 }
               }};
}

Status RunMakeCerts(const std::vector<std::string>& args) {
  // Tests run in their runfiles directory; TEST_SRCDIR makes it explicit.
  // host-backend/peering/make-certs.sh links to deploy/make-certs.sh (see BUILD).
  std::string script = "host-backend/peering/make-certs.sh";
  if (const char* srcdir = std::getenv("TEST_SRCDIR")) {
    const char* workspace = std::getenv("TEST_WORKSPACE");
    script = std::string(srcdir) + "/" + (workspace ? workspace : "vsocket") + "/" + script;
  }
  std::vector<std::string> argv_strings = {"/bin/bash", script};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno("fork");
  if (pid == 0) {
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int wstatus = 0;
  if (::waitpid(pid, &wstatus, 0) != pid) return Status::FromErrno("waitpid");
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    return Status(Code::kInternal, script + " failed (wait status " + std::to_string(wstatus) + ")");
  }
  return Status::Ok();
}

uint64_t Checksum(const std::vector<uint8_t>& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  return h;
}

std::unique_ptr<RawTlsClient> RawTlsClient::Create(UniqueFd fd, const std::string& cert_file,
                                                   const std::string& key_file, int max_version) {
  std::unique_ptr<RawTlsClient> c(new RawTlsClient());
  c->fd_ = std::move(fd);
  c->ctx_ = SSL_CTX_new(TLS_client_method());
  if (c->ctx_ == nullptr) return nullptr;
  if (max_version != 0) {
    SSL_CTX_set_max_proto_version(c->ctx_, max_version);
  } else {
    SSL_CTX_set_min_proto_version(c->ctx_, TLS1_3_VERSION);
  }
  SSL_CTX_set_verify(c->ctx_, SSL_VERIFY_NONE, nullptr);
  if (!cert_file.empty() && (SSL_CTX_use_certificate_chain_file(c->ctx_, cert_file.c_str()) != 1 ||
                             SSL_CTX_use_PrivateKey_file(c->ctx_, key_file.c_str(), SSL_FILETYPE_PEM) != 1)) {
    return nullptr;
  }
  c->ssl_ = SSL_new(c->ctx_);
  if (c->ssl_ == nullptr || SSL_set_fd(c->ssl_, c->fd_.get()) != 1) return nullptr;
  SSL_set_connect_state(c->ssl_);
  return c;
}

RawTlsClient::~RawTlsClient() {
  SSL_free(ssl_);
  SSL_CTX_free(ctx_);
}

short RawTlsClient::Handshake() {
  ERR_clear_error();
  const int r = SSL_do_handshake(ssl_);
  if (r == 1) {
    done_ = true;
    return 0;
  }
  switch (SSL_get_error(ssl_, r)) {
    case SSL_ERROR_WANT_READ: return POLLIN;
    case SSL_ERROR_WANT_WRITE: return POLLOUT;
    default: ERR_clear_error(); return 0;
  }
}

bool RawTlsClient::WriteRaw(const std::vector<uint8_t>& bytes) {
  size_t written = 0;
  ERR_clear_error();
  return SSL_write_ex(ssl_, bytes.data(), bytes.size(), &written) == 1 && written == bytes.size();
}

bool RawTlsClient::RequestKeyUpdate() { return SSL_key_update(ssl_, SSL_KEY_UPDATE_REQUESTED) == 1; }

bool RawTlsClient::ReadSome(std::vector<uint8_t>* got) {
  uint8_t buf[16384];
  for (;;) {
    ERR_clear_error();
    size_t n = 0;
    if (SSL_read_ex(ssl_, buf, sizeof(buf), &n) == 1) {
      got->insert(got->end(), buf, buf + n);
      continue;
    }
    const int e = SSL_get_error(ssl_, 0);
    ERR_clear_error();
    return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE;
  }
}

std::string RawTlsClient::ReadError() {
  uint8_t buf[4096];
  for (;;) {
    ERR_clear_error();
    size_t n = 0;
    const int r = SSL_read_ex(ssl_, buf, sizeof(buf), &n);
    if (r == 1) continue;
    const int e = SSL_get_error(ssl_, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return "";
    const unsigned long code = ERR_get_error();
    ERR_clear_error();
    if (code == 0) return "SSL error " + std::to_string(e);
    const char* reason = ERR_reason_error_string(code);
    return reason ? reason : "unknown";
  }
}

}  // namespace vsocket::peering::testing
