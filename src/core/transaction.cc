// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/transaction.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

namespace idem {

int64_t Value::AsInt() const {
  if (auto* i = std::get_if<int64_t>(&v_)) return *i;
  if (auto* d = std::get_if<double>(&v_)) {
    // Truncated, held within int64_t (a cast of a double out of range is
    // undefined); NaN is 0.
    if (std::isnan(*d)) return 0;
    if (*d >= 9223372036854775808.0) return std::numeric_limits<int64_t>::max();
    if (*d < -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
    return static_cast<int64_t>(*d);
  }
  if (auto* s = std::get_if<std::string>(&v_)) return std::strtoll(s->c_str(), nullptr, 10);
  return 0;
}

double Value::AsDouble() const {
  if (auto* i = std::get_if<int64_t>(&v_)) return static_cast<double>(*i);
  if (auto* d = std::get_if<double>(&v_)) return *d;
  if (auto* s = std::get_if<std::string>(&v_)) return std::strtod(s->c_str(), nullptr);
  return 0;
}

std::string Value::AsText() const {
  if (auto* i = std::get_if<int64_t>(&v_)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v_)) return std::to_string(*d);
  if (auto* s = std::get_if<std::string>(&v_)) return *s;
  if (auto* b = std::get_if<Blob>(&v_)) return b->bytes;
  return {};
}

}  // namespace idem
