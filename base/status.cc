#include "base/status.h"

#include <cstring>

namespace vsocket {

const char* ToString(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: return "INVALID_ARGUMENT";
    case Code::kOutOfRange: return "OUT_OF_RANGE";
    case Code::kFailedPrecondition: return "FAILED_PRECONDITION";
    case Code::kNotFound: return "NOT_FOUND";
    case Code::kAlreadyExists: return "ALREADY_EXISTS";
    case Code::kPermissionDenied: return "PERMISSION_DENIED";
    case Code::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case Code::kUnavailable: return "UNAVAILABLE";
    case Code::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case Code::kDataLoss: return "DATA_LOSS";
    case Code::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

Status Status::FromErrno(std::string_view what, int err) {
  std::string msg(what);
  msg += ": ";
  msg += std::strerror(err);
  Code code = Code::kInternal;
  switch (err) {
    case EINVAL: code = Code::kInvalidArgument; break;
    case ENOENT: code = Code::kNotFound; break;
    case EEXIST: code = Code::kAlreadyExists; break;
    case EACCES:
    case EPERM: code = Code::kPermissionDenied; break;
    case ENOMEM:
    case ENOSPC:
    case EAGAIN: code = Code::kResourceExhausted; break;
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case ENOTCONN: code = Code::kUnavailable; break;
    case ETIMEDOUT: code = Code::kDeadlineExceeded; break;
    default: break;
  }
  return Status(code, std::move(msg), err);
}

int Status::sys_errno() const {
  if (sys_errno_ != 0) return sys_errno_;
  switch (code_) {
    case Code::kOk: return 0;
    case Code::kInvalidArgument: return EINVAL;
    case Code::kOutOfRange: return ERANGE;
    case Code::kFailedPrecondition: return ENOTCONN;
    case Code::kNotFound: return ENOENT;
    case Code::kAlreadyExists: return EEXIST;
    case Code::kPermissionDenied: return EACCES;
    case Code::kResourceExhausted: return EAGAIN;
    case Code::kUnavailable: return ECONNRESET;
    case Code::kDeadlineExceeded: return ETIMEDOUT;
    case Code::kDataLoss: return EPROTO;
    case Code::kInternal: return EIO;
  }
  return EIO;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s = vsocket::ToString(code_);
  s += ": ";
  s += message_;
  return s;
}

}  // namespace vsocket
