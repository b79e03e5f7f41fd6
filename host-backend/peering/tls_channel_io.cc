// TlsChannel data path: framing messages onto SSL_write, collecting them
// from SSL_read, with every WANT_READ/WANT_WRITE remembered for the retry.
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "host-backend/peering/tls_channel.h"
#include "host-backend/peering/tls_util.h"

namespace vsocket::peering {
namespace {

// Plaintext read per Receive() before it yields to other channels.
constexpr size_t kReceiveBudget = 1024 * 1024;

void PutLe32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t GetLe32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

}  // namespace

Status TlsChannel::CheckOpen() const {
  switch (state_) {
    case State::kOpen: return Status::Ok();
    case State::kHandshake: return Status(Code::kFailedPrecondition, "TLS handshake not finished");
    case State::kFailed:
    case State::kClosed: return error_;
  }
  return error_;
}

Status TlsChannel::Send(std::span<const uint8_t> msg) {
  VS_RETURN_IF_ERROR(CheckOpen());
  if (msg.size() > kMaxMessage) {
    return Status(Code::kInvalidArgument, "message of " + std::to_string(msg.size()) + " bytes exceeds the " +
                                              std::to_string(kMaxMessage) + "-byte limit");
  }
  const size_t queued = out_.size() - out_head_;
  if (queued + kFrameHeaderBytes + msg.size() > kMaxQueued) {
    return Status(Code::kResourceExhausted, "send queue full (" + std::to_string(queued) + " bytes queued)");
  }
  // Drop sent bytes once they are at least half the buffer: amortized O(1)
  // per byte and the buffer stays within about twice kMaxQueued.
  if (out_head_ > 0 && out_head_ >= out_.size() / 2) {
    out_.erase(out_.begin(), out_.begin() + static_cast<ptrdiff_t>(out_head_));
    out_head_ = 0;
  }
  uint8_t header[kFrameHeaderBytes];
  PutLe32(header, static_cast<uint32_t>(msg.size()));
  out_.insert(out_.end(), header, header + kFrameHeaderBytes);
  out_.insert(out_.end(), msg.begin(), msg.end());
  return Flush();
}

Status TlsChannel::Flush() {
  VS_RETURN_IF_ERROR(CheckOpen());
  while (out_head_ < out_.size()) {
    // A retry after WANT_* must repeat the same length; the bytes at
    // out_head_ are unchanged because Send() only appends or moves them.
    const size_t len = write_retry_len_ != 0 ? write_retry_len_ : std::min(out_.size() - out_head_, kTlsRecordBytes);
    ERR_clear_error();
    size_t written = 0;
    const int r = SSL_write_ex(ssl_.get(), out_.data() + out_head_, len, &written);
    if (r == 1) {
      out_head_ += written;  // == len: partial writes are not enabled
      write_retry_len_ = 0;
      write_wants_read_ = false;
      continue;
    }
    const int e = SSL_get_error(ssl_.get(), r);
    if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) {
      write_retry_len_ = len;
      write_wants_read_ = (e == SSL_ERROR_WANT_READ);
      return Status::Ok();
    }
    return Fail(SslFailure(e, false));
  }
  out_.clear();
  out_head_ = 0;
  return Status::Ok();
}

bool TlsChannel::WantsWrite() const { return state_ == State::kOpen && (out_head_ < out_.size() || read_wants_write_); }

Status TlsChannel::Receive(std::vector<std::vector<uint8_t>>* out) {
  VS_RETURN_IF_ERROR(CheckOpen());
  read_wants_write_ = false;
  size_t budget = 0;
  for (;;) {
    // Past the budget, stop only where OpenSSL buffers nothing: what is
    // left then sits in the socket and keeps the fd readable for epoll.
    if (budget >= kReceiveBudget && SSL_has_pending(ssl_.get()) == 0) break;
    ERR_clear_error();
    size_t n = 0;
    const int r = SSL_read_ex(ssl_.get(), in_.data() + in_len_, in_.size() - in_len_, &n);
    if (r == 1) {
      in_len_ += n;
      budget += n;
      VS_RETURN_IF_ERROR(ParseMessages(out));
      continue;
    }
    const int e = SSL_get_error(ssl_.get(), r);
    if (e == SSL_ERROR_WANT_READ) break;
    // TLS 1.3 post-handshake traffic can make SSL_read write (an alert; a
    // KeyUpdate reply, which OpenSSL 3.0 defers to the next SSL_write).
    if (e == SSL_ERROR_WANT_WRITE) {
      read_wants_write_ = true;
      break;
    }
    Status status = SslFailure(e, false);
    if (status.code() == Code::kUnavailable && in_len_ > 0) {
      status = Status(Code::kUnavailable, status.message() + " in the middle of a message");
    }
    return Fail(std::move(status));
  }
  // A write that waited for incoming data may proceed now.
  if (write_wants_read_) return Flush();
  return Status::Ok();
}

Status TlsChannel::ParseMessages(std::vector<std::vector<uint8_t>>* out) {
  size_t pos = 0;
  while (in_len_ - pos >= kFrameHeaderBytes) {
    const uint32_t len = GetLe32(in_.data() + pos);
    if (len > kMaxMessage) {
      return Fail(Status(Code::kDataLoss, "peer sent a message of " + std::to_string(len) + " bytes, over the " +
                                              std::to_string(kMaxMessage) + "-byte limit"));
    }
    if (in_len_ - pos < kFrameHeaderBytes + len) break;
    const uint8_t* body = in_.data() + pos + kFrameHeaderBytes;
    out->emplace_back(body, body + len);
    pos += kFrameHeaderBytes + len;
  }
  if (pos > 0) {
    std::memmove(in_.data(), in_.data() + pos, in_len_ - pos);
    in_len_ -= pos;
  }
  return Status::Ok();
}

Result<std::array<uint8_t, 32>> TlsChannel::ExportKey(std::string_view label) const {
  if (state_ != State::kOpen) {
    return state_ == State::kHandshake ? Status(Code::kFailedPrecondition, "TLS handshake not finished") : error_;
  }
  std::array<uint8_t, 32> key{};
  ERR_clear_error();
  // use_context = 0: TLS 1.3 treats "no context" as an empty context.
  if (SSL_export_keying_material(ssl_.get(), key.data(), key.size(), label.data(), label.size(), nullptr, 0, 0) != 1) {
    return Status(Code::kInternal, "TLS key export failed: " + TakeSslError().text);
  }
  return key;
}

void TlsChannel::Close() {
  if (state_ == State::kOpen) {
    (void)Flush();  // best effort; may latch a failure
    if (state_ == State::kOpen) {
      ERR_clear_error();
      // Queues close_notify and sends it if the socket takes it; we never
      // wait for the peer's close_notify (returns 0) or retry (WANT_WRITE).
      (void)SSL_shutdown(ssl_.get());
      ERR_clear_error();
    }
  }
  if (fd_.valid()) (void)::shutdown(fd_.get(), SHUT_WR);
  if (state_ != State::kFailed) {
    state_ = State::kClosed;
    error_ = Status(Code::kFailedPrecondition, "channel closed");
  }
}

}  // namespace vsocket::peering
