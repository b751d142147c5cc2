// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: the one retry backoff every retry loop in idem uses (the
// Consumer's redeliveries and receive errors, http::Client's attempts).
#ifndef IDEM_SRC_CORE_BACKOFF_H_
#define IDEM_SRC_CORE_BACKOFF_H_

#include <algorithm>
#include <cstdint>
#include <limits>

#include "idem/env.h"

namespace idem::internal {

// base * 2^(attempt-1), at most max, plus up to 25% jitter from
// env.Random(). Attempt 1 (or less) waits about `base`. Saturates instead of
// overflowing when base or max are huge; negative settings count as 0.
inline int64_t JitteredBackoffMs(int64_t base_ms, int64_t max_ms, int attempt, Env& env) {
  const int shift = std::clamp(attempt - 1, 0, 62);
  const int64_t base = std::max<int64_t>(0, base_ms);
  const int64_t max = std::max<int64_t>(0, max_ms);
  int64_t d = base > (max >> shift) ? max : std::min(max, base << shift);
  if (d > 0) {
    const int64_t jitter = static_cast<int64_t>(env.Random() % static_cast<uint64_t>(d / 4 + 1));
    d = d > std::numeric_limits<int64_t>::max() - jitter ? std::numeric_limits<int64_t>::max() : d + jitter;
  }
  return d;
}

}  // namespace idem::internal

#endif  // IDEM_SRC_CORE_BACKOFF_H_
