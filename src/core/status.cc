// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/status.h"

namespace idem {

std::string_view CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid_argument";
    case Code::kNotFound: return "not_found";
    case Code::kDuplicate: return "duplicate";
    case Code::kConflict: return "conflict";
    case Code::kInProgress: return "in_progress";
    case Code::kBusy: return "busy";
    case Code::kRetryable: return "retryable";
    case Code::kUnavailable: return "unavailable";
    case Code::kInDoubt: return "in_doubt";
    case Code::kCorruption: return "corruption";
    case Code::kSchemaMismatch: return "schema_mismatch";
    case Code::kIoError: return "io_error";
    case Code::kHandlerFailed: return "handler_failed";
    case Code::kLeaseLost: return "lease_lost";
    case Code::kAborted: return "aborted";
    case Code::kInternal: return "internal";
    case Code::kRejected: return "rejected";
  }
  return "unknown";
}

Status::Status(Code code, std::string message) {
  if (code != Code::kOk) state_ = std::make_shared<const State>(State{code, std::move(message)});
}

const std::string& Status::message() const noexcept {
  static const std::string kEmpty;
  return state_ ? state_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  std::string s(CodeName(code()));
  s += ": ";
  s += state_->message;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += state_->message;
  return Status(code(), std::move(m));
}

bool Status::IsTransient() const noexcept {
  switch (code()) {
    case Code::kBusy:
    case Code::kRetryable:
    case Code::kUnavailable:
    case Code::kIoError:
    case Code::kInDoubt: return true;
    default: return false;
  }
}

}  // namespace idem
