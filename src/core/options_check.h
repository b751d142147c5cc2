// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: the checks every adapter's T::Open makes of its Options
// (doc/adapters.md, "Validating options"). A value out of range is refused,
// never clamped, with kInvalidArgument naming the adapter, the field, the
// rule and the value:
//   "amqp source: Options::connect_timeout_ms must be >= 1, got 0"
// Header-only, so every adapter uses it without linking anything new.
#ifndef IDEM_SRC_CORE_OPTIONS_CHECK_H_
#define IDEM_SRC_CORE_OPTIONS_CHECK_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "idem/status.h"

namespace idem::options_internal {

// kInvalidArgument "<what>: Options::<field> must be <rule>, got <got>".
inline Status Refuse(std::string_view what, std::string_view field, std::string_view rule, std::string_view got) {
  std::string m(what);
  m += ": Options::";
  m += field;
  m += " must be ";
  m += rule;
  m += ", got ";
  m += got;
  return Status::InvalidArgument(std::move(m));
}

// `value` >= `min`.
inline Status AtLeast(std::string_view what, std::string_view field, int64_t value, int64_t min) {
  if (value >= min) return Status::OK();
  return Refuse(what, field, ">= " + std::to_string(min), std::to_string(value));
}

// `min` <= `value` <= `max`.
inline Status InRange(std::string_view what, std::string_view field, int64_t value, int64_t min, int64_t max) {
  if (value >= min && value <= max) return Status::OK();
  return Refuse(what, field, std::to_string(min) + ".." + std::to_string(max), std::to_string(value));
}

// A name that must be given.
inline Status NotEmpty(std::string_view what, std::string_view field, std::string_view value) {
  if (!value.empty()) return Status::OK();
  return Refuse(what, field, "given", "an empty string");
}

}  // namespace idem::options_internal

#endif  // IDEM_SRC_CORE_OPTIONS_CHECK_H_
