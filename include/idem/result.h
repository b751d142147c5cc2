// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Result<T>: a T or the Status that says why there is none. A thin stand-in for
// std::expected, which g++ 12 offers only under -std=c++2b.
//
// Thread safety: as for T.
#ifndef IDEM_RESULT_H_
#define IDEM_RESULT_H_

#include <cassert>
#include <optional>
#include <utility>

#include "idem/status.h"

namespace idem {

template <typename T>
class [[nodiscard]] Result {
 public:
  // A value.
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  // An error. `status` must not be OK.
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    assert(!status_.ok());
    if (status_.ok()) status_ = Status::Internal("Result built from an OK status without a value");
  }

  bool ok() const noexcept { return value_.has_value(); }
  // OK when there is a value.
  const Status& status() const noexcept { return status_; }

  // Precondition: ok().
  T& value() & {
    assert(ok());
    return *value_;
  }
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace idem

// Evaluates `rexpr` (a Result); on error returns its status from the enclosing
// function, otherwise moves the value into `lhs` (a declaration or lvalue).
#define IDEM_ASSIGN_OR_RETURN(lhs, rexpr) IDEM_ASSIGN_OR_RETURN_IMPL_(IDEM_CONCAT_(idem_result_, __LINE__), lhs, rexpr)
#define IDEM_CONCAT_INNER_(a, b) a##b
#define IDEM_CONCAT_(a, b) IDEM_CONCAT_INNER_(a, b)
// `lhs` may be a declaration ("auto x"), which parentheses would break.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define IDEM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)

#endif  // IDEM_RESULT_H_
