// Typed errors inside vSocket. errno is produced only at the libc boundary
// (guest/) from Status::sys_errno(); nothing here throws.
#pragma once

#include <cerrno>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace vsocket {

enum class Code : unsigned char {
  kOk,
  kInvalidArgument,     // caller passed something malformed
  kOutOfRange,          // index/length/offset outside its bounds
  kFailedPrecondition,  // object not in a state that allows the call
  kNotFound,
  kAlreadyExists,
  kPermissionDenied,
  kResourceExhausted,  // no credits, no ring space, no memory
  kUnavailable,        // peer/backend gone or not reachable (retry may help)
  kDeadlineExceeded,
  kDataLoss,  // peer violated the protocol; data cannot be trusted
  kInternal,
};

const char* ToString(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message, int sys_errno = 0)
      : code_(code), sys_errno_(sys_errno), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  // Wraps the current errno (or `err`) with context: "what: strerror".
  static Status FromErrno(std::string_view what, int err = errno);

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  // The errno an application should see for this failure (never 0 if !ok()).
  int sys_errno() const;
  const std::string& message() const { return message_; }
  std::string ToString() const;

 private:
  Code code_ = Code::kOk;
  int sys_errno_ = 0;
  std::string message_;
};

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace vsocket

// Propagates a non-OK Status out of the enclosing function.
#define VS_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::vsocket::Status vs_status_ = (expr);   \
    if (!vs_status_.ok()) return vs_status_; \
  } while (0)
