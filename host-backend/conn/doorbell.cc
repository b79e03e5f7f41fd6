// Doorbells (kFeatureDoorbell): counts read from guest memory instead of
// messages while a connection is busy.
#include "host-backend/conn/conn_manager.h"

#include <atomic>

namespace vsocket::backend {

proto::DoorbellBlock* ConnManager::DoorbellOf(BackendConn& c) {
  // (A direct pair's counts are in its own memory, not here: decision 97.)
  if (!c.doorbell || c.direct || c.tx.host == nullptr) return nullptr;
  return reinterpret_cast<proto::DoorbellBlock*>(c.tx.host + c.tx.size);
}

void ConnManager::AddDoorbell(DeviceConns& dc, BackendConn& c) {
  c.doorbell_idle = 0;
  if (c.in_doorbell_set) return;
  c.in_doorbell_set = true;
  dc.doorbells.push_back(&c);
}

void ConnManager::RemoveDoorbell(BackendConn& c) {
  if (!c.in_doorbell_set) return;
  c.in_doorbell_set = false;
  if (DeviceConns* dc = c.device ? Find(*c.device) : nullptr) std::erase(dc->doorbells, &c);
}

// The block is guest memory: every count is checked like a message's, and
// one that goes backwards is ignored (counts only grow; a message may
// carry an older one than the block already showed).
int ConnManager::ReadDoorbell(BackendConn& c) {
  proto::DoorbellBlock* db = DoorbellOf(c);
  if (db == nullptr || c.state != ConnState::kUpgraded) return 0;
  int progress = 0;
  // Before the FENCE is in, tails wait (the guest's TX_TAIL follows it);
  // after a shutdown of the write side nothing more is taken.
  if (c.fence_received && !c.write_shut) {
    uint64_t tail = std::atomic_ref<uint64_t>(db->tx_tail).load(std::memory_order_acquire);
    if (tail > c.tx_tail) {
      if (!ApplyTxTail(c, tail)) return -1;
      progress = 1;
      counters_.doorbell_counts.fetch_add(1, std::memory_order_relaxed);
    }
  }
  uint64_t consumed = std::atomic_ref<uint64_t>(db->consumed).load(std::memory_order_acquire);
  if (consumed > c.rx_consumed) {
    if (!ApplyConsumed(c, consumed)) return -1;
    progress = 1;
    counters_.doorbell_counts.fetch_add(1, std::memory_order_relaxed);
  }
  return progress;
}

namespace {
// Passes a polled block may go without news before it is armed (the
// worker passes every few microseconds while busy).
constexpr uint32_t kDoorbellIdlePasses = 64;

// Asks the guest for messages again, then takes one last look: a count the
// guest published before it could see the flags is found here (both sides
// fence between their store and their load).
void ArmBlock(const vhost::GuestMemory& mem, proto::DoorbellBlock* db) {
  std::atomic_ref<uint32_t>(db->want_tx).store(1, std::memory_order_relaxed);
  std::atomic_ref<uint32_t>(db->want_consumed).store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  mem.MarkWritten(&db->want_tx, sizeof(db->want_tx));
  mem.MarkWritten(&db->want_consumed, sizeof(db->want_consumed));
}
}  // namespace

// Arms c's block and takes one last look: > 0 if a count moved meanwhile
// (the block stays polled), else 0 (or -1: reset) and it may leave the set.
int ConnManager::ArmDoorbell(BackendConn& c) {
  proto::DoorbellBlock* db = DoorbellOf(c);
  if (db == nullptr) return 0;
  ArmBlock(c.device->memory(), db);
  counters_.doorbell_arms.fetch_add(1, std::memory_order_relaxed);
  c.doorbell_idle = 0;
  return ReadDoorbell(c);
}

// Takes dc.doorbells[i] out of the polled set (the last one takes its place).
void ConnManager::DropDoorbellAt(DeviceConns& dc, size_t i) {
  dc.doorbells[i]->in_doorbell_set = false;
  dc.doorbells[i] = dc.doorbells.back();
  dc.doorbells.pop_back();
}

bool ConnManager::PollDoorbells(vhost::BackendDevice& device) {
  DeviceConns* dc = Find(device);
  if (dc == nullptr || dc->doorbells.empty()) return false;
  bool worked = false;
  for (size_t i = 0; i < dc->doorbells.size();) {
    BackendConn& c = *dc->doorbells[i];
    int r = ReadDoorbell(c);
    if (r > 0) {
      c.doorbell_idle = 0;
    } else if (r == 0 && DoorbellOf(c) != nullptr) {
      if (++c.doorbell_idle < kDoorbellIdlePasses) {
        ++i;
        continue;
      }
      r = ArmDoorbell(c);
    }
    worked |= r > 0;
    if (r > 0) ++i;
    else DropDoorbellAt(*dc, i);
  }
  return worked;
}

bool ConnManager::ArmDoorbells() {
  bool moved = false;
  for (auto& [dev, dc] : devices_) {
    for (size_t i = 0; i < dc.doorbells.size();) {
      if (ArmDoorbell(*dc.doorbells[i]) > 0) {
        moved = true;
        ++i;
      } else {
        DropDoorbellAt(dc, i);
      }
    }
  }
  return moved;
}

}  // namespace vsocket::backend
