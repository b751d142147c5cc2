// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Claims on a SQLite store made to go in one flight (claim writes outside a
// transaction that share a commit: SqliteStore::Fly), for the store's tests
// and the fault VFS's. Needs a build with kill points.
#ifndef IDEM_TEST_UTIL_SQLITE_CLAIM_FLIGHTS_H_
#define IDEM_TEST_UTIL_SQLITE_CLAIM_FLIGHTS_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "idem/claims.h"
#include "idem/testing/kill_points.h"
#include "util/claims_conformance.h"

namespace idem::testing {

// Claims `keys` (GroupRequest) from a thread each so that they go in one
// flight: a lone claim ("alone") stops after its commit while the callers of
// `keys` queue behind it; then `meanwhile` runs and everything goes. got[0]
// is the lone claim's answer, got[1 + i] keys[i]'s; `commits` counts the
// commits after the lone one's. False when the store never queued them
// (bounded: then nothing is left waiting).
inline bool ClaimInOneFlight(Claims& claims, const std::vector<std::string>& keys,
                             std::vector<Result<ClaimOutcome>>& got, int& commits,
                             const std::function<void()>& meanwhile = {}) {
  std::mutex mu;
  std::condition_variable cv;
  bool held = false, go = false;
  size_t queued = 0;
  commits = 0;
  got.assign(keys.size() + 1, Status::Internal("not run"));
  std::vector<std::thread> threads;
  auto claim = [&](size_t i, const std::string& key) {
    threads.emplace_back([&, i, key] {
      Result<ClaimOutcome> c = claims.Claim(GroupRequest(key));
      std::lock_guard l(mu);
      got[i] = std::move(c);
    });
  };
  auto wait_for = [&](const std::function<bool()>& reached) {
    std::unique_lock l(mu);
    if (cv.wait_for(l, std::chrono::seconds(60), reached)) return true;
    go = true;
    cv.notify_all();
    return false;
  };
  std::function<void()> count = [&] {
    {
      std::lock_guard l(mu);
      ++commits;
    }
    ArmKillPoint("sqlite.commit_done", 1, count);
  };
  // The lone claim's flight stops after its commit and arms the count of
  // the callers that wait; once they all wait, commits are counted.
  ArmKillPoint("sqlite.commit_done", 1, [&] {
    ArmKillPoint("sqlite.claim_queued", static_cast<int>(keys.size()), [&] {
      {
        std::lock_guard l(mu);
        queued = keys.size();
      }
      cv.notify_all();
      ArmKillPoint("sqlite.commit_done", 1, count);
    });
    std::unique_lock l(mu);
    held = true;
    cv.notify_all();
    cv.wait(l, [&] { return go; });
  });
  claim(0, "alone");
  bool reached = wait_for([&] { return held; });
  for (size_t i = 0; reached && i < keys.size(); ++i) claim(i + 1, keys[i]);
  reached = reached && wait_for([&] { return queued == keys.size(); });
  if (reached && meanwhile) meanwhile();
  {
    std::lock_guard l(mu);
    go = true;
  }
  cv.notify_all();
  for (auto& t : threads) t.join();
  DisarmKillPoints();
  return reached;
}

}  // namespace idem::testing

#endif  // IDEM_TEST_UTIL_SQLITE_CLAIM_FLIGHTS_H_
