// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Env: the seam through which idem reads the clock, sleeps and draws random
// numbers, so that leases, retention and backoff can be tested with a fake
// clock and no sleeps (idem/testing/fake_env.h).
//
// Thread safety: Env implementations must be safe to call from any thread.
#ifndef IDEM_ENV_H_
#define IDEM_ENV_H_

#include <cstdint>

namespace idem {

class Env {
 public:
  virtual ~Env() = default;
  // Wall-clock time in milliseconds since the Unix epoch (stored in records).
  virtual int64_t NowMs() = 0;
  // Blocks the calling thread for about `ms` milliseconds.
  virtual void SleepMs(int64_t ms) = 0;
  // A uniformly random 64-bit number.
  virtual uint64_t Random() = 0;

  // The real clock. Never null, never destroyed.
  static Env* Default();
};

}  // namespace idem

#endif  // IDEM_ENV_H_
