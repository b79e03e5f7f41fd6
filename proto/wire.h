// Bounds-checked little-endian readers and writers for fixed wire layouts.
// Every decoder in proto/ is built on WireReader so that no parser reads past
// its input, whatever the input says.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace vsocket::proto {

class WireReader {
 public:
  explicit WireReader(std::span<const uint8_t> in) : in_(in) {}

  bool ok() const { return ok_; }
  size_t remaining() const { return ok_ ? in_.size() - pos_ : 0; }
  size_t position() const { return pos_; }

  uint8_t U8() { return static_cast<uint8_t>(Le(1)); }
  uint16_t U16() { return static_cast<uint16_t>(Le(2)); }
  uint32_t U32() { return static_cast<uint32_t>(Le(4)); }
  uint64_t U64() { return Le(8); }
  // Copies n bytes into out; on underflow marks the reader failed, zero-fills.
  void Bytes(void* out, size_t n) {
    if (!Take(n)) {
      std::memset(out, 0, n);
      return;
    }
    std::memcpy(out, in_.data() + pos_ - n, n);
  }
  void Skip(size_t n) { (void)Take(n); }

 private:
  bool Take(size_t n) {
    if (!ok_ || in_.size() - pos_ < n) {
      ok_ = false;
      return false;
    }
    pos_ += n;
    return true;
  }
  uint64_t Le(size_t n) {
    if (!Take(n)) return 0;
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t{in_[pos_ - n + i]} << (8 * i);
    return v;
  }

  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

class WireWriter {
 public:
  explicit WireWriter(std::span<uint8_t> out) : out_(out) {}

  bool ok() const { return ok_; }
  size_t size() const { return pos_; }

  void U8(uint8_t v) { Le(v, 1); }
  void U16(uint16_t v) { Le(v, 2); }
  void U32(uint32_t v) { Le(v, 4); }
  void U64(uint64_t v) { Le(v, 8); }
  void Bytes(const void* p, size_t n) {
    if (!Take(n)) return;
    std::memcpy(out_.data() + pos_ - n, p, n);
  }
  void Zeros(size_t n) {
    if (!Take(n)) return;
    std::memset(out_.data() + pos_ - n, 0, n);
  }
  // Overwrites a U32 already written at `offset` (for length back-patching).
  void PatchU32(size_t offset, uint32_t v) {
    if (!ok_ || offset + 4 > pos_) {
      ok_ = false;
      return;
    }
    for (size_t i = 0; i < 4; ++i) out_[offset + i] = static_cast<uint8_t>(v >> (8 * i));
  }

 private:
  bool Take(size_t n) {
    if (!ok_ || out_.size() - pos_ < n) {
      ok_ = false;
      return false;
    }
    pos_ += n;
    return true;
  }
  void Le(uint64_t v, size_t n) {
    if (!Take(n)) return;
    for (size_t i = 0; i < n; ++i) out_[pos_ - n + i] = static_cast<uint8_t>(v >> (8 * i));
  }

  std::span<uint8_t> out_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace vsocket::proto
