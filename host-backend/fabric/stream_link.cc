// StreamLink: fabric frames over a byte stream (kernel TCP, or the in-memory
// fake). Sending gathers frame headers and payload pieces straight from the
// guests' TX rings into one writev per flush; receiving reads ahead into a
// small buffer for headers and small frames and lets big payloads land
// straight in the receiver's RX ring with readv.
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <vector>

#include "base/mutex.h"
#include "base/unique_fd.h"
#include "host-backend/fabric/link.h"

namespace vsocket::fabric {
namespace {

using proto::FrameHeader;
using proto::FrameType;
using proto::kFrameHeaderSize;

// ---- transports -------------------------------------------------------------

class FdTransport : public Transport {
 public:
  explicit FdTransport(int fd) : fd_(fd) {}
  ssize_t Writev(const iovec* iov, int n) override {
    msghdr m{};
    m.msg_iov = const_cast<iovec*>(iov);
    m.msg_iovlen = static_cast<size_t>(n);
    return sendmsg(fd_.get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  ssize_t Readv(const iovec* iov, int n) override { return readv(fd_.get(), iov, n); }
  int fd() const override { return fd_.get(); }

 private:
  UniqueFd fd_;
};

// One direction of the fake: a bounded byte queue and an eventfd that is
// readable while bytes wait.
struct MemPipe {
  Mutex mu;  // the two ends' threads
  std::deque<uint8_t> bytes GUARDED_BY(mu);
  const size_t capacity;
  bool closed GUARDED_BY(mu) = false;
  UniqueFd event{eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)};
  explicit MemPipe(size_t cap) : capacity(cap) {}
};

class MemTransport : public Transport {
 public:
  MemTransport(std::shared_ptr<MemPipe> out, std::shared_ptr<MemPipe> in) : out_(std::move(out)), in_(std::move(in)) {}
  ~MemTransport() override {
    for (MemPipe* p : {out_.get(), in_.get()}) {
      MutexLock lock(p->mu);
      p->closed = true;
    }
    Signal(*out_);
  }
  ssize_t Writev(const iovec* iov, int n) override {
    MutexLock lock(out_->mu);
    if (out_->closed) {
      errno = EPIPE;
      return -1;
    }
    size_t room = out_->capacity - out_->bytes.size();
    if (room == 0) {
      errno = EAGAIN;
      return -1;
    }
    size_t done = 0;
    for (int i = 0; i < n && room > 0; ++i) {
      size_t k = std::min(room, iov[i].iov_len);
      auto* p = static_cast<const uint8_t*>(iov[i].iov_base);
      out_->bytes.insert(out_->bytes.end(), p, p + k);
      room -= k;
      done += k;
    }
    Signal(*out_);
    return static_cast<ssize_t>(done);
  }
  ssize_t Readv(const iovec* iov, int n) override {
    MutexLock lock(in_->mu);
    if (in_->bytes.empty()) {
      uint64_t v;
      (void)!read(in_->event.get(), &v, sizeof(v));
      if (in_->closed) return 0;
      errno = EAGAIN;
      return -1;
    }
    size_t done = 0;
    for (int i = 0; i < n && !in_->bytes.empty(); ++i) {
      size_t k = std::min(in_->bytes.size(), iov[i].iov_len);
      std::copy_n(in_->bytes.begin(), k, static_cast<uint8_t*>(iov[i].iov_base));
      in_->bytes.erase(in_->bytes.begin(), in_->bytes.begin() + static_cast<ptrdiff_t>(k));
      done += k;
    }
    return static_cast<ssize_t>(done);
  }
  int fd() const override { return in_->event.get(); }

 private:
  static void Signal(MemPipe& p) {
    uint64_t one = 1;
    (void)!write(p.event.get(), &one, sizeof(one));
  }
  std::shared_ptr<MemPipe> out_, in_;
};

// ---- the link -----------------------------------------------------------------

constexpr size_t kMaxBatchIov = 512;           // below IOV_MAX (1024)
constexpr size_t kMaxBatchBytes = 512 * 1024;  // per writev
constexpr size_t kInBufSize = 64 * 1024;

class StreamLink : public Link {
 public:
  explicit StreamLink(std::unique_ptr<Transport> t) : t_(std::move(t)), in_(kInBufSize) {
    headers_.reserve(kMaxBatchIov);
  }

  bool Send(const FrameHeader& h, std::span<const iovec> payload, const RemoteBuffer*) override {
    if (!dead_.ok() || !backlog_.empty() || iov_.size() + 1 + payload.size() > kMaxBatchIov ||
        batch_bytes_ >= kMaxBatchBytes) {
      stats_.busy.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    headers_.emplace_back();
    proto::EncodeFrameHeader(h, headers_.back().data());
    // iov_ points into headers_, whose storage never moves (reserved).
    iov_.push_back({headers_.back().data(), kFrameHeaderSize});
    batch_bytes_ += kFrameHeaderSize;
    for (const iovec& v : payload) {
      if (v.iov_len == 0) continue;
      iov_.push_back(v);
      batch_bytes_ += v.iov_len;
    }
    ++batch_frames_;
    ++queued_;
    stats_.frames_out.fetch_add(1, std::memory_order_relaxed);
    if (h.type == FrameType::kData) stats_.data_bytes_out.fetch_add(h.len, std::memory_order_relaxed);
    return true;
  }

  Status Flush() override {
    if (!dead_.ok()) return dead_;
    if (!backlog_.empty()) {
      ssize_t n = WriteRaw(backlog_.data() + backlog_off_, backlog_.size() - backlog_off_);
      if (n < 0) return dead_;
      backlog_off_ += static_cast<size_t>(n);
      if (backlog_off_ < backlog_.size()) return Status::Ok();
      backlog_.clear();
      backlog_off_ = 0;
    }
    if (iov_.empty()) return Status::Ok();
    stats_.write_calls.fetch_add(1, std::memory_order_relaxed);
    ssize_t n = t_->Writev(iov_.data(), static_cast<int>(iov_.size()));
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return Die(Status::FromErrno("fabric link write"));
    size_t sent = n < 0 ? 0 : static_cast<size_t>(n);
    if (sent < batch_bytes_) {
      // Keep the rest ourselves: the callers' ring memory is theirs again
      // after this call. Bounded by one batch.
      size_t skip = sent;
      for (const iovec& v : iov_) {
        if (skip >= v.iov_len) {
          skip -= v.iov_len;
          continue;
        }
        auto* p = static_cast<const uint8_t*>(v.iov_base);
        backlog_.insert(backlog_.end(), p + skip, p + v.iov_len);
        skip = 0;
      }
      stats_.backlog_bytes.fetch_add(backlog_.size(), std::memory_order_relaxed);
    }
    iov_.clear();
    headers_.clear();
    batch_bytes_ = 0;
    batch_frames_ = 0;
    released_ = queued_;  // written or copied: nothing is read from the callers' memory
    return Status::Ok();
  }

  uint64_t NextFrameNumber() const override { return queued_; }
  uint64_t ReleasedThrough() const override { return dead_.ok() ? released_ : queued_; }

  bool Writable() const override {
    return dead_.ok() && backlog_.empty() && iov_.size() + 3 <= kMaxBatchIov && batch_bytes_ < kMaxBatchBytes;
  }
  bool WantsWritable() const override { return !backlog_.empty(); }
  int wake_fd() const override { return t_->fd(); }

  Status Poll(FrameSink& sink, int max_frames) override {
    if (!dead_.ok()) return dead_;
    // A payload begun in an earlier call: its destination may have moved or
    // gone since (the sink's memory is valid only during one call).
    if (data_left_ > 0) SetDest(sink.OnResume(cur_, cur_.len - data_left_), data_left_);
    int frames = 0;
    bool eof = false;
    while (frames < max_frames) {
      // 1. A DATA payload in progress: take what is buffered, then read the
      //    rest straight into its destination (and read ahead after it).
      if (data_left_ > 0) {
        size_t k = std::min(data_left_, in_end_ - in_pos_);
        if (k > 0) {
          Land(in_.data() + in_pos_, k);
          in_pos_ += k;
        }
        if (data_left_ > 0) {
          iovec v[3];
          int n = DestIov(v);
          size_t dest_room = 0;
          for (int i = 0; i < n; ++i) dest_room += v[i].iov_len;
          CompactIn();
          v[n++] = {in_.data() + in_end_, in_.size() - in_end_};
          ssize_t r = ReadInto(v, n, &eof);
          if (r < 0) return dead_;
          if (r == 0) break;
          size_t got = static_cast<size_t>(r);
          size_t direct = std::min(got, dest_room);
          Advance(direct);
          in_end_ += got - direct;
          if (data_left_ > 0) continue;
        }
        ++frames;
        stats_.frames_in.fetch_add(1, std::memory_order_relaxed);
        sink.OnFrame(cur_, {});
        continue;
      }
      // 2. A header (and a small payload) from the read-ahead buffer.
      size_t have = in_end_ - in_pos_;
      if (have >= kFrameHeaderSize) {
        auto h = proto::DecodeFrameHeader(
            std::span<const uint8_t, kFrameHeaderSize>(in_.data() + in_pos_, kFrameHeaderSize));
        if (!h.ok()) return Die(h.status());
        if (h->type == FrameType::kData) {
          in_pos_ += kFrameHeaderSize;
          cur_ = *h;
          SetDest(sink.OnHeader(cur_), cur_.len);
          data_left_ = cur_.len;
          stats_.data_bytes_in.fetch_add(cur_.len, std::memory_order_relaxed);
          continue;
        }
        if (have >= kFrameHeaderSize + h->len) {
          std::span<const uint8_t> payload(in_.data() + in_pos_ + kFrameHeaderSize, h->len);
          in_pos_ += kFrameHeaderSize + h->len;
          ++frames;
          stats_.frames_in.fetch_add(1, std::memory_order_relaxed);
          sink.OnFrame(*h, payload);
          continue;
        }
      }
      if (eof) break;
      // 3. Need more bytes.
      CompactIn();
      iovec v{in_.data() + in_end_, in_.size() - in_end_};
      ssize_t r = ReadInto(&v, 1, &eof);
      if (r < 0) return dead_;
      if (r == 0) break;
      in_end_ += static_cast<size_t>(r);
    }
    if (eof && frames < max_frames) return Die(Status(Code::kUnavailable, "fabric link closed by the peer"));
    return Status::Ok();
  }

 private:
  Status Die(Status st) {
    if (dead_.ok()) dead_ = std::move(st);
    return dead_;
  }

  ssize_t WriteRaw(const uint8_t* p, size_t n) {
    iovec v{const_cast<uint8_t*>(p), n};
    stats_.write_calls.fetch_add(1, std::memory_order_relaxed);
    ssize_t r = t_->Writev(&v, 1);
    if (r >= 0) return r;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    (void)Die(Status::FromErrno("fabric link write"));
    return -1;
  }

  // -1: dead; 0: nothing now (or end of stream, *eof set); else bytes read.
  ssize_t ReadInto(const iovec* v, int n, bool* eof) {
    stats_.read_calls.fetch_add(1, std::memory_order_relaxed);
    ssize_t r = t_->Readv(v, n);
    if (r > 0) return r;
    if (r == 0) {
      *eof = true;
      return 0;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    (void)Die(Status::FromErrno("fabric link read"));
    return -1;
  }

  // Where the next `want` payload bytes go (misplaced: discarded).
  void SetDest(PayloadDest d, size_t want) {
    size_t total = 0;
    for (int i = 0; i < d.n && i < 2; ++i) total += d.iov[i].iov_len;
    if (d.n < 0 || d.n > 2 || total != want) d.n = 0;
    dest_ = d;
    dest_i_ = 0;
    dest_off_ = 0;
  }

  void CompactIn() {
    if (in_pos_ == 0) return;
    std::memmove(in_.data(), in_.data() + in_pos_, in_end_ - in_pos_);
    in_end_ -= in_pos_;
    in_pos_ = 0;
  }

  // The unfilled part of the current payload's destination (or a scratch
  // buffer when it is discarded).
  int DestIov(iovec* v) {
    if (dest_.n == 0) {
      v[0] = {scratch_, std::min(data_left_, sizeof(scratch_))};
      return 1;
    }
    int n = 0;
    size_t off = dest_off_;
    for (int i = dest_i_; i < dest_.n; ++i) {
      v[n++] = {static_cast<uint8_t*>(dest_.iov[i].iov_base) + off, dest_.iov[i].iov_len - off};
      off = 0;
    }
    return n;
  }

  // Copies buffered payload bytes to the destination.
  void Land(const uint8_t* p, size_t k) {
    if (dest_.n == 0) {
      Advance(k);
      return;
    }
    size_t done = 0;
    while (done < k) {
      iovec& d = dest_.iov[dest_i_];
      size_t c = std::min(k - done, d.iov_len - dest_off_);
      std::memcpy(static_cast<uint8_t*>(d.iov_base) + dest_off_, p + done, c);
      done += c;
      Advance(c);
    }
  }

  void Advance(size_t k) {
    data_left_ -= k;
    if (dest_.n == 0) return;
    while (k > 0 && dest_i_ < dest_.n) {
      size_t room = dest_.iov[dest_i_].iov_len - dest_off_;
      size_t c = std::min(room, k);
      dest_off_ += c;
      k -= c;
      if (dest_off_ == dest_.iov[dest_i_].iov_len) {
        ++dest_i_;
        dest_off_ = 0;
      }
    }
  }

  std::unique_ptr<Transport> t_;
  Status dead_;
  // Sending.
  std::vector<std::array<uint8_t, kFrameHeaderSize>> headers_;
  std::vector<iovec> iov_;
  size_t batch_bytes_ = 0;
  size_t batch_frames_ = 0;
  uint64_t queued_ = 0;    // frames Send() took (NextFrameNumber)
  uint64_t released_ = 0;  // of those, flushed (written or copied)
  std::vector<uint8_t> backlog_;
  size_t backlog_off_ = 0;
  // Receiving.
  std::vector<uint8_t> in_;
  size_t in_pos_ = 0, in_end_ = 0;
  FrameHeader cur_;
  PayloadDest dest_;
  int dest_i_ = 0;
  size_t dest_off_ = 0;
  size_t data_left_ = 0;
  uint8_t scratch_[4096];
};

}  // namespace

std::unique_ptr<Transport> MakeFdTransport(int fd) { return std::make_unique<FdTransport>(fd); }

std::pair<std::unique_ptr<Transport>, std::unique_ptr<Transport>> MakeMemoryTransportPair(size_t capacity) {
  auto ab = std::make_shared<MemPipe>(capacity);
  auto ba = std::make_shared<MemPipe>(capacity);
  return {std::make_unique<MemTransport>(ab, ba), std::make_unique<MemTransport>(ba, ab)};
}

std::unique_ptr<Link> MakeStreamLink(std::unique_ptr<Transport> transport) {
  return std::make_unique<StreamLink>(std::move(transport));
}

}  // namespace vsocket::fabric
