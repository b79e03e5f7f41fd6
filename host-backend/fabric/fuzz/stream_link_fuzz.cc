// libFuzzer target for the tcp fabric's receive path: StreamLink::Poll
// cutting a peer host's byte stream into frames, over a transport that hands
// the bytes over in chunks the fuzzer chooses (so headers and payloads split
// across reads and across Poll() calls), into a sink whose memory moves
// after every call (issue 17, finding 1: a link must never write through a
// destination it kept from an earlier Poll()).
//
// Input: byte 0 = k, byte 1 = frames per Poll(); the last k bytes are the
// read schedule (one byte per Readv: 0 = EAGAIN, which ends the Poll();
// otherwise the most bytes that read returns); the bytes between are the
// stream. After the schedule, reads return whatever fits, then end of stream.
//
// Properties: no crash, no write outside the memory the sink handed out (ASan:
// every destination is freed once the call that got it returns); the frames
// delivered, re-encoded, are exactly a prefix of the stream, with DATA
// payloads byte for byte where the sink took them; the link dies at end of
// stream, and what it did not deliver is no complete valid frame; the link
// never spins without making progress.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "host-backend/fabric/link.h"

namespace {

using vsocket::fabric::FrameSink;
using vsocket::fabric::PayloadDest;
using vsocket::fabric::Transport;
using vsocket::proto::FrameHeader;
using vsocket::proto::FrameType;
using vsocket::proto::kFrameHeaderSize;

class ScheduledTransport : public Transport {
 public:
  ScheduledTransport(std::span<const uint8_t> stream, std::span<const uint8_t> schedule)
      : stream_(stream), schedule_(schedule) {}
  ssize_t Writev(const iovec*, int) override {
    errno = EPIPE;
    return -1;
  }
  ssize_t Readv(const iovec* iov, int n) override {
    size_t limit = SIZE_MAX;
    if (next_ < schedule_.size()) {
      uint8_t s = schedule_[next_++];
      if (s == 0) {
        errno = EAGAIN;
        return -1;
      }
      limit = s < 128 ? s : (s - 127) * 512u;
    }
    if (pos_ == stream_.size()) return 0;
    size_t done = 0;
    for (int i = 0; i < n && pos_ < stream_.size() && done < limit; ++i) {
      size_t k = std::min({iov[i].iov_len, stream_.size() - pos_, limit - done});
      std::memcpy(iov[i].iov_base, stream_.data() + pos_, k);
      pos_ += k;
      done += k;
    }
    if (done == 0) {
      errno = EAGAIN;  // an empty iovec: nothing can be read into it
      return -1;
    }
    return static_cast<ssize_t>(done);
  }
  int fd() const override { return -1; }
  size_t pos() const { return pos_; }

 private:
  std::span<const uint8_t> stream_;
  std::span<const uint8_t> schedule_;
  size_t pos_ = 0;
  size_t next_ = 0;
};

// Hands out fresh heap memory for every payload destination and takes it
// back (keeping a copy of its contents) when Poll() returns, like a device
// that pauses and resumes between every two polls. How a DATA payload is
// placed depends on its handle: 0 discard, 1 one piece, 2 two pieces split
// at value % len, 3 a destination of the wrong size (the link must discard
// it).
class MovingSink : public FrameSink {
 public:
  struct Got {
    FrameHeader h;
    std::vector<uint8_t> payload;
    bool placed = false;  // payload bytes are known (not discarded)
  };

  PayloadDest OnHeader(const FrameHeader& h) override {
    Reclaim();
    cur_ = Got{h, {}, false};
    mode_ = h.handle % 4;
    cur_.placed = mode_ == 1 || mode_ == 2;
    shadow_.clear();
    return Hand(h.len, h.value);
  }
  PayloadDest OnResume(const FrameHeader& h, uint32_t landed) override {
    if (std::memcmp(&h, &cur_.h, sizeof(h)) != 0 || landed > h.len) std::abort();
    Keep(landed);
    return Hand(h.len - landed, h.value);
  }
  void OnFrame(const FrameHeader& h, std::span<const uint8_t> payload) override {
    Got g{h, {payload.begin(), payload.end()}, true};
    if (h.type == FrameType::kData) {
      if (std::memcmp(&h, &cur_.h, sizeof(h)) != 0 || !payload.empty()) std::abort();
      Keep(h.len);
      g = std::move(cur_);
      cur_ = Got{};
      if (!g.placed) g.payload.resize(h.len);
      if (g.payload.size() != h.len) std::abort();
    }
    got.push_back(std::move(g));
  }
  // Poll() returned: the memory handed out is no longer the link's. Frees
  // it (ASan reports any later write) after copying what is in it.
  void Reclaim() {
    for (const auto& piece : pieces_) shadow_.insert(shadow_.end(), piece.begin(), piece.end());
    pieces_.clear();
  }

  std::vector<Got> got;

 private:
  // The payload's first `landed` bytes have arrived: keep the ones that
  // landed in the memory handed out last.
  void Keep(uint32_t landed) {
    Reclaim();
    if (!cur_.placed) return;
    if (landed < cur_.payload.size() || landed - cur_.payload.size() > shadow_.size()) std::abort();
    size_t fresh = landed - cur_.payload.size();
    cur_.payload.insert(cur_.payload.end(), shadow_.begin(), shadow_.begin() + static_cast<ptrdiff_t>(fresh));
    shadow_.clear();
  }

  PayloadDest Hand(uint32_t want, uint64_t split_seed) {
    PayloadDest d;
    if (mode_ == 0 || want == 0) return d;
    size_t first = want;
    if (mode_ == 2) first = split_seed % want;
    if (mode_ == 3) first = want + 1 + split_seed % 3;
    if (first > 0) {
      pieces_.emplace_back(first);
      d.iov[d.n++] = {pieces_.back().data(), first};
    }
    if (mode_ == 2 && first < want) {
      pieces_.emplace_back(want - first);
      d.iov[d.n++] = {pieces_.back().data(), want - first};
    }
    return d;
  }

  Got cur_;
  uint64_t mode_ = 0;
  std::vector<std::vector<uint8_t>> pieces_;  // the memory handed out now
  std::vector<uint8_t> shadow_;               // its contents, once taken back
};

// Whether `rest` begins with a complete frame the decoder accepts.
bool HoldsCompleteFrame(std::span<const uint8_t> rest) {
  if (rest.size() < kFrameHeaderSize) return false;
  auto h = vsocket::proto::DecodeFrameHeader(rest.first<kFrameHeaderSize>());
  return h.ok() && rest.size() >= kFrameHeaderSize + h->len;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  size_t k = std::min<size_t>(data[0], size - 2);
  int max_frames = 1 + data[1] % 64;
  std::span<const uint8_t> stream(data + 2, size - 2 - k);
  std::span<const uint8_t> schedule(data + size - k, k);

  auto owned = std::make_unique<ScheduledTransport>(stream, schedule);
  ScheduledTransport* transport = owned.get();
  auto link = vsocket::fabric::MakeStreamLink(std::move(owned));
  MovingSink sink;
  vsocket::Status st;
  // Every Poll() either reads, delivers, or ends with the schedule's EAGAIN
  // or the link's death: more polls than that is a link that spins.
  size_t bound = schedule.size() + stream.size() + 16;
  size_t polls = 0;
  while (st.ok()) {
    if (++polls > bound) std::abort();
    st = link->Poll(sink, max_frames);
    sink.Reclaim();
  }

  // What arrived is the stream's prefix, frame by frame.
  std::vector<uint8_t> hdr(kFrameHeaderSize);
  size_t pos = 0;
  for (const MovingSink::Got& g : sink.got) {
    vsocket::proto::EncodeFrameHeader(g.h, hdr.data());
    if (pos + kFrameHeaderSize + g.h.len > stream.size()) std::abort();
    if (std::memcmp(hdr.data(), stream.data() + pos, kFrameHeaderSize) != 0) std::abort();
    pos += kFrameHeaderSize;
    if (g.placed && std::memcmp(g.payload.data(), stream.data() + pos, g.h.len) != 0) std::abort();
    pos += g.h.len;
  }
  // The link stopped at the first frame it could not take, never before:
  // a header that does not decode (kDataLoss), or the end of the stream in
  // the middle of a frame (kUnavailable).
  std::span<const uint8_t> rest = stream.subspan(pos);
  if (HoldsCompleteFrame(rest)) std::abort();
  bool bad_header = rest.size() >= kFrameHeaderSize &&
                    !vsocket::proto::DecodeFrameHeader(rest.first<kFrameHeaderSize>()).ok();
  if (st.code() == vsocket::Code::kDataLoss) {
    if (!bad_header) std::abort();
  } else if (st.code() == vsocket::Code::kUnavailable) {
    if (bad_header || transport->pos() != stream.size()) std::abort();
  } else {
    std::abort();
  }
  return 0;
}
