// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Status: the outcome of an operation that can fail, as a cheap value.
//
// Thread safety: a Status is an immutable value; copies may be used from any
// thread.
#ifndef IDEM_STATUS_H_
#define IDEM_STATUS_H_

#include <memory>
#include <ostream>
#include <string>
#include <string_view>

namespace idem {

// A small closed set of codes that mean something to an idempotent consumer.
// Callers branch on the code; the message is for people.
enum class Code {
  kOk = 0,
  kInvalidArgument,  // the caller's input is malformed (empty id, bad URL, ...)
  kNotFound,         // the thing asked for does not exist
  kDuplicate,        // a unique key says this was done already
  kConflict,         // a key was reused for different content
  kInProgress,       // someone else holds the key right now
  kBusy,             // a lock could not be taken in time; retry later
  kRetryable,        // a transient failure (serialization, deadlock); retry
  kUnavailable,      // the server or file cannot be reached or opened
  kInDoubt,          // a commit may or may not have happened; resolve by reading
  kCorruption,       // stored data is not what idem wrote (corrupt or foreign file)
  kSchemaMismatch,   // the stored schema is of a version this build does not know
  kIoError,          // the operating system failed a read or write
  kHandlerFailed,    // the user's handler returned an error or threw
  kLeaseLost,        // a lease/receipt is no longer ours (expired, taken over)
  kAborted,          // stopped on request (shutdown)
  kInternal,         // a bug in idem
  kRejected,         // the message can never be handled (a malformed payload,
                     // a business rule): a handler's permanent failure, never
                     // retried
};

// Returns the stable lower-case name of a code ("invalid_argument", ...).
std::string_view CodeName(Code code);

class [[nodiscard]] Status {
 public:
  // OK.
  Status() noexcept = default;
  // For a code known only at run time (a translated driver error, a status
  // passed on with another message). Otherwise use the factory of the code.
  Status(Code code, std::string message);

  // One factory per code, named as the code.
  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
  static Status Busy(std::string m) { return {Code::kBusy, std::move(m)}; }
  static Status Unavailable(std::string m) { return {Code::kUnavailable, std::move(m)}; }
  static Status InDoubt(std::string m) { return {Code::kInDoubt, std::move(m)}; }
  static Status Corruption(std::string m) { return {Code::kCorruption, std::move(m)}; }
  static Status IoError(std::string m) { return {Code::kIoError, std::move(m)}; }
  static Status HandlerFailed(std::string m) { return {Code::kHandlerFailed, std::move(m)}; }
  static Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }
  static Status Duplicate(std::string m) { return {Code::kDuplicate, std::move(m)}; }
  static Status Conflict(std::string m) { return {Code::kConflict, std::move(m)}; }
  static Status InProgress(std::string m) { return {Code::kInProgress, std::move(m)}; }
  static Status Retryable(std::string m) { return {Code::kRetryable, std::move(m)}; }
  static Status SchemaMismatch(std::string m) { return {Code::kSchemaMismatch, std::move(m)}; }
  static Status LeaseLost(std::string m) { return {Code::kLeaseLost, std::move(m)}; }
  static Status Aborted(std::string m) { return {Code::kAborted, std::move(m)}; }
  // For a handler: this message can never be handled (its payload is
  // malformed, a business rule refuses it). The Consumer dead-letters it at
  // once with this reason (reason "rejected") and never retries it; every
  // other error keeps the retry policy. Nothing the handler wrote commits.
  static Status Rejected(std::string m) { return {Code::kRejected, std::move(m)}; }

  bool ok() const noexcept { return state_ == nullptr; }
  Code code() const noexcept { return state_ ? state_->code : Code::kOk; }

  // One predicate per code: s.IsNotFound() is s.code() == Code::kNotFound.
  bool IsInvalidArgument() const noexcept { return code() == Code::kInvalidArgument; }
  bool IsNotFound() const noexcept { return code() == Code::kNotFound; }
  bool IsDuplicate() const noexcept { return code() == Code::kDuplicate; }
  bool IsConflict() const noexcept { return code() == Code::kConflict; }
  bool IsInProgress() const noexcept { return code() == Code::kInProgress; }
  bool IsBusy() const noexcept { return code() == Code::kBusy; }
  bool IsRetryable() const noexcept { return code() == Code::kRetryable; }
  bool IsUnavailable() const noexcept { return code() == Code::kUnavailable; }
  bool IsInDoubt() const noexcept { return code() == Code::kInDoubt; }
  bool IsCorruption() const noexcept { return code() == Code::kCorruption; }
  bool IsSchemaMismatch() const noexcept { return code() == Code::kSchemaMismatch; }
  bool IsIoError() const noexcept { return code() == Code::kIoError; }
  bool IsHandlerFailed() const noexcept { return code() == Code::kHandlerFailed; }
  bool IsLeaseLost() const noexcept { return code() == Code::kLeaseLost; }
  bool IsAborted() const noexcept { return code() == Code::kAborted; }
  bool IsInternal() const noexcept { return code() == Code::kInternal; }
  bool IsRejected() const noexcept { return code() == Code::kRejected; }
  // Empty for OK.
  const std::string& message() const noexcept;

  // "ok" or "<code name>: <message>".
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>". OK stays OK.
  Status WithContext(std::string_view context) const;

  // Whether retrying the same operation later may succeed (busy, retryable,
  // unavailable, I/O error).
  bool IsTransient() const noexcept;

 private:
  struct State {
    Code code;
    std::string message;
  };
  // nullptr means OK, so the OK path allocates nothing.
  std::shared_ptr<const State> state_;
};

inline std::ostream& operator<<(std::ostream& os, const Status& s) { return os << s.ToString(); }

}  // namespace idem

// Returns early from the enclosing function with the status when it is not OK.
#define IDEM_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::idem::Status idem_status_ = (expr);        \
    if (!idem_status_.ok()) return idem_status_; \
  } while (0)

#endif  // IDEM_STATUS_H_
