// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: claim writes of concurrent callers flown together, one commit
// for a group (SqliteStore::Fly, PostgreSQL's QueryAlone). A caller that
// finds fewer flights out than the store allows flies at once, with what is
// queued; past that it waits in the queue, and the first caller awake when
// a flight lands takes the next one with everything queued (up to
// max_flight). The store's `fly` sends a group and gives each statement its
// answer, or none (the group was rolled back: that caller goes alone).
#ifndef IDEM_SRC_SQL_FLIGHTS_H_
#define IDEM_SRC_SQL_FLIGHTS_H_

#include <algorithm>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <semaphore>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "core/kill_point.h"
#include "idem/result.h"
#include "idem/store_backend.h"

namespace idem::sql_internal {

// One caller's statement waiting for its flight.
struct FlightJob {
  std::string_view sql;
  std::span<const Value> params;
  bool fenced = false;  // SQLite's FencedAlone: the fence bump first, undone if `sql` answers no row
  std::optional<Result<Rows>> out{};
  bool alone = false;  // its group was rolled back: it goes alone
  // Its caller sleeps here: released once its answer is in (or it goes
  // alone), or once it may fly. Released after the queue's lock is let go,
  // so the caller wakes to a free lock; `promised` (guarded by the queue's
  // lock) counts the releases owed to it, and the caller leaves only once it
  // has taken them all, so no release can reach a job that is gone.
  std::counting_semaphore<> wake{0};
  int promised = 0;
};

class FlightQueue {
 public:
  // At most `max_flight` statements in a flight; `queued_point` is the kill
  // point a caller passes once when it finds every flight out (tests count
  // the callers that wait).
  FlightQueue(size_t max_flight, const char* queued_point) : max_flight_(max_flight), queued_point_(queued_point) {}

  // Queues `job` and returns once it has its answer (job.out) or must go
  // alone (job.alone), with at most `max_out` flights out at once.
  // `fly(group)` sends a group: a vector of one std::optional<Result<Rows>>
  // per job, in its order.
  template <typename Fly>
  void Join(FlightJob& job, int max_out, Fly&& fly) {
    std::unique_lock lock(mu_);
    queue_.push_back(&job);
    bool queued = false;
    int taken = 0;  // of job.promised
    while (!job.out.has_value() && !job.alone) {
      if (out_ >= max_out || queue_.empty()) {
        if (!std::exchange(queued, true) && out_ >= max_out) {
          lock.unlock();
          IDEM_KILL_POINT(queued_point_);
          lock.lock();
          continue;
        }
        Sleep(job, taken, lock);
        continue;
      }
      const auto n = static_cast<std::ptrdiff_t>(std::min(queue_.size(), max_flight_));
      std::vector<FlightJob*> group(queue_.begin(), queue_.begin() + n);
      queue_.erase(queue_.begin(), queue_.begin() + n);
      ++out_;
      lock.unlock();
      std::vector<std::optional<Result<Rows>>> answers = fly(std::span<FlightJob* const>(group));
      lock.lock();
      --out_;
      std::vector<FlightJob*> woken;
      woken.reserve(group.size() + 1);
      for (size_t i = 0; i < group.size(); ++i) {
        if (answers[i].has_value()) {
          group[i]->out.emplace(std::move(*answers[i]));
        } else {
          group[i]->alone = true;
        }
        if (group[i] != &job) woken.push_back(group[i]);
      }
      // The first caller waiting takes the next flight.
      if (!queue_.empty()) woken.push_back(queue_.front());
      for (FlightJob* w : woken) ++w->promised;
      lock.unlock();
      for (FlightJob* w : woken) w->wake.release();
      lock.lock();
    }
    // Releases owed to this job may still be on their way: take them before
    // it goes.
    while (taken < job.promised) Sleep(job, taken, lock);
  }

 private:
  // Waits (the lock let go meanwhile) for the next release owed to `job`.
  static void Sleep(FlightJob& job, int& taken, std::unique_lock<std::mutex>& lock) {
    lock.unlock();
    job.wake.acquire();
    ++taken;
    lock.lock();
  }

  const size_t max_flight_;
  const char* const queued_point_;
  std::mutex mu_;
  std::deque<FlightJob*> queue_;  // guarded by mu_: waiting for a flight
  int out_ = 0;                   // guarded by mu_: flights out
};

}  // namespace idem::sql_internal

#endif  // IDEM_SRC_SQL_FLIGHTS_H_
