// The fds a library keeps for itself inside a program it does not own
// (libvsocket.so: its vsocketd sockets, eventfds, shared memory). A program
// may close every fd it did not open itself (a close-all loop, closefrom,
// close_range) while it goes on using its connections: the library's fds
// are numbered high, out of the way of the program's own, and known, so
// that the library's close() wrappers can leave them alone.
//
// Off unless ProtectOwnFds() was called (vsocketd, tools and tests share
// this code and keep their fds as the kernel numbers them).
#pragma once

#include <functional>

namespace vsocket {

// The fd numbers this registry can hold: 0 .. kOwnFdLimit - 1.
inline constexpr int kOwnFdLimit = 1 << 16;

// Turns the registry on for this process, for good.
void ProtectOwnFds();
bool OwnFdsProtected();

// fd (just created, nobody else knows its number) becomes one of ours:
// returns the number to use from now on, a dup numbered high (fd is closed)
// when that works, else fd itself. Off, or fd < 0: fd unchanged.
int OwnFd(int fd);
// Registers fd, already numbered as wanted, as one of ours.
void MarkOwnFd(int fd);
// Before one of ours is closed (its number may serve any file afterwards).
// Harmless for an fd that is not ours.
void DisownFd(int fd);
// DisownFd, then the kernel's close (never a close() wrapper).
void CloseOwnFd(int fd);
bool IsOwnFd(int fd);

// The lowest number OwnFd() dups to: 1024 when the fd limit allows more
// than 2048, else half the limit (at least 3).
int OwnFdFloor();

// Calls fn(lo, hi) for each maximal run of numbers in [first, last] that
// holds none of ours, in ascending order (last may be ~0u: to the end).
void ForEachRunWithoutOwnFds(unsigned first, unsigned last, const std::function<void(unsigned lo, unsigned hi)>& fn);

}  // namespace vsocket
