// The end of a connection: close() (lingering while the peer has not
// consumed our accelerated bytes) and shutdown().
#pragma once

#include <memory>

#include "guest/core/conn.h"

namespace vsocket::guest {

// The last fd of a connection is closed (still_open: fd still names the
// socket; false after dup2/dup3 replaced it, or after a close the library
// never saw). `event`: what the report line says ("close", "reclaimed").
void Teardown(int fd, const std::shared_ptr<Conn>& self, bool still_open, const char* event = "close");
// close() before the peer consumed our accelerated bytes: true if the
// connection lingers (the caller hands it to the background writer).
bool Linger(int fd, Conn& c) REQUIRES(c.setup_mu);
// close() after the peer's EOF came by the ring, before its kernel FIN: true
// if the background writer keeps a dup until that FIN (the caller hands c
// to it), so that our FIN does not go first.
bool AwaitPeerFin(int fd, Conn& c);
// How long the writer waits for that FIN at most.
inline constexpr int64_t kAwaitFinNs = 2'000'000'000;

}  // namespace vsocket::guest
