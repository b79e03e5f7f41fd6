// vsocket-agent-probe: an application process of the VM taking the vSocket
// device from vsocket-guestd through AgentTransport (the guest session's
// transport in a VM) and using nothing but the Transport interface: event
// buffers posted, HELLO, checksummed ECHOes, each answer awaited on the
// wake-up fd the agent signals. What libvsocket's session will do in a VM.
//
// --steal ADDR PORT: the socket proofs of decision 100. A child process
// opens a TCP connection on ADDR (listening on PORT) and holds both ends;
// this process, which holds neither, registers the child's connection on
// its own device and must be refused (SPOOFED_ADDRESS), also after proving
// a socket of its own; then it proves its own connection to the agent and
// registers it, which must be taken; then a look-alike connection made in
// a network namespace of its own, with the VM's ADDR on its loopback: the
// agent must refuse its proof and vsocketd its registration (decision 127).
//
// --garbage KIND: a hostile process of the VM. After HELLO it writes
// garbage into its own request queue and kicks: KIND outside, a request
// whose descriptor points beyond the VM's memory; huge, a descriptor of
// 2 GiB at its own ring memory; chain, a descriptor whose next index is
// out of the queue. It prints what came of it (vsocketd must break this
// device and nothing else; the host's test checks the rest) and exits 0
// if no answer came back.
//
// Usage: vsocket-agent-probe [--socket PATH] [--echo N] [--steal ADDR PORT] [--garbage KIND]
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "guest/agent/agent_transport.h"
#include "proto/control.h"

namespace {

using vsocket::Code;
using vsocket::Result;
using vsocket::Status;
using vsocket::guest::QueueId;
using vsocket::guest::Transport;
using vsocket::vhost::VirtqueueDriver;

constexpr uint32_t kMsgBytes = vsocket::proto::kMaxMessageSize;

struct Probe {
  Transport& t;
  uint8_t* req;
  uint8_t* resp;
  uint64_t wakeups = 0;

  Result<vsocket::proto::Message> Call(const vsocket::proto::Message& m) {
    auto n = vsocket::proto::Encode(m, {req, kMsgBytes});
    if (!n.ok()) return n.status();
    VirtqueueDriver& q = t.queue(QueueId::kRequests);
    VirtqueueDriver::Buf out{t.Gpa(req), static_cast<uint32_t>(*n)};
    VirtqueueDriver::Buf in{t.Gpa(resp), kMsgBytes};
    auto head = q.Add({&out, 1}, {&in, 1}, m.request_id);
    if (!head.ok()) return head.status();
    if (q.Publish()) t.Kick(QueueId::kRequests);
    for (int waited_ms = 0;;) {
      if (auto u = q.PopUsed()) {
        if (u->cookie != m.request_id) return Status(Code::kDataLoss, "answer to another request");
        return vsocket::proto::Decode({resp, u->len});
      }
      if (q.broken()) return Status(Code::kDataLoss, q.broken_reason());
      if (q.EnableInterrupts()) continue;
      if (t.BackendGone()) return Status(Code::kUnavailable, "the agent went away");
      if (waited_ms >= 10000) return Status(Code::kDeadlineExceeded, "no answer in 10 s");
      pollfd p{t.wake_fd(QueueId::kRequests), POLLIN, 0};
      if (poll(&p, 1, 100) == 1) {
        uint64_t v;
        (void)!read(p.fd, &v, sizeof(v));
        ++wakeups;
      } else {
        waited_ms += 100;
      }
    }
  }
};

using vsocket::proto::Endpoint;
using vsocket::proto::Message;
using vsocket::proto::MsgType;
using vsocket::proto::RegisterAck;
using vsocket::proto::WireError;

// A connection to ADDR:PORT, both ends held by the caller; local/peer are
// the client end's as the kernel names them.
struct Pair {
  int listener = -1, client = -1, server = -1;
  Endpoint local, peer;
};
bool Connect(const char* addr, uint16_t port, Pair* p) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (inet_pton(AF_INET, addr, &a.sin_addr) != 1) return false;
  int one = 1;
  p->listener = socket(AF_INET, SOCK_STREAM, 0);
  setsockopt(p->listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(p->listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(p->listener, 1) != 0) return false;
  p->client = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(p->client, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return false;
  p->server = accept(p->listener, nullptr, nullptr);
  sockaddr_in l{};
  socklen_t len = sizeof(l);
  if (p->server < 0 || getsockname(p->client, reinterpret_cast<sockaddr*>(&l), &len) != 0) return false;
  p->local = Endpoint{vsocket::proto::Family::kIpv4, {}, ntohs(l.sin_port)};
  std::memcpy(p->local.addr.data(), &l.sin_addr, 4);
  p->peer = Endpoint{vsocket::proto::Family::kIpv4, {}, port};
  std::memcpy(p->peer.addr.data(), &a.sin_addr, 4);
  return true;
}

// Connect's look-alike: the same kind of connection to ADDR:PORT, made in
// a network namespace of our own whose loopback carries ADDR (a thread of
// ours moves there; the sockets stay in it). Any process allowed to make
// a namespace (unprivileged user namespaces) can do this.
bool ConnectInOwnNetns(const char* addr, uint16_t port, Pair* p) {
  bool ok = false;
  std::thread th([&] {
    if (unshare(CLONE_NEWNET) != 0) {
      perror("vsocket-agent-probe: unshare(CLONE_NEWNET)");
      return;
    }
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    auto* sin = reinterpret_cast<sockaddr_in*>(&ifr.ifr_addr);
    sin->sin_family = AF_INET;
    if (inet_pton(AF_INET, addr, &sin->sin_addr) != 1 || ioctl(s, SIOCSIFADDR, &ifr) != 0 ||
        ioctl(s, SIOCGIFFLAGS, &ifr) != 0) {
      perror("vsocket-agent-probe: the namespace's loopback");
      close(s);
      return;
    }
    ifr.ifr_flags |= IFF_UP;
    bool up = ioctl(s, SIOCSIFFLAGS, &ifr) == 0;
    close(s);
    ok = up && Connect(addr, port, p);
  });
  th.join();
  return ok;
}

// REGISTER_CONN for local/peer on this device (rings in our memory); the
// answer's status.
Result<WireError> Register(Probe& p, uint64_t conn_id, const Endpoint& local, const Endpoint& peer) {
  vsocket::vhost::RegionAllocator& mem = p.t.allocator();
  uint8_t* tx = mem.Allocate(4096, 4096);
  uint8_t* rx = mem.Allocate(4096, 4096);
  if (tx == nullptr || rx == nullptr) return Status(Code::kResourceExhausted, "no ring memory");
  vsocket::proto::RegisterConn r{conn_id, vsocket::proto::Role::kClient, local, peer, p.t.Gpa(tx), p.t.Gpa(rx), 4096,
                                 4096};
  auto a = p.Call({MsgType::kRegisterConn, 100 + conn_id, r});
  if (!a.ok()) return a.status();
  const auto* ack = std::get_if<RegisterAck>(&a->body);
  if (ack == nullptr) return Status(Code::kDataLoss, "REGISTER_CONN not answered with REGISTER_ACK");
  return ack->status;
}

int Steal(Probe& p, Transport& t, const char* addr, uint16_t port) {
  if (Status st = t.OpenProofs(); !st.ok()) {
    fprintf(stderr, "vsocket-agent-probe: the agent proves no sockets: %s\n", st.ToString().c_str());
    return 1;
  }
  // The victim: a child holding both ends of its connection; we learn its
  // 4-tuple (as anyone in the VM can, from ss or /proc/net/tcp), not its fds.
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) return 1;
  pid_t child = fork();
  if (child == 0) {
    close(to_child[1]);
    close(from_child[0]);
    Pair v;
    bool ok = Connect(addr, port, &v);
    Endpoint e[2] = {v.local, v.peer};
    (void)!write(from_child[1], ok ? e : nullptr, ok ? sizeof(e) : 0);
    close(from_child[1]);
    char c;
    (void)!read(to_child[0], &c, 1);  // until the parent is done (EOF)
    _exit(0);
  }
  close(to_child[0]);
  close(from_child[1]);
  Endpoint victim[2];
  bool got = read(from_child[0], victim, sizeof(victim)) == static_cast<ssize_t>(sizeof(victim));
  int rc = 0;
  auto expect = [&](const char* what, Result<WireError> r, WireError want) {
    printf("vsocket-agent-probe: %s: %s\n", what, r.ok() ? vsocket::proto::ToString(*r) : r.status().ToString().c_str());
    if (!r.ok() || *r != want) rc = 1;
  };
  if (!got) {
    fprintf(stderr, "vsocket-agent-probe: the child could not connect to %s:%u\n", addr, port);
    rc = 1;
  } else {
    expect("the child's connection registered without its socket", Register(p, 1, victim[0], victim[1]),
           WireError::kSpoofedAddress);
    Pair mine;
    if (!Connect(addr, static_cast<uint16_t>(port + 1), &mine)) {
      fprintf(stderr, "vsocket-agent-probe: cannot connect to %s:%u\n", addr, port + 1);
      rc = 1;
    } else {
      Status proved = t.ProveSocket(mine.client);
      printf("vsocket-agent-probe: our own socket proved to the agent: %s\n", proved.ToString().c_str());
      if (!proved.ok()) rc = 1;
      expect("the child's connection registered after proving our own", Register(p, 2, victim[0], victim[1]),
             WireError::kSpoofedAddress);
      proved = t.ProveSocket(mine.client);
      if (!proved.ok()) rc = 1;
      expect("our own proved connection registered", Register(p, 3, mine.local, mine.peer), WireError::kOk);
    }
    // A look-alike in a network namespace of our own (decision 127): the
    // socket is ours, its 4-tuple carries the VM's address, and it is no
    // proof: the agent vouches only for sockets of its own namespace.
    Pair alike;
    if (!ConnectInOwnNetns(addr, static_cast<uint16_t>(port + 2), &alike)) {
      fprintf(stderr, "vsocket-agent-probe: cannot connect to %s:%u in a namespace of our own\n", addr, port + 2);
      rc = 1;
    } else {
      Status proved = t.ProveSocket(alike.client);
      printf("vsocket-agent-probe: a socket of another network namespace proved to the agent: %s\n",
             proved.ToString().c_str());
      if (proved.ok()) rc = 1;
      expect("the other namespace's connection registered", Register(p, 4, alike.local, alike.peer),
             WireError::kSpoofedAddress);
    }
  }
  close(to_child[1]);
  waitpid(child, nullptr, 0);
  return rc;
}

// Garbage in our own request queue; 0 when vsocketd did not answer it.
int Garbage(Probe& p, Transport& t, const std::string& kind) {
  VirtqueueDriver& q = t.queue(QueueId::kRequests);
  VirtqueueDriver::Buf out{t.Gpa(p.req), 64}, in{t.Gpa(p.resp), kMsgBytes};
  if (kind == "outside") {
    out.gpa = 0xfffffff000000ULL;  // far beyond any VM's memory
  } else if (kind == "huge") {
    out.len = 0x80000000u;
  } else if (kind != "chain") {
    fprintf(stderr, "vsocket-agent-probe: --garbage outside|huge|chain\n");
    return 2;
  }
  auto head = q.Add({&out, 1}, {&in, 1}, 999);
  if (!head.ok()) {
    fprintf(stderr, "vsocket-agent-probe: %s\n", head.status().ToString().c_str());
    return 1;
  }
  if (kind == "chain") {
    // The first descriptor of the chain now names a next one out of range.
    vsocket::proto::VringDesc* desc = q.ring().desc();
    desc[*head].next = 0xfff0;
  }
  if (q.Publish()) t.Kick(QueueId::kRequests);
  for (int ms = 0; ms < 3000; ms += 100) {
    if (auto u = q.PopUsed()) {
      printf("vsocket-agent-probe: garbage %s answered (%u bytes): vsocketd took it\n", kind.c_str(), u->len);
      return 1;
    }
    usleep(100 * 1000);
  }
  printf("vsocket-agent-probe: garbage %s written and kicked; no answer in 3 s\n", kind.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = vsocket::agent::kDefaultAgentSocket;
  long echoes = 16;
  const char* steal_addr = nullptr;
  std::string garbage;
  long steal_port = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--socket") path = argv[i + 1];
    else if (a == "--echo") echoes = strtol(argv[i + 1], nullptr, 10);
    else if (a == "--steal" && i + 2 < argc) steal_addr = argv[i + 1], steal_port = strtol(argv[i + 2], nullptr, 10), ++i;
    else if (a == "--garbage") garbage = argv[i + 1];
    else {
      fprintf(stderr, "usage: vsocket-agent-probe [--socket PATH] [--echo N] [--steal ADDR PORT] [--garbage KIND]\n");
      return 2;
    }
  }
  auto t = vsocket::agent::AgentTransport::Open(path);
  if (!t.ok()) {
    fprintf(stderr, "vsocket-agent-probe: %s\n", t.status().ToString().c_str());
    return 1;
  }
  Transport& tr = **t;
  vsocket::vhost::RegionAllocator& mem = tr.allocator();
  // Event buffers first, as the session posts them.
  VirtqueueDriver& eq = tr.queue(QueueId::kEvents);
  for (uint64_t i = 0; i < 16; ++i) {
    uint8_t* b = mem.Allocate(4096);
    VirtqueueDriver::Buf in{tr.Gpa(b), 4096};
    if (b == nullptr || !eq.Add({}, {&in, 1}, i).ok()) {
      fprintf(stderr, "vsocket-agent-probe: cannot post event buffers\n");
      return 1;
    }
  }
  if (eq.Publish()) tr.Kick(QueueId::kEvents);
  Probe p{tr, mem.Allocate(kMsgBytes), mem.Allocate(kMsgBytes)};
  if (p.req == nullptr || p.resp == nullptr) return 1;
  vsocket::proto::Hello hello;
  hello.pid = static_cast<uint32_t>(getpid());
  auto r = p.Call({vsocket::proto::MsgType::kHello, 1, hello});
  const auto* ack = r.ok() ? std::get_if<vsocket::proto::HelloAck>(&r->body) : nullptr;
  if (ack == nullptr || ack->status != vsocket::proto::WireError::kOk) {
    fprintf(stderr, "vsocket-agent-probe: HELLO failed: %s\n", r.ok() ? "bad answer" : r.status().ToString().c_str());
    return 1;
  }
  printf("vsocket-agent-probe: HELLO_ACK device %u through the agent\n", ack->device_id);
  if (!garbage.empty()) return Garbage(p, tr, garbage);
  if (steal_addr != nullptr) {
    if (steal_port < 1 || steal_port > 65534) return 2;
    return Steal(p, tr, steal_addr, static_cast<uint16_t>(steal_port));
  }
  std::vector<uint8_t> payload(4096);
  for (long i = 0; i < echoes; ++i) {
    for (size_t k = 0; k < payload.size(); ++k) payload[k] = static_cast<uint8_t>(k * 13 + i + getpid());
    uint32_t crc = vsocket::proto::Crc32c(payload);
    auto e = p.Call({vsocket::proto::MsgType::kEcho, static_cast<uint64_t>(2 + i), vsocket::proto::Echo{crc, payload}});
    const auto* echo = e.ok() ? std::get_if<vsocket::proto::Echo>(&e->body) : nullptr;
    if (echo == nullptr || echo->checksum != crc ||
        !std::equal(payload.begin(), payload.end(), echo->payload.begin(), echo->payload.end())) {
      fprintf(stderr, "vsocket-agent-probe: ECHO %ld failed: %s\n", i, e.ok() ? "came back different" : e.status().ToString().c_str());
      return 1;
    }
  }
  printf("vsocket-agent-probe: %ld ECHOes of 4096 bytes checked, %llu wake-ups\n", echoes,
         static_cast<unsigned long long>(p.wakeups));
  return 0;
}
