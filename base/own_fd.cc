#include "base/own_fd.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace vsocket {

namespace {

std::atomic<bool> g_on{false};
// One bit per fd number below kOwnFdLimit (8 KiB, zero until used).
constexpr int kWords = kOwnFdLimit / 64;
std::atomic<uint64_t> g_bits[kWords];

bool InRange(int fd) { return fd >= 0 && fd < kOwnFdLimit; }

}  // namespace

void ProtectOwnFds() { g_on.store(true, std::memory_order_release); }
bool OwnFdsProtected() { return g_on.load(std::memory_order_acquire); }

int OwnFdFloor() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur <= 64) return 3;
  if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > 2048) return 1024;
  return static_cast<int>(rl.rlim_cur / 2);
}

void MarkOwnFd(int fd) {
  if (!OwnFdsProtected() || !InRange(fd)) return;
  g_bits[fd / 64].fetch_or(uint64_t{1} << (fd % 64), std::memory_order_acq_rel);
}

int OwnFd(int fd) {
  if (fd < 0 || !OwnFdsProtected()) return fd;
  int floor = OwnFdFloor();
  if (fd < floor) {
    // (The raw system calls: the library's own fcntl/close wrappers would
    // take the fd for the program's.)
    int high = static_cast<int>(::syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, floor));
    if (high >= 0) {
      ::syscall(SYS_close, fd);
      fd = high;
    }
  }
  MarkOwnFd(fd);
  return fd;
}

void DisownFd(int fd) {
  if (!InRange(fd)) return;
  std::atomic<uint64_t>& w = g_bits[fd / 64];
  uint64_t bit = uint64_t{1} << (fd % 64);
  if (w.load(std::memory_order_relaxed) & bit) w.fetch_and(~bit, std::memory_order_acq_rel);
}

void CloseOwnFd(int fd) {
  DisownFd(fd);
  ::syscall(SYS_close, fd);
}

bool IsOwnFd(int fd) { return InRange(fd) && (g_bits[fd / 64].load(std::memory_order_acquire) >> (fd % 64) & 1); }

void ForEachRunWithoutOwnFds(unsigned first, unsigned last, const std::function<void(unsigned, unsigned)>& fn) {
  if (first > last) return;
  unsigned lo = first;
  // Only numbers below kOwnFdLimit can be ours.
  unsigned scan_end = last < static_cast<unsigned>(kOwnFdLimit) ? last : static_cast<unsigned>(kOwnFdLimit) - 1;
  for (unsigned fd = first; fd <= scan_end;) {
    uint64_t word = g_bits[fd / 64].load(std::memory_order_acquire) >> (fd % 64);
    if (word == 0) {
      fd = (fd / 64 + 1) * 64;  // nothing of ours in the rest of this word
      continue;
    }
    if (word & 1) {
      if (fd > lo) fn(lo, fd - 1);
      lo = fd + 1;
    }
    ++fd;
  }
  if (lo <= last) fn(lo, last);
}

}  // namespace vsocket
