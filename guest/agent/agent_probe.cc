// vsocket-agent-probe: an application process of the VM taking the vSocket
// device from vsocket-guestd through AgentTransport (the guest session's
// transport in a VM) and using nothing but the Transport interface: event
// buffers posted, HELLO, checksummed ECHOes, each answer awaited on the
// wake-up fd the agent signals. What libvsocket's session will do in a VM.
//
// Usage: vsocket-agent-probe [--socket PATH] [--echo N]
#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
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

}  // namespace

int main(int argc, char** argv) {
  std::string path = vsocket::agent::kDefaultAgentSocket;
  long echoes = 16;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--socket") path = argv[i + 1];
    else if (a == "--echo") echoes = strtol(argv[i + 1], nullptr, 10);
    else {
      fprintf(stderr, "usage: vsocket-agent-probe [--socket PATH] [--echo N]\n");
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
