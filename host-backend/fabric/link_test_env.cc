#include "host-backend/fabric/link_test_env.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "host-backend/fabric/tcp_fabric.h"

namespace vsocket::fabric {

std::vector<std::string> TestLinkKinds() { return {"fake", "fake_small", "tcp"}; }

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
  return std::nullopt;
}

}  // namespace vsocket::fabric
