// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem chaos: the clock jumps. A consumer life the schedule gives clock
// jumps reads its time through a ShiftedClock: the real clock plus an offset
// the supervisor writes to DIR/clock/<slot>-<life> (one number of
// milliseconds, replaced whole by a rename). The life's Consumer, Inbox and
// source (where the source reads a clock: embedded, Redis Streams) all read
// it, so a jump forward past the lease makes the life take deliveries other
// consumers still hold and see its own leases as run out, and a jump back
// makes it renew too late and trust a lease the others see as expired.
#ifndef IDEM_TOOLS_IDEM_CHAOS_CLOCK_H_
#define IDEM_TOOLS_IDEM_CHAOS_CLOCK_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "idem/env.h"
#include "idem/result.h"

namespace idem::cli::chaos {

class ShiftedClock final : public Env {
 public:
  // Reads `path` every few milliseconds on a thread of its own (a missing
  // file: offset 0); `seen` is called with each new offset it reads.
  static Result<std::unique_ptr<ShiftedClock>> Start(std::string path, std::function<void(int64_t)> seen);
  ~ShiftedClock() override;
  ShiftedClock(const ShiftedClock&) = delete;
  ShiftedClock& operator=(const ShiftedClock&) = delete;

  int64_t NowMs() override { return Env::Default()->NowMs() + offset_.load(std::memory_order_relaxed); }
  void SleepMs(int64_t ms) override { Env::Default()->SleepMs(ms); }
  uint64_t Random() override { return Env::Default()->Random(); }

 private:
  ShiftedClock(std::string path, std::function<void(int64_t)> seen);
  void Watch();

  const std::string path_;
  const std::function<void(int64_t)> seen_;
  std::atomic<int64_t> offset_{0};
  std::atomic<bool> stop_{false};
  std::thread watcher_;
};

// The supervisor's side: sets the offset a ShiftedClock on `path` reads.
Status WriteClockOffset(const std::string& path, int64_t offset_ms);

}  // namespace idem::cli::chaos

#endif  // IDEM_TOOLS_IDEM_CHAOS_CLOCK_H_
