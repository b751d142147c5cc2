// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// FakeEnv: an Env (idem/env.h) for tests, whose clock moves only when told.
//
// Thread safety: safe from many threads.
#ifndef IDEM_TESTING_FAKE_ENV_H_
#define IDEM_TESTING_FAKE_ENV_H_

#include <atomic>
#include <cstdint>
#include <mutex>

#include "idem/env.h"

namespace idem {

// A clock that moves only when told. SleepMs advances it instead of blocking,
// so code that backs off or waits for a lease finishes at once in tests.
class FakeEnv final : public Env {
 public:
  explicit FakeEnv(int64_t start_ms = 1'700'000'000'000, uint64_t seed = 42) : now_ms_(start_ms), rng_(seed) {}
  int64_t NowMs() override { return now_ms_.load(); }
  void SleepMs(int64_t ms) override { Advance(ms); }
  uint64_t Random() override;
  void Advance(int64_t ms) { now_ms_.fetch_add(ms); }

 private:
  std::atomic<int64_t> now_ms_;
  std::mutex mu_;
  uint64_t rng_;
};

}  // namespace idem

#endif  // IDEM_TESTING_FAKE_ENV_H_
