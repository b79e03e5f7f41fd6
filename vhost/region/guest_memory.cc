#include "vhost/region/guest_memory.h"

#include <algorithm>
#include <string>

namespace vsocket::vhost {

Result<GuestMemory> GuestMemory::Create(std::vector<MemRegion> regions) {
  std::sort(regions.begin(), regions.end(), [](const MemRegion& a, const MemRegion& b) { return a.gpa < b.gpa; });
  for (size_t i = 0; i < regions.size(); ++i) {
    const MemRegion& r = regions[i];
    if (r.size == 0 || r.local == nullptr || r.gpa + r.size < r.gpa ||
        reinterpret_cast<uintptr_t>(r.local) + r.size < reinterpret_cast<uintptr_t>(r.local))
      return Status(Code::kInvalidArgument, "memory region " + std::to_string(i) + " is empty or wraps");
    if (i > 0 && regions[i - 1].gpa + regions[i - 1].size > r.gpa)
      return Status(Code::kInvalidArgument, "memory regions overlap");
  }
  GuestMemory m;
  m.regions_ = std::move(regions);
  return m;
}

Result<MemWindow> MemWindow::Create(std::vector<std::pair<uint64_t, uint64_t>> ranges) {
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // (start, end)
  for (const auto& [gpa, len] : ranges) {
    if (len == 0 || gpa + len < gpa) return Status(Code::kInvalidArgument, "memory window range is empty or wraps");
    spans.emplace_back(gpa, gpa + len);
  }
  std::sort(spans.begin(), spans.end());
  MemWindow w;
  for (const auto& s : spans) {
    if (!w.ranges_.empty() && s.first < w.ranges_.back().second)
      return Status(Code::kInvalidArgument, "memory window ranges overlap");
    if (!w.ranges_.empty() && s.first == w.ranges_.back().second) {
      w.ranges_.back().second = s.second;
    } else {
      w.ranges_.push_back(s);
    }
  }
  if (w.ranges_.empty()) return Status(Code::kInvalidArgument, "empty memory window");
  return w;
}

const MemWindow& MemWindow::Nothing() {
  static const MemWindow* w = new MemWindow();
  return *w;
}

bool MemWindow::Contains(uint64_t gpa, uint64_t len) const {
  for (const auto& [start, end] : ranges_) {
    if (gpa < start || gpa > end) continue;
    if (len <= end - gpa) return true;
  }
  return false;
}

uint8_t* GuestMemory::Translate(uint64_t gpa, uint64_t len) const {
  if (const MemWindow* w = window(); w != nullptr && !w->Contains(gpa, len)) return nullptr;
  // Few regions (vhost-user allows at most 8): a linear scan is fastest.
  for (const MemRegion& r : regions_) {
    if (gpa < r.gpa) continue;
    uint64_t off = gpa - r.gpa;
    if (off > r.size || len > r.size - off) continue;  // overflow-free form
    return r.local + off;
  }
  return nullptr;
}

bool GuestMemory::ContainsLocal(const void* p, uint64_t len) const {
  auto a = reinterpret_cast<uintptr_t>(p);
  for (const MemRegion& r : regions_) {
    auto base = reinterpret_cast<uintptr_t>(r.local);
    if (a < base) continue;
    uint64_t off = a - base;
    if (off > r.size || len > r.size - off) continue;
    const MemWindow* w = window();
    return w == nullptr || w->Contains(r.gpa + off, len);
  }
  return false;
}

uint64_t GuestMemory::GpaOf(const void* p) const {
  auto a = reinterpret_cast<uintptr_t>(p);
  for (const MemRegion& r : regions_) {
    auto base = reinterpret_cast<uintptr_t>(r.local);
    if (a >= base && a - base < r.size) return r.gpa + (a - base);
  }
  return 0;
}

void GuestMemory::MarkWrittenSlow(const void* p, uint64_t len) const {
  auto a = reinterpret_cast<uintptr_t>(p);
  for (const MemRegion& r : regions_) {
    auto base = reinterpret_cast<uintptr_t>(r.local);
    if (a < base || a - base >= r.size) continue;
    uint64_t off = a - base;
    // (Callers write inside one region: translations never span two.)
    log_->Mark(r.gpa + off, std::min<uint64_t>(len, r.size - off));
    return;
  }
}

}  // namespace vsocket::vhost
