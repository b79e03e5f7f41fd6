#include "host-backend/directory/etcd_client.h"

#include <curl/curl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

namespace vsocket::directory {
namespace {

using Json = nlohmann::json;

// Decodes standard base64 (padding optional); false on any other byte.
bool Unbase64(const std::string& in, std::string* out) {
  out->clear();
  uint32_t acc = 0;
  int bits = 0;
  for (char ch : in) {
    int v;
    if (ch >= 'A' && ch <= 'Z') v = ch - 'A';
    else if (ch >= 'a' && ch <= 'z') v = ch - 'a' + 26;
    else if (ch >= '0' && ch <= '9') v = ch - '0' + 52;
    else if (ch == '+') v = 62;
    else if (ch == '/') v = 63;
    else if (ch == '=') break;
    else return false;
    acc = acc << 6 | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      *out += char((acc >> bits) & 0xff);
    }
  }
  return true;
}

// etcd's gateway writes int64 fields as strings ("revision":"42"); absent
// means 0 (proto3 defaults are left out).
int64_t Int(const Json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) return std::strtoll(it->get<std::string>().c_str(), nullptr, 10);
  return 0;
}

bool KeyValueOf(const Json& j, EtcdKeyValue* kv) {
  if (!Unbase64(j.value("key", ""), &kv->key) || !Unbase64(j.value("value", ""), &kv->value)) return false;
  kv->mod_revision = Int(j, "mod_revision");
  kv->lease = Int(j, "lease");
  return true;
}

// A gateway error body ({"error","code","message"}) as a Status: gRPC codes
// NOT_FOUND (5) and OUT_OF_RANGE (11, a compacted revision) keep their
// meaning; anything else is the server's problem.
Status ErrorOf(const Json& j, const std::string& what) {
  int64_t code = Int(j, "code");
  std::string msg = what + ": " + j.value("message", j.value("error", std::string("error")));
  if (code == 5) return Status(Code::kNotFound, msg);
  if (code == 11) return Status(Code::kOutOfRange, msg);
  // PERMISSION_DENIED (RBAC), UNAUTHENTICATED (a bad token), and the two
  // INVALID_ARGUMENTs of auth: a wrong password, no user at all.
  if (code == 7 || code == 16 || msg.find("authentication failed") != std::string::npos ||
      msg.find("user name is empty") != std::string::npos)
    return Status(Code::kPermissionDenied, msg);
  if (code == 3) return Status(Code::kInvalidArgument, msg);
  return Status(Code::kUnavailable, msg);
}

Result<Json> Parse(const std::string& body, const std::string& what) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    std::string text = body.substr(0, 200);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    // etcd's gateway refuses, as plain text, a client certificate with a
    // CommonName when its auth is on (it cannot pass the CN on as the user).
    if (text.find("CommonName") != std::string::npos) return Status(Code::kPermissionDenied, what + ": " + text);
    return Status(Code::kDataLoss, what + ": reply is not JSON: " + text);
  }
  if (j.contains("error") || (j.contains("code") && !j.contains("header") && !j.contains("result")))
    return ErrorOf(j, what);
  return j;
}

void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};
using CurlPtr = std::unique_ptr<CURL, CurlDeleter>;

size_t AppendBody(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

// A dead peer under an idle watch: keepalive probes after 5 s idle, and the
// kernel gives up on unacknowledged data after 10 s.
int TuneSocket(void*, curl_socket_t fd, curlsocktype) {
  int idle = 5, interval = 2, count = 3, user_timeout_ms = 10000;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms));
  return CURL_SOCKOPT_OK;
}

// One POST of JSON to http(s)://endpoint/path; the caller sets the writer.
CurlPtr NewRequest(const std::string& endpoint, const std::string& path, const std::string& body,
                   const curl_slist* headers, const EtcdClientOptions& o) {
  InitCurlOnce();
  CurlPtr c(curl_easy_init());
  if (!c) return c;
  std::string url = (o.tls ? "https://" : "http://") + endpoint + path;
  if (o.tls) {
    // (curl verifies the peer's certificate and name by default; said anyway)
    curl_easy_setopt(c.get(), CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(c.get(), CURLOPT_SSL_VERIFYHOST, 2L);
    if (!o.ca_file.empty()) curl_easy_setopt(c.get(), CURLOPT_CAINFO, o.ca_file.c_str());
    if (!o.cert_file.empty()) curl_easy_setopt(c.get(), CURLOPT_SSLCERT, o.cert_file.c_str());
    if (!o.key_file.empty()) curl_easy_setopt(c.get(), CURLOPT_SSLKEY, o.key_file.c_str());
  }
  curl_easy_setopt(c.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(c.get(), CURLOPT_NOPROXY, "*");  // never an http_proxy from the environment
  curl_easy_setopt(c.get(), CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c.get(), CURLOPT_POST, 1L);
  curl_easy_setopt(c.get(), CURLOPT_POSTFIELDSIZE, long(body.size()));
  curl_easy_setopt(c.get(), CURLOPT_COPYPOSTFIELDS, body.c_str());
  curl_easy_setopt(c.get(), CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c.get(), CURLOPT_CONNECTTIMEOUT_MS, long(o.connect_timeout_ms));
  curl_easy_setopt(c.get(), CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(c.get(), CURLOPT_SOCKOPTFUNCTION, TuneSocket);
  return c;
}

// The gateway hands an Authorization header to etcd as the token.
std::unique_ptr<curl_slist, SlistDeleter> JsonHeaders(const std::string& token) {
  curl_slist* l = curl_slist_append(nullptr, "Content-Type: application/json");
  if (!token.empty()) l = curl_slist_append(l, ("Authorization: " + token).c_str());
  return std::unique_ptr<curl_slist, SlistDeleter>(l);
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The watch stream's state, shared with curl's callbacks.
struct WatchState {
  const EtcdClient::RangesFn* on_change = nullptr;
  const std::atomic<bool>* stop = nullptr;
  int64_t create_deadline_ms = 0;
  size_t ranges = 1;                   // create_requests sent, in order
  std::map<int64_t, size_t> range_of;  // etcd's watch ID -> index of its range
  bool created = false;                // every watch is set up
  bool done = false;  // on_change said stop
  Status error;       // the stream said something that ends it
  int64_t compact_revision = 0;
  std::string pending;  // bytes of an incomplete message
};

// A watch etcd canceled for another reason than compaction: refused (RBAC,
// an invalid token) or given up by the server.
Status CanceledStatus(const std::string& reason) {
  bool refused = reason.find("PermissionDenied") != std::string::npos ||
                 reason.find("permission denied") != std::string::npos ||
                 reason.find("auth token") != std::string::npos;
  return Status(refused ? Code::kPermissionDenied : Code::kUnavailable, "watch canceled: " + reason);
}

// Whether a reply is etcd's "etcdserver: invalid auth token" (the token
// expired, or the member restarted and forgot it).
bool InvalidToken(const std::string& reply) {
  if (reply.find("auth token") == std::string::npos) return false;
  Json j = Json::parse(reply, nullptr, false);
  return j.is_object() && Int(j, "code") == 16;
}

// One message of the stream: {"result":{...}} (or {"error":{...}}).
bool OnWatchMessage(WatchState* w, const std::string& text) {
  Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    w->error = Status(Code::kDataLoss, "watch: message is not JSON");
    return false;
  }
  if (j.contains("error")) {
    const Json& e = j["error"];
    w->error = e.is_object() ? ErrorOf(e, "watch") : Status(Code::kUnavailable, "watch: " + e.dump());
    return false;
  }
  const Json& r = j.contains("result") ? j["result"] : j;
  if (r.value("canceled", false)) {
    w->compact_revision = Int(r, "compact_revision");
    w->error = w->compact_revision > 0
                   ? Status(Code::kOutOfRange,
                            "watch: revision compacted (oldest kept: " + std::to_string(w->compact_revision) + ")")
                   : CanceledStatus(r.value("cancel_reason", std::string("?")));
    return false;
  }
  // etcd answers the create_requests in the order they were sent, each
  // "created" naming its watch's ID (absent: 0, proto3's default), and
  // sends a watch's events only after its "created".
  int64_t id = Int(r, "watch_id");
  if (r.value("created", false)) {
    if (w->range_of.size() >= w->ranges || w->range_of.count(id) != 0) {
      w->error = Status(Code::kDataLoss, "watch: more watches set up than asked for");
      return false;
    }
    size_t index = w->range_of.size();
    w->range_of[id] = index;
    if (w->range_of.size() == w->ranges) {
      w->created = true;
      if (!(*w->on_change)(0, 0, {})) {
        w->done = true;
        return false;
      }
    }
    return true;
  }
  auto range = w->range_of.find(id);
  if (range == w->range_of.end()) {
    w->error = Status(Code::kDataLoss, "watch: events for a watch never set up (" + std::to_string(id) + ")");
    return false;
  }
  std::vector<EtcdEvent> events;
  int64_t revision = 0;
  if (auto it = r.find("events"); it != r.end() && it->is_array()) {
    for (const Json& e : *it) {
      EtcdEvent ev;
      ev.type = e.value("type", std::string("PUT")) == "DELETE" ? EtcdEvent::Type::kDelete : EtcdEvent::Type::kPut;
      if (!e.contains("kv") || !KeyValueOf(e["kv"], &ev.kv)) {
        w->error = Status(Code::kDataLoss, "watch: event without a key");
        return false;
      }
      revision = std::max(revision, ev.kv.mod_revision);
      events.push_back(std::move(ev));
    }
  }
  if (events.empty()) return true;  // (a progress notice: none are asked for)
  if (!(*w->on_change)(range->second, revision, events)) {
    w->done = true;
    return false;
  }
  return true;
}

// Messages are JSON objects, one per line.
size_t OnWatchBytes(char* data, size_t size, size_t n, void* user) {
  auto* w = static_cast<WatchState*>(user);
  w->pending.append(data, size * n);
  for (size_t nl; (nl = w->pending.find('\n')) != std::string::npos;) {
    std::string line = w->pending.substr(0, nl);
    w->pending.erase(0, nl + 1);
    if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
    if (!OnWatchMessage(w, line)) return 0;  // (ends the transfer)
  }
  return size * n;
}

// Called by curl at least once a second while the stream is idle.
int OnWatchProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* w = static_cast<WatchState*>(user);
  if (w->stop != nullptr && w->stop->load(std::memory_order_relaxed)) {
    w->done = true;
    return 1;
  }
  if (!w->created && NowMs() > w->create_deadline_ms) {
    w->error = Status(Code::kDeadlineExceeded, "watch: not set up in time");
    return 1;
  }
  return 0;
}

}  // namespace

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string Base64(const std::string& in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = uint8_t(in[i]) << 16 | uint8_t(in[i + 1]) << 8 | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kBase64[(v >> s) & 63];
  }
  if (i + 1 == in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    out += kBase64[v >> 18];
    out += kBase64[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    uint32_t v = uint8_t(in[i]) << 16 | uint8_t(in[i + 1]) << 8;
    out += kBase64[v >> 18];
    out += kBase64[(v >> 12) & 63];
    out += kBase64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (uint8_t(end.back()) < 0xff) {
      end.back() = char(uint8_t(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

EtcdClient::EtcdClient(std::vector<std::string> endpoints, EtcdClientOptions options)
    : endpoints_(std::move(endpoints)), options_(options) {}

std::string EtcdClient::endpoint() const {
  return endpoints_.empty() ? "" : endpoints_[current_.load() % endpoints_.size()];
}

Result<std::string> EtcdClient::Token(bool renew) {
  if (options_.user.empty()) return std::string();
  {
    MutexLock lock(token_mu_);
    if (renew) token_.clear();
    if (!token_.empty()) return token_;
  }
  Json req = {{"name", options_.user}, {"password", options_.password}};
  auto body = CallOnce("/v3/auth/authenticate", req.dump(), "");
  if (!body.ok()) return body.status();
  auto j = Parse(*body, "authenticate as " + options_.user);
  if (!j.ok()) return j.status();
  std::string token = j->value("token", "");
  if (token.empty()) return Status(Code::kPermissionDenied, "authenticate as " + options_.user + ": no token");
  MutexLock lock(token_mu_);
  token_ = token;
  return token;
}

Result<std::string> EtcdClient::Call(const std::string& path, const std::string& body) {
  auto token = Token(false);
  if (!token.ok()) return token.status();
  auto reply = CallOnce(path, body, *token);
  if (!reply.ok() || token->empty() || !InvalidToken(*reply)) return reply;
  token = Token(true);  // expired (etcd's --auth-token-ttl) or forgotten: once more with a new one
  if (!token.ok()) return token.status();
  return CallOnce(path, body, *token);
}

Result<std::string> EtcdClient::CallOnce(const std::string& path, const std::string& body, const std::string& token) {
  if (endpoints_.empty()) return Status(Code::kFailedPrecondition, "etcd: no endpoints");
  auto headers = JsonHeaders(token);
  std::string errors;
  size_t first = current_.load();
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    size_t at = (first + i) % endpoints_.size();
    CurlPtr c = NewRequest(endpoints_[at], path, body, headers.get(), options_);
    if (!c) return Status(Code::kResourceExhausted, "etcd: curl_easy_init failed");
    std::string reply;
    curl_easy_setopt(c.get(), CURLOPT_TIMEOUT_MS, long(options_.timeout_ms));
    curl_easy_setopt(c.get(), CURLOPT_WRITEFUNCTION, AppendBody);
    curl_easy_setopt(c.get(), CURLOPT_WRITEDATA, &reply);
    CURLcode rc = curl_easy_perform(c.get());
    if (rc == CURLE_OK) {
      current_.store(at);
      return reply;  // (an HTTP error's body says which: Parse)
    }
    errors += std::string(errors.empty() ? "" : "; ") + endpoints_[at] + ": " + curl_easy_strerror(rc);
  }
  return Status(Code::kUnavailable, "etcd " + path + ": " + errors);
}

Status EtcdClient::Admin(const std::string& path, const std::string& json_body) {
  auto body = Call(path, json_body);
  if (!body.ok()) return body.status();
  return Parse(*body, path).status();
}

Result<int64_t> EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  Json req = {{"key", Base64(key)}, {"value", Base64(value)}};
  if (lease != 0) req["lease"] = std::to_string(lease);
  auto body = Call("/v3/kv/put", req.dump());
  if (!body.ok()) return body.status();
  auto j = Parse(*body, "put " + key);
  if (!j.ok()) return j.status();
  return Int((*j)["header"], "revision");
}

Result<int64_t> EtcdClient::PutAll(const std::vector<std::pair<std::string, std::string>>& kvs, int64_t lease) {
  int64_t revision = 0;
  for (size_t at = 0; at < kvs.size(); at += kMaxTxnPuts) {
    Json ops = Json::array();
    for (size_t i = at; i < std::min(kvs.size(), at + kMaxTxnPuts); ++i) {
      Json put = {{"key", Base64(kvs[i].first)}, {"value", Base64(kvs[i].second)}};
      if (lease != 0) put["lease"] = std::to_string(lease);
      ops.push_back({{"request_put", put}});
    }
    auto body = Call("/v3/kv/txn", Json{{"success", ops}}.dump());
    if (!body.ok()) return body.status();
    auto j = Parse(*body, "txn of " + std::to_string(ops.size()) + " puts");
    if (!j.ok()) return j.status();
    revision = Int((*j)["header"], "revision");
  }
  return revision;
}

Result<EtcdRange> EtcdClient::GetPrefix(const std::string& prefix, int64_t at_revision) {
  // In pages of range_page_keys, every page at the first one's revision:
  // one consistent view without one response as large as the directory
  // (104 MB of JSON at 10,000 hosts x 50 VMs: decision 89).
  EtcdRange range;
  range.revision = at_revision;
  const std::string end = PrefixEnd(prefix);
  std::string from = prefix;
  for (int page = 0;; ++page) {
    Json req = {{"key", Base64(from)}, {"range_end", Base64(end)}};
    if (options_.range_page_keys > 0) req["limit"] = std::to_string(options_.range_page_keys);
    if (page > 0 || at_revision > 0) req["revision"] = std::to_string(range.revision);
    auto body = Call("/v3/kv/range", req.dump());
    if (!body.ok()) return body.status();
    auto j = Parse(*body, "range " + prefix);
    if (!j.ok()) return j.status();
    if (page == 0 && at_revision == 0) range.revision = Int((*j)["header"], "revision");
    size_t before = range.kvs.size();
    if (auto it = j->find("kvs"); it != j->end() && it->is_array())
      for (const Json& e : *it) {
        EtcdKeyValue kv;
        if (!KeyValueOf(e, &kv)) return Status(Code::kDataLoss, "range " + prefix + ": a key is not base64");
        range.kvs.push_back(std::move(kv));
      }
    if (!j->value("more", false)) return range;
    if (range.kvs.size() == before)
      return Status(Code::kDataLoss, "range " + prefix + ": 'more' with an empty page");
    from = range.kvs.back().key + std::string(1, '\0');  // (the next key after the last)
  }
}

Result<int64_t> EtcdClient::DeletePrefix(const std::string& prefix) {
  Json req = {{"key", Base64(prefix)}, {"range_end", Base64(PrefixEnd(prefix))}};
  auto body = Call("/v3/kv/deleterange", req.dump());
  if (!body.ok()) return body.status();
  auto j = Parse(*body, "delete " + prefix);
  if (!j.ok()) return j.status();
  return Int(*j, "deleted");
}

Result<int64_t> EtcdClient::Delete(const std::string& key) {
  auto body = Call("/v3/kv/deleterange", Json{{"key", Base64(key)}}.dump());
  if (!body.ok()) return body.status();
  auto j = Parse(*body, "delete " + key);
  if (!j.ok()) return j.status();
  return Int(*j, "deleted");
}

Result<int64_t> EtcdClient::GrantLease(int ttl_s) {
  auto body = Call("/v3/lease/grant", Json{{"TTL", std::to_string(ttl_s)}}.dump());
  if (!body.ok()) return body.status();
  auto j = Parse(*body, "lease grant");
  if (!j.ok()) return j.status();
  int64_t id = Int(*j, "ID");
  if (id == 0) return Status(Code::kUnavailable, "lease grant: " + j->value("error", std::string("no ID")));
  return id;
}

Result<int64_t> EtcdClient::KeepAlive(int64_t lease) {
  // A stream in gRPC; the gateway answers one request with one message.
  auto body = Call("/v3/lease/keepalive", Json{{"ID", std::to_string(lease)}}.dump());
  if (!body.ok()) return body.status();
  auto j = Parse(*body, "lease keepalive");
  if (!j.ok()) return j.status();
  const Json& r = j->contains("result") ? (*j)["result"] : *j;
  int64_t ttl = Int(r, "TTL");
  if (ttl <= 0) return Status(Code::kNotFound, "lease " + std::to_string(lease) + " has expired");
  return ttl;
}

Status EtcdClient::Revoke(int64_t lease) {
  auto body = Call("/v3/lease/revoke", Json{{"ID", std::to_string(lease)}}.dump());
  if (!body.ok()) return body.status();
  return Parse(*body, "lease revoke").status();
}

Status EtcdClient::Compact(int64_t revision) {
  auto body = Call("/v3/kv/compaction", Json{{"revision", std::to_string(revision)}}.dump());
  if (!body.ok()) return body.status();
  return Parse(*body, "compact").status();
}

Status EtcdClient::Watch(const std::string& prefix, int64_t start_revision, const WatchFn& on_change,
                         const std::atomic<bool>* stop, int64_t* compact_revision) {
  RangesFn each = [&](size_t, int64_t revision, const std::vector<EtcdEvent>& events) {
    return on_change(revision, events);
  };
  return WatchRanges({{prefix, start_revision}}, each, stop, compact_revision);
}

Status EtcdClient::WatchRanges(const std::vector<Range>& ranges, const RangesFn& on_change,
                               const std::atomic<bool>* stop, int64_t* compact_revision) {
  if (endpoints_.empty()) return Status(Code::kFailedPrecondition, "etcd: no endpoints");
  if (ranges.empty()) return Status(Code::kInvalidArgument, "etcd: a watch of nothing");
  // The gateway reads the request body as a stream of WatchRequests, one
  // JSON object after the other, and sends each on the gRPC stream.
  std::string body;
  for (const Range& r : ranges) {
    Json create = {{"key", Base64(r.prefix)}, {"range_end", Base64(PrefixEnd(r.prefix))}};
    if (r.start_revision > 0) create["start_revision"] = std::to_string(r.start_revision);
    body += Json{{"create_request", create}}.dump() + "\n";
  }
  auto token = Token(false);
  if (!token.ok()) return token.status();
  auto headers = JsonHeaders(*token);
  size_t at = current_.load() % endpoints_.size();
  CurlPtr c = NewRequest(endpoints_[at], "/v3/watch", body, headers.get(), options_);
  if (!c) return Status(Code::kResourceExhausted, "etcd: curl_easy_init failed");
  WatchState w;
  w.on_change = &on_change;
  w.stop = stop;
  w.ranges = ranges.size();
  w.create_deadline_ms = NowMs() + options_.watch_create_timeout_ms;
  curl_easy_setopt(c.get(), CURLOPT_WRITEFUNCTION, OnWatchBytes);
  curl_easy_setopt(c.get(), CURLOPT_WRITEDATA, &w);
  curl_easy_setopt(c.get(), CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c.get(), CURLOPT_XFERINFOFUNCTION, OnWatchProgress);
  curl_easy_setopt(c.get(), CURLOPT_XFERINFODATA, &w);
  CURLcode rc = curl_easy_perform(c.get());
  if (w.done) return Status::Ok();
  if (!w.error.ok()) {
    if (compact_revision != nullptr) *compact_revision = w.compact_revision;
    if (w.error.code() == Code::kPermissionDenied && !token->empty()) (void)Token(true);  // (maybe only expired)
    return w.error;
  }
  // Another endpoint next time (this one failed or closed the stream).
  if (endpoints_.size() > 1) current_.store((at + 1) % endpoints_.size());
  if (rc != CURLE_OK) return Status(Code::kUnavailable, "watch on " + endpoints_[at] + ": " + curl_easy_strerror(rc));
  return Status(Code::kUnavailable, "watch on " + endpoints_[at] + ": the stream ended");
}

}  // namespace vsocket::directory
