#include "host-backend/fabric/link_test_env.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "host-backend/fabric/rdma_link.h"
#include "host-backend/fabric/tcp_fabric.h"

namespace vsocket::fabric {

namespace {

// rdma: both ends on one device in this process, connected to each other.
// VSOCKET_RDMA_DEV / VSOCKET_RDMA_GID_INDEX pick the device and GID
// (tests/rdma/run-in-qemu.sh sets them); rnr_retry 0 proves the credits.
std::optional<TestLinkPair> MakeRdmaPair() {
  RdmaDevice::Options o;
  if (const char* dev = getenv("VSOCKET_RDMA_DEV")) o.name = dev;
  if (const char* gid = getenv("VSOCKET_RDMA_GID_INDEX")) o.gid_index = atoi(gid);
  auto fail = [](const Status& st) -> std::optional<TestLinkPair> {
    fprintf(stderr, "rdma test link pair: %s\n", st.ToString().c_str());
    return std::nullopt;
  };
  auto dev = RdmaDevice::Open(o);
  if (!dev.ok()) return fail(dev.status());
  RdmaLinkOptions lo;
  lo.rnr_retry = 0;
  auto a = RdmaLink::Create(*dev, lo);
  if (!a.ok()) return fail(a.status());
  auto b = RdmaLink::Create(*dev, lo);
  if (!b.ok()) return fail(b.status());
  if (Status st = (*a)->Connect((*b)->LocalInfo()); !st.ok()) return fail(st);
  if (Status st = (*b)->Connect((*a)->LocalInfo()); !st.ok()) return fail(st);
  TestLinkPair p;
  p.a = std::move(*a);
  p.b = std::move(*b);
  return p;  // no raw transport to inject into
}

}  // namespace

std::vector<std::string> TestLinkKinds() {
  std::vector<std::string> kinds = {"fake", "fake_small", "tcp"};
  if (!RdmaDevice::List().empty()) kinds.push_back("rdma");
  return kinds;
}

std::optional<TestLinkPair> MakeTestLinkPair(const std::string& kind) {
  TestLinkPair p;
  if (kind == "fake" || kind == "fake_small") {
    auto [ta, tb] = MakeMemoryTransportPair(kind == "fake" ? 4 << 20 : 64 << 10);
    // A second pair end writing into b: a raw view of a's side for injection.
    Transport* raw_a = ta.get();
    p.a = MakeStreamLink(std::move(ta));
    p.b = MakeStreamLink(std::move(tb));
    p.inject_into_b = [raw_a](const void* d, size_t n) {
      iovec v{const_cast<void*>(d), n};
      (void)raw_a->Writev(&v, 1);
    };
    return p;
  }
  if (kind == "tcp") {
    auto pair = ConnectedTcpPairForTest();
    if (!pair) return std::nullopt;
    int raw = pair->first;
    p.a = MakeStreamLink(MakeFdTransport(pair->first));
    p.b = MakeStreamLink(MakeFdTransport(pair->second));
    p.inject_into_b = [raw](const void* d, size_t n) { (void)!write(raw, d, n); };
    return p;
  }
  if (kind == "rdma") return MakeRdmaPair();
  return std::nullopt;
}

}  // namespace vsocket::fabric
