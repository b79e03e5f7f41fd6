// An application's epoll set as the library keeps it: the kernel's epoll
// object stays the application's, and for each connection in it an entry
// says what the application asked for, what the kernel has, and whether the
// library answers for it instead (an upgraded connection's readiness comes
// from its rings: emulated.h). Internal to the epoll emulation
// (guest/core/epoll/); the calls the wrappers make are in poll_ops.h.
//
// A set is never freed: closing its epfd empties it and marks it not live,
// and the next epoll set with that number reuses it (at most one per fd
// number), so look-ups need no lock of the table.
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "guest/core/conn.h"
#include "guest/core/fd_table.h"
#include "guest/core/session.h"

namespace vsocket::guest::epoll {

// data.u64 values we use for our own fds in an application's epoll set.
inline constexpr uint64_t kWakeMarker = 0x7653776b6d61726bull;     // "vSwkmark"
inline constexpr uint64_t kSessionMarker = 0x7653736573736e6dull;  // "vSsessnm"
inline constexpr uint64_t kBackendMarker = 0x7653626b656e6420ull;  // "vSbkend ": the vhost-user socket hung up
// | fd: an upgraded connection still reading its kernel stream up to the
// fence: kernel data arriving must wake the waiter and count as a change.
inline constexpr uint64_t kFeedMarker = 0x7653666400000000ull;  // "vSfd"
inline constexpr uint64_t kFeedMask = 0xffffffff00000000ull;

// An entry whose conn is null was deleted (EPOLL_CTL_DEL): applications
// such as redis delete and add the same fd around every request, so the
// node stays for the next ADD (no allocation); closing the fd erases it.
struct EpEntry {
  uint32_t events = 0;
  epoll_data_t data{};
  std::shared_ptr<Conn> conn;  // null: deleted
  bool in_kernel = true;    // the application's registration is the kernel's
  bool feed = false;        // kFeedMarker registration active (see above)
  bool kicked = false;      // kernel data arrived since the last report
  uint32_t last_gen = ~0u;  // edge-triggered: last change reported
  bool disarmed = false;    // EPOLLONESHOT fired
  // The kernel's registration of fd for the application (not a feed), as
  // last applied; while dirty, events/data (or conn null: deleted) are the
  // application's newer wish, applied before any wait (Deferred changes).
  bool kern_present = false;
  uint32_t kern_events = 0;
  epoll_data_t kern_data{};
  bool dirty = false;
};

struct EpSet {
  // Lock order: the table's lock (set.cc), then this, then the session's.
  Mutex mu;
  std::unordered_map<int, EpEntry> entries GUARDED_BY(mu);
  // Set under both locks before the set is live, cleared at its close.
  int epfd = -1;
  int wake_efd = -1;
  Session* session GUARDED_BY(mu) = nullptr;  // once an entry has one
  std::atomic<bool> live{false};  // epfd names this set (until its close)
  // Deferred changes: dirty entries; waits under way on this set (none may
  // be deferred then); shared: watched by another epoll set, poll or select,
  // or inherited across fork (never deferred).
  int dirty GUARDED_BY(mu) = 0;
  std::vector<int> dirty_fds GUARDED_BY(mu);  // every dirty entry's fd (and maybe settled ones)
  std::atomic<int> waiters{0};
  bool shared GUARDED_BY(mu) = false;
  // The last wait was answered by ReadyNow (the next goes to the kernel).
  bool answered_by_poll GUARDED_BY(mu) = false;
};

inline constexpr int kMaxSets = kTableFds;

// The live set of epfd; with `create`, made (or revived) if there is none.
// Null beyond the table (such an epfd is the kernel's alone).
EpSet* FindSet(int epfd, bool create);
// Every live set (the table's lock taken and released).
std::vector<EpSet*> LiveSets();
// Requires set.mu. Nodes: entries present or deleted (counted per fd number,
// so that closing an fd no set knows looks at no set).
EpEntry& AddNode(EpSet& set, int fd, EpEntry&& e) REQUIRES(set.mu);
void EraseNode(EpSet& set, std::unordered_map<int, EpEntry>::iterator it) REQUIRES(set.mu);
void ClearNodes(EpSet& set) REQUIRES(set.mu);
// fd (not a connection) was added to an epoll set: if it is, or becomes, an
// epoll set of ours, another set watches it (EpSet.shared).
void NoteNested(int fd);

}  // namespace vsocket::guest::epoll
