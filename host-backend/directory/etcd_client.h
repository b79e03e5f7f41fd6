// A small etcd v3 client: etcd's JSON gateway (HTTP/1.1, the gRPC API's
// messages as JSON, keys and values base64) through libcurl. One job: the
// key-value, lease and watch calls the cluster directory needs, each with a
// timeout, every failure a Status. See docs/decisions/080 for why the
// gateway and not gRPC.
//
// Calls are blocking and may come from any thread at once (each makes its
// own curl handle). With several endpoints, a call that cannot reach one
// tries the next, and later calls start where the last one succeeded.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"

namespace vsocket::directory {

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

struct EtcdRange {
  std::vector<EtcdKeyValue> kvs;
  int64_t revision = 0;  // the store's revision the read saw
};

struct EtcdEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  EtcdKeyValue kv;  // kDelete: key and mod_revision (the deletion's) only
};

struct EtcdClientOptions {
  // Timeouts alone (the rest as default).
  static EtcdClientOptions Timeouts(int timeout_ms, int connect_timeout_ms, int watch_create_timeout_ms) {
    EtcdClientOptions o;
    o.timeout_ms = timeout_ms;
    o.connect_timeout_ms = connect_timeout_ms;
    o.watch_create_timeout_ms = watch_create_timeout_ms;
    return o;
  }
  int timeout_ms = 2000;          // a whole unary call, per endpoint tried
  int connect_timeout_ms = 1000;  // TCP connect, per endpoint tried
  // A watch whose stream has not said "created" by then is given up.
  int watch_create_timeout_ms = 2000;
  // GetPrefix reads in pages of this many keys (0: one response).
  int range_page_keys = 1000;
  // etcd's auth (RBAC, docs/multi-host.md "Permissions"): with a user, every
  // call carries a token from /v3/auth/authenticate, fetched at the first
  // call and again when etcd says it is no longer valid.
  std::string user;
  std::string password;
  // TLS (https to every endpoint) when `tls`: etcd's certificate is checked
  // against `ca_file` (empty: the system's CAs) and the endpoint's name;
  // `cert_file`/`key_file` are this host's client certificate, which etcd
  // started with --client-cert-auth requires. With etcd's auth on as well,
  // its gateway refuses a certificate that has a CommonName (it cannot pass
  // the CN on as the user): the certificate then has none, and the user is
  // `user`, by password.
  bool tls = false;
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

class EtcdClient {
 public:
  // `endpoints`: HOST:PORT each (http, or https with options.tls).
  explicit EtcdClient(std::vector<std::string> endpoints, EtcdClientOptions options = {});

  // The store's revision after the put.
  Result<int64_t> Put(const std::string& key, const std::string& value, int64_t lease = 0);
  // Puts every (key, value) under `lease`, in transactions of up to
  // kMaxTxnPuts puts (each all or nothing; etcd's --max-txn-ops default is
  // 128): the revision after the last.
  static constexpr size_t kMaxTxnPuts = 100;
  Result<int64_t> PutAll(const std::vector<std::pair<std::string, std::string>>& kvs, int64_t lease = 0);
  // Every key starting with `prefix`, as of one revision: `at_revision`
  // if given (several prefixes read as of one moment), else the store's
  // latest (read in pages of options.range_page_keys; kOutOfRange if that
  // revision is compacted, or compacted between two pages).
  Result<EtcdRange> GetPrefix(const std::string& prefix, int64_t at_revision = 0);
  // Deletes every key starting with `prefix`: how many there were.
  Result<int64_t> DeletePrefix(const std::string& prefix);
  // Deletes the key `key` alone: 1, or 0 if there was none.
  Result<int64_t> Delete(const std::string& key);
  // A lease of `ttl_s` seconds (etcd may round it up to its minimum): its ID.
  Result<int64_t> GrantLease(int ttl_s);
  // Renews the lease: its TTL in seconds. kNotFound once it has expired (or
  // was revoked): its keys are gone.
  Result<int64_t> KeepAlive(int64_t lease);
  // Ends the lease now, deleting its keys.
  Status Revoke(int64_t lease);
  // Forgets history up to `revision` (watches from before it fail).
  Status Compact(int64_t revision);

  // Streams the changes of keys under `prefix` from `start_revision` on:
  // `on_change` gets each batch (and an empty one when the watch is set up)
  // with the highest revision in it (0 for the empty one). Returns when
  // `on_change` returns false or `*stop` is set (Ok), when the stream ends
  // or fails (kUnavailable), or with kOutOfRange when `start_revision` was
  // compacted (*compact_revision: the oldest still available). A dead
  // server is noticed by TCP keepalive within about 15 s.
  using WatchFn = std::function<bool(int64_t revision, const std::vector<EtcdEvent>& events)>;
  Status Watch(const std::string& prefix, int64_t start_revision, const WatchFn& on_change,
               const std::atomic<bool>* stop, int64_t* compact_revision);

  // Several prefixes watched on one stream (one HTTP response, one TCP
  // connection: a create_request each, etcd's watch IDs told apart), each
  // from its own start revision. `on_change` gets each batch with the index
  // of its range in `ranges` and the highest revision in it, and one empty
  // batch (range 0, revision 0) once every watch is set up. Ends as Watch.
  struct Range {
    std::string prefix;
    int64_t start_revision = 0;
  };
  using RangesFn = std::function<bool(size_t range, int64_t revision, const std::vector<EtcdEvent>& events)>;
  Status WatchRanges(const std::vector<Range>& ranges, const RangesFn& on_change, const std::atomic<bool>* stop,
                     int64_t* compact_revision);

  // An administrative call (/v3/auth/...) whose reply says nothing but
  // success; `json_body` is the request message as JSON.
  Status Admin(const std::string& path, const std::string& json_body);

  // The endpoint the next call tries first.
  std::string endpoint() const;
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  bool tls() const { return options_.tls; }

 private:
  struct Reply;
  // POSTs `body` to `path` on each endpoint in turn until one answers;
  // with a user, as that user (a token refused as invalid is renewed once).
  Result<std::string> Call(const std::string& path, const std::string& body);
  Result<std::string> CallOnce(const std::string& path, const std::string& body, const std::string& token);
  // The auth token ("" without a user); `renew` forgets the one held.
  Result<std::string> Token(bool renew) EXCLUDES(token_mu_);

  const std::vector<std::string> endpoints_;
  const EtcdClientOptions options_;
  std::atomic<size_t> current_{0};  // index into endpoints_ of the last that answered
  Mutex token_mu_;
  std::string token_ GUARDED_BY(token_mu_);
};

// The end of the key range holding every key that starts with `prefix`
// (etcd's range_end: the prefix with its last byte incremented).
std::string PrefixEnd(const std::string& prefix);

// Standard base64, as the gateway carries keys and values.
std::string Base64(const std::string& in);

}  // namespace vsocket::directory
