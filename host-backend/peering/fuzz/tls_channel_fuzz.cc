// libFuzzer target for the framing of the TLS control channel between
// vsocketds: TlsChannel::Receive (the server side, as the daemon runs it)
// cutting the plaintext a peer sends after the handshake into
// length-prefixed messages. The peer is a raw OpenSSL client (it can send
// any plaintext, in records the fuzzer sizes); OpenSSL itself is not the
// target.
//
// Input: byte 0 = k; the last k bytes are the write schedule (one byte per
// step: 0 = the server calls Receive(); otherwise the client writes up to
// that many bytes, times 512 above 127, in one SSL_write, and the server
// calls Receive()); the bytes between are the plaintext. After the
// schedule the client writes the rest in 16 KiB writes.
//
// Properties: no crash; the messages received are exactly the complete
// messages of the plaintext (u32 little-endian length, then the bytes), in
// order; a length over kMaxMessage fails the channel with kDataLoss after
// the messages before it, and nothing else fails it.
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/unique_fd.h"
#include "host-backend/peering/tls_channel.h"
#include "host-backend/peering/tls_test_util.h"

namespace {

using vsocket::UniqueFd;
using vsocket::peering::TlsChannel;
using vsocket::peering::TlsConfig;
using vsocket::peering::TlsContext;
using vsocket::peering::testing::RawTlsClient;

struct Files {
  std::string cert, key;
};

// A self-signed P-256 certificate (CN fuzz-host, CA:TRUE, both TLS key
// usages) and its key, in a fresh directory: the server's own identity,
// its CA, and the client's.
Files MakeIdentity() {
  char dir[] = "/tmp/tls_channel_fuzz-XXXXXX";
  if (mkdtemp(dir) == nullptr) std::abort();
  Files f{std::string(dir) + "/cert.pem", std::string(dir) + "/key.pem"};
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* x = X509_new();
  if (key == nullptr || x == nullptr) std::abort();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
  X509_gmtime_adj(X509_getm_notBefore(x), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x), 365L * 24 * 3600);
  X509_set_pubkey(x, key);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("fuzz-host"), -1, -1, 0);
  X509_set_issuer_name(x, name);
  X509V3_CTX v3;
  X509V3_set_ctx_nodb(&v3);
  X509V3_set_ctx(&v3, x, x, nullptr, nullptr, 0);
  for (const char* ext : {"basicConstraints=critical,CA:TRUE", "subjectAltName=DNS:fuzz-host",
                          "extendedKeyUsage=serverAuth,clientAuth"}) {
    std::string kv = ext;
    size_t eq = kv.find('=');
    X509_EXTENSION* e = X509V3_EXT_conf(nullptr, &v3, kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str());
    if (e == nullptr) std::abort();
    X509_add_ext(x, e, -1);
    X509_EXTENSION_free(e);
  }
  if (X509_sign(x, key, EVP_sha256()) == 0) std::abort();
  FILE* c = std::fopen(f.cert.c_str(), "w");
  FILE* k = std::fopen(f.key.c_str(), "w");
  if (c == nullptr || k == nullptr || fchmod(fileno(k), 0600) != 0) std::abort();
  if (PEM_write_X509(c, x) != 1 || PEM_write_PrivateKey(k, key, nullptr, nullptr, 0, nullptr, nullptr) != 1)
    std::abort();
  std::fclose(c);
  std::fclose(k);
  X509_free(x);
  EVP_PKEY_free(key);
  return f;
}

struct Env {
  Files files = MakeIdentity();
  std::unique_ptr<TlsContext> ctx;
  Env() {
    auto c = TlsContext::Create(TlsConfig{files.cert, files.key, files.cert});
    if (!c.ok()) {
      std::fprintf(stderr, "tls_channel_fuzz: %s\n", c.status().ToString().c_str());
      std::abort();
    }
    ctx = std::move(*c);
  }
};

Env& env() {
  static Env* e = [] {
    auto* made = new Env();
    // The identity's files are read for every input's client; they go when
    // the run ends (libFuzzer exits through exit() at -max_total_time).
    std::atexit([] {
      const Files& f = env().files;
      std::remove(f.cert.c_str());
      std::remove(f.key.c_str());
      rmdir(f.cert.substr(0, f.cert.rfind('/')).c_str());
    });
    return made;
  }();
  return *e;
}

// The messages a correct receiver takes from `plain`, and whether a
// length over the limit stops it.
struct Expected {
  std::vector<std::vector<uint8_t>> messages;
  bool oversize = false;
};
Expected Frame(std::span<const uint8_t> plain) {
  Expected e;
  size_t pos = 0;
  while (plain.size() - pos >= 4) {
    uint32_t len = uint32_t{plain[pos]} | uint32_t{plain[pos + 1]} << 8 | uint32_t{plain[pos + 2]} << 16 |
                   uint32_t{plain[pos + 3]} << 24;
    if (len > TlsChannel::kMaxMessage) {
      e.oversize = true;
      break;
    }
    if (plain.size() - pos - 4 < len) break;
    e.messages.emplace_back(plain.begin() + pos + 4, plain.begin() + pos + 4 + len);
    pos += 4 + len;
  }
  return e;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  env();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  size_t k = std::min<size_t>(data[0], size - 1);
  std::span<const uint8_t> plain(data + 1, size - 1 - k);
  std::span<const uint8_t> schedule(data + size - k, k);

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
  auto server = TlsChannel::Server(*env().ctx, UniqueFd(sv[0]));
  auto client = RawTlsClient::Create(UniqueFd(sv[1]), env().files.cert, env().files.key);
  if (client == nullptr) std::abort();
  TlsChannel::Progress p = TlsChannel::Progress::kWantRead;
  for (int i = 0; i < 64 && (p != TlsChannel::Progress::kDone || !client->handshake_done()); ++i) {
    if (!client->handshake_done()) client->Handshake();
    if (p != TlsChannel::Progress::kDone) p = server->Handshake();
    if (p == TlsChannel::Progress::kFailed) {
      std::fprintf(stderr, "handshake: %s\n", server->error().ToString().c_str());
      std::abort();
    }
  }
  if (p != TlsChannel::Progress::kDone || !client->handshake_done()) std::abort();

  std::vector<std::vector<uint8_t>> got;
  vsocket::Status st;
  auto receive = [&] {
    if (st.ok()) st = server->Receive(&got);
  };
  size_t pos = 0;
  auto write = [&](size_t n) {
    std::vector<uint8_t> chunk(plain.begin() + pos, plain.begin() + pos + n);
    // A full socket: the server reads, the client retries the same write.
    for (int tries = 0; !client->WriteRaw(chunk); ++tries) {
      if (tries > 1000 || !st.ok()) return;
      receive();
    }
    pos += n;
  };
  for (uint8_t s : schedule) {
    if (s != 0 && pos < plain.size()) write(std::min<size_t>(plain.size() - pos, s < 128 ? s : (s - 127) * 512u));
    receive();
  }
  while (pos < plain.size() && st.ok()) {
    write(std::min<size_t>(plain.size() - pos, 16384));
    receive();
  }
  for (int i = 0; i < 8; ++i) receive();  // whatever a budget left behind

  Expected want = Frame(plain.first(pos));
  if (want.oversize) {
    if (st.code() != vsocket::Code::kDataLoss) std::abort();
  } else if (!st.ok()) {
    std::fprintf(stderr, "receive failed: %s\n", st.ToString().c_str());
    std::abort();
  }
  if (got != want.messages) std::abort();
  return 0;
}
