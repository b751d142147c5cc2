// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: time arithmetic that saturates instead of overflowing, so a
// "for ever" setting (INT64_MAX milliseconds) means for ever rather than
// wrapping into the past.
#ifndef IDEM_SRC_CORE_SATURATING_H_
#define IDEM_SRC_CORE_SATURATING_H_

#include <cstdint>
#include <limits>

namespace idem::internal {

// a + b, held within int64_t's range.
inline int64_t SaturatingAdd(int64_t a, int64_t b) {
  if (b > 0 && a > std::numeric_limits<int64_t>::max() - b) return std::numeric_limits<int64_t>::max();
  if (b < 0 && a < std::numeric_limits<int64_t>::min() - b) return std::numeric_limits<int64_t>::min();
  return a + b;
}

}  // namespace idem::internal

#endif  // IDEM_SRC_CORE_SATURATING_H_
