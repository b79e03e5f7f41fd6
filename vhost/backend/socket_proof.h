// Proof that a guest process holds the TCP socket it registers (issue 17,
// finding 9). In process mode a "VM" is every process that may open the
// VM's port socket; they share its addresses, so the anti-spoofing check
// (the local address is one of the VM's) cannot tell one of them from
// another. Before REGISTER_CONN the library passes the connection's socket
// itself (SCM_RIGHTS) on the port's proof socket (PATH.proof); vsocketd
// reads the 4-tuple from the kernel, records it for that process's device,
// closes its copy, and a registration of a 4-tuple its device did not
// prove is refused. A process cannot hand over a socket it does not hold.
// The channel is tied to a device by the device's own memory: the first
// message passes the memfd behind the session's region, which only the
// process that made it (or one it gave it to) holds.
#pragma once

#include <array>
#include <cstdint>
#include <deque>

#include "base/mutex.h"
#include "base/status.h"

namespace vsocket::vhost {

// A TCP connection as the kernel names it (addresses in network order;
// IPv4 in the first four bytes).
struct SocketTuple {
  uint8_t family = 0;  // 4 or 6
  std::array<uint8_t, 16> local_addr{};
  std::array<uint8_t, 16> peer_addr{};
  uint16_t local_port = 0;
  uint16_t peer_port = 0;
  // SO_NETNS_COOKIE: the network namespace of the socket (0: the kernel
  // did not say). Not part of ==: ProofServer compares it before a tuple is
  // recorded. Once the operator attested the VM's namespace (vsocketctl
  // attest), a socket of any other, or of an unknown one (0), is refused
  // (EXDEV, ProofCounters::wrong_netns); with none attested, any namespace
  // is accepted.
  uint64_t netns_cookie = 0;
  bool operator==(const SocketTuple& o) const {
    return family == o.family && local_addr == o.local_addr && peer_addr == o.peer_addr &&
           local_port == o.local_port && peer_port == o.peer_port;
  }
};

// The 4-tuple of fd if it is a connected TCP socket (established, or
// closed by the peer already); an error naming what it is otherwise.
Result<SocketTuple> InspectTcpSocket(int fd);

// SO_NETNS_COOKIE of socket fd: its network namespace (0: the kernel, before
// Linux 5.14, does not say).
uint64_t NetnsCookie(int fd);

// The (device, inode) of the file behind fd.
struct FileId {
  uint64_t dev = 0;
  uint64_t ino = 0;
  bool operator==(const FileId&) const = default;
};
Result<FileId> FileIdOf(int fd);

// 4-tuples a device proved, waiting for their REGISTER_CONN. Thread-safe:
// the proof thread adds, the worker takes. Bounded: the oldest proof goes
// when a device proves more than kMaxProofs it never registers.
class ProvenSockets {
 public:
  static constexpr size_t kMaxProofs = 4096;
  void Add(const SocketTuple& t) EXCLUDES(mu_);
  // True (and forgotten) if t was proved.
  bool Take(const SocketTuple& t) EXCLUDES(mu_);
  size_t size() const EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  std::deque<SocketTuple> proofs_ GUARDED_BY(mu_);
};

}  // namespace vsocket::vhost
