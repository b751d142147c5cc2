// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Env: the seam through which idem reads the clock, sleeps and draws random
// numbers, so that leases, retention and backoff can be tested with a fake
// clock and no sleeps. Kill points: named places in product code where a test
// or `idem chaos` can crash the process on purpose.
//
// Thread safety: Env implementations must be safe to call from any thread.
#ifndef IDEM_ENV_H_
#define IDEM_ENV_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>

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

// A clock that moves only when told. SleepMs advances it instead of blocking,
// so code that backs off or waits for a lease finishes at once in tests.
class FakeEnv final : public Env {
 public:
  explicit FakeEnv(int64_t start_ms = 1'700'000'000'000, uint64_t seed = 42)
      : now_ms_(start_ms), rng_(seed) {}
  int64_t NowMs() override { return now_ms_.load(); }
  void SleepMs(int64_t ms) override { Advance(ms); }
  uint64_t Random() override;
  void Advance(int64_t ms) { now_ms_.fetch_add(ms); }

 private:
  std::atomic<int64_t> now_ms_;
  std::mutex mu_;
  uint64_t rng_;
};

// ---------------------------------------------------------------------------
// Kill points.
//
// IDEM_KILL_POINT("inbox.after_marker") marks a window that matters for
// exactly-once. When the build option IDEM_KILL_POINTS is on (the default) and
// a kill point is armed, reaching it the n-th time runs its action: by default
// the process sends itself SIGKILL, as a crash or power cut would. When no
// point is armed the cost is one relaxed atomic load.
//
// Arm from a test with ArmKillPoint(), or from outside a process through the
// environment variable IDEM_KILL_AT="<name>" or "<name>:<n>" (read by
// ArmKillPointFromEnv(), which the idem CLI calls at start).
//
// The names are listed in doc/reliability.md; the product's are:
//   inbox.before_marker    transaction begun, marker not yet inserted
//   inbox.after_marker     marker inserted, handler not yet run
//   inbox.after_work       handler done, COMMIT not yet issued
//   inbox.after_commit     COMMIT done, the source not yet acknowledged
//   consumer.after_ack     the source acknowledged
//   inbox.batch_mid        half of a batch's handlers done
//   postgres.commit_sent   COMMIT sent to PostgreSQL, its answer not yet read
//   sqlite.checkpoint      the store's checkpointer thread is about to copy the
//                          WAL back into the database file
//   postgres.round_trip    a request PostgreSQL must answer before the client
//                          goes on is about to be sent (tests count them)
//   http.after_claim       an HTTP request's key claimed, the handler not yet run
//   http.before_complete   the handler's effect done, the response not yet stored
//   http.group_before_commit  a group of transactional requests run, COMMIT not yet issued
//   http.group_after_commit   the group committed, no request of it answered yet
// ---------------------------------------------------------------------------

// Arms `name`: its `hit`-th hit (1-based) runs `action`, or SIGKILLs the
// process when `action` is empty. Only one point is armed at a time.
void ArmKillPoint(std::string_view name, int hit = 1, std::function<void()> action = {});
// Disarms whatever is armed.
void DisarmKillPoints();
// Arms from IDEM_KILL_AT if set. Returns whether something was armed.
bool ArmKillPointFromEnv();

namespace internal {
extern std::atomic<bool> g_kill_point_armed;
void HitKillPoint(std::string_view name);
}  // namespace internal

}  // namespace idem

#if defined(IDEM_KILL_POINTS) && IDEM_KILL_POINTS
#define IDEM_KILL_POINT(name)                                                      \
  do {                                                                             \
    if (::idem::internal::g_kill_point_armed.load(std::memory_order_relaxed))      \
      ::idem::internal::HitKillPoint(name);                                        \
  } while (0)
#else
#define IDEM_KILL_POINT(name) \
  do {                        \
  } while (0)
#endif

#endif  // IDEM_ENV_H_
