#include "host-backend/conn/tx_hold.h"

#include <algorithm>

namespace vsocket::backend {

void TxHold::Sent(fabric::Link* link, uint32_t host, uint64_t frame, uint64_t start, uint64_t end) {
  link_ = link;
  host_ = host;
  PopMarks();  // keeps the vector short between passes
  // Nothing before this frame is read any more (earlier bytes were copied).
  if (marks_.empty()) released_ = std::max(released_, start);
  if (marks_.size() >= kMaxMarks) {
    marks_.back() = {frame, end};
    return;
  }
  marks_.push_back({frame, end});
}

bool TxHold::Withdrawn(uint64_t token) {
  PopMarks();
  if (marks_.empty()) return false;
  // The newest marked frame is the last one that may read it.
  withdrawn_.emplace_back(marks_.back().frame + 1, token);
  return true;
}

void TxHold::PopMarks() {
  if (link_ == nullptr) return;
  uint64_t through = link_->ReleasedThrough();
  size_t n = 0;
  while (n < marks_.size() && marks_[n].frame < through) released_ = marks_[n++].end;
  marks_.erase(marks_.begin(), marks_.begin() + static_cast<ptrdiff_t>(n));
}

void TxHold::Reap(std::vector<uint64_t>* droppable) {
  if (link_ == nullptr) return;
  PopMarks();
  uint64_t through = link_->ReleasedThrough();
  std::erase_if(withdrawn_, [&](const auto& w) {
    if (w.first > through) return false;
    droppable->push_back(w.second);
    return true;
  });
}

void TxHold::Forget(std::vector<uint64_t>* droppable) {
  if (!marks_.empty()) released_ = marks_.back().end;
  marks_.clear();
  for (const auto& w : withdrawn_) droppable->push_back(w.second);
  withdrawn_.clear();
  link_ = nullptr;
}

}  // namespace vsocket::backend
