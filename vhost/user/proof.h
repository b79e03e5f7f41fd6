// The proof socket of a vhost-user port (PATH.proof, SOCK_SEQPACKET): how a
// process-mode guest proves that it holds the TCP socket it registers
// (vhost/backend/socket_proof.h). Each request is one message, one fd
// attached (SCM_RIGHTS); each gets one reply.
//   kBind:  the memfd behind the session's memory region: ties the channel
//           to the device whose memory it is (once, first).
//   kProve: a connected TCP socket; its 4-tuple may then be registered by
//           that device, once.
//   kDirectFetch (no fd; DirectFetch, answered by DirectReply): the memory
//           of a direct pair vsocketd made for one of this device's
//           connections (decision 97) and the peer process's wake eventfd,
//           two fds attached to the reply; the token came in the
//           connection's DIRECT event, and serves once.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace vsocket::vhost::proof {

inline constexpr uint32_t kMagic = 0x46505356;  // "VSPF"
enum class Op : uint32_t { kBind = 1, kProve = 2, kDirectFetch = 3 };

struct Request {
  uint32_t magic = kMagic;
  Op op = Op::kBind;
};
static_assert(sizeof(Request) == 8);

// 0, or an errno value saying why not (ENODEV: no device of this port has
// that memory; EPERM: not bound yet; EINVAL: not a connected TCP socket or a
// malformed request).
struct Reply {
  uint32_t magic = kMagic;
  uint32_t error = 0;
};
static_assert(sizeof(Reply) == 8);

struct DirectFetch {
  uint32_t magic = kMagic;
  Op op = Op::kDirectFetch;
  uint64_t token = 0;
};
static_assert(sizeof(DirectFetch) == 16);

// error 0: the memfd then the wake eventfd attached, and which side of the
// pair's memory is this connection's. ENOENT: no such token for this
// device (the pair went, or it was fetched); EPERM: not bound yet.
struct DirectReply {
  uint32_t magic = kMagic;
  uint32_t error = 0;
  uint32_t side = 0;
  uint32_t reserved = 0;
};
static_assert(sizeof(DirectReply) == 16);

// SCM_RIGHTS, for both ends of the channel. AttachFds: `fds` go with msg,
// in `control` (at least CMSG_SPACE(n * sizeof(int)) bytes, cmsghdr-aligned).
inline void AttachFds(msghdr* msg, char* control, size_t control_len, const int* fds, size_t n) {
  std::memset(control, 0, control_len);
  msg->msg_control = control;
  msg->msg_controllen = CMSG_SPACE(n * sizeof(int));
  cmsghdr* cm = CMSG_FIRSTHDR(msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(n * sizeof(int));
  std::memcpy(CMSG_DATA(cm), fds, n * sizeof(int));
}
// Every fd a received msg carried, now the caller's.
inline std::vector<UniqueFd> TakeFds(msghdr* msg) {
  std::vector<UniqueFd> fds;
  for (cmsghdr* cm = CMSG_FIRSTHDR(msg); cm != nullptr; cm = CMSG_NXTHDR(msg, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int f;
      std::memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
      fds.emplace_back(f);
    }
  }
  return fds;
}

// One message of `len` bytes into buf with at most kMaxFds descriptors
// (SCM_RIGHTS, close-on-exec), for both ends of the channel and for the
// guest agent's grants: what recvmsg returned; *fds gets every descriptor
// that came, now the caller's (closed on every path), and *msg_flags the
// message's flags (MSG_CTRUNC: more descriptors were sent than fit,
// MSG_TRUNC: the message was longer than len).
template <size_t kMaxFds>
ssize_t RecvWithFds(int sock, void* buf, size_t len, int flags, std::vector<UniqueFd>* fds, int* msg_flags) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  iovec iov{buf, len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
  fds->clear();
  *msg_flags = 0;
  if (n >= 0) {
    *fds = TakeFds(&msg);
    *msg_flags = msg.msg_flags;
  }
  return n;
}

// Waits up to timeout_ms for the answer to a request just sent on channel.
inline Status AwaitAnswer(int channel, int64_t timeout_ms) {
  pollfd p{channel, POLLIN, 0};
  for (int64_t deadline = MonotonicMs() + timeout_ms;;) {
    int64_t left = deadline - MonotonicMs();
    if (left <= 0) return Status(Code::kUnavailable, "proof channel: no answer");
    int r = poll(&p, 1, static_cast<int>(left));
    if (r > 0) return Status::Ok();
    if (r < 0 && errno != EINTR) return Status(Code::kUnavailable, "proof channel: poll failed");
  }
}

// One request with one fd, one Reply: kNotFound for ENODEV (no device has
// that memory), kPermissionDenied for any other refusal (EXDEV: a socket
// of another network namespace than the VM's), kUnavailable if
// the channel failed (send, no answer in timeout_ms, closed).
inline Status Ask(int channel, Op op, int fd, int64_t timeout_ms) {
  Request req;
  req.op = op;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  iovec iov{&req, sizeof(req)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  AttachFds(&msg, control, sizeof(control), &fd, 1);
  ssize_t n;
  do n = sendmsg(channel, &msg, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof(req))) return Status(Code::kUnavailable, "proof channel: send failed");
  if (Status st = AwaitAnswer(channel, timeout_ms); !st.ok()) return st;
  Reply reply;
  do n = recv(channel, &reply, sizeof(reply), 0);
  while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof(reply)) || reply.magic != kMagic)
    return Status(Code::kUnavailable, "proof channel: closed");
  if (reply.error == EXDEV)  // (a look-alike of another network namespace)
    return Status(Code::kPermissionDenied, "proof refused: the socket is in another network namespace than the VM's");
  if (reply.error != 0)
    return Status(reply.error == ENODEV ? Code::kNotFound : Code::kPermissionDenied,
                  std::string("proof refused: ") + strerror(static_cast<int>(reply.error)));
  return Status::Ok();
}

inline std::string SocketPath(const std::string& port_path) { return port_path + ".proof"; }

}  // namespace vsocket::vhost::proof
