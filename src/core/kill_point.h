// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: kill points, named places in the library's code where a test or
// `idem chaos` can crash the process on purpose (the crash and chaos suites).
// Never installed, never included from a public header. The arming API is the
// test kit's (idem/testing/kill_points.h, idem::testing).
//
// IDEM_KILL_POINT("inbox.after_marker") marks a window that matters for
// exactly-once. It compiles to nothing unless idem is built with
// -DIDEM_WITH_KILL_POINTS=ON (which ./run test and ./run demo do; the build
// define IDEM_KILL_POINTS), and only such a build compiles the registry
// (src/core/kill_point.cc). When no point is armed the cost is one relaxed
// atomic load.
//
// The names are listed in doc/reliability.md; the library's are:
//   consumer.after_receive deliveries received (their leases held), not yet handled
//   inbox.before_marker    transaction begun, marker not yet inserted
//   inbox.after_marker     marker inserted, handler not yet run
//   inbox.after_work       handler done, COMMIT not yet issued
//   inbox.after_commit     COMMIT done, the source not yet acknowledged
//   consumer.after_ack     the source acknowledged
//   inbox.batch_mid        half of a batch's handlers done
//   postgres.commit_sent   COMMIT sent to PostgreSQL, its answer not yet read
//   sqlite.commit_done     SQLite ran COMMIT, the store has not yet read its outcome
//   claims.finish_done     a claim store finished a claim (Complete, or Fail with
//                          a final error or a release), the caller not yet told
//   claims.lease_lost      a claim's holder is told it lost its lease (its
//                          Complete, Fail or Extend refused: fenced)
//   consumer.lease_lost    the source refused a consumer's lease renewal or ack:
//                          another delivery of the message may be running
//   sqlite.checkpoint      the store's checkpointer thread is about to copy the
//                          WAL back into the database file
//   postgres.round_trip    a request PostgreSQL must answer before the client
//                          goes on is about to be sent (tests count them)
//   postgres.claim_queued  a claim statement outside a transaction found every
//                          flight out and waits to go with the next (tests count them)
//   sqlite.claim_queued    a claim write outside a transaction found a flight out
//                          and waits to go with the next (tests count them)
//   outbox.after_add       Outbox::Add queued its rows, the transaction still open
//   relay.after_lock       a relay rebalanced its lanes
//   relay.after_fetch      a relay fetched a round's rows, nothing handed over yet
//   relay.before_publish   a round's batch built, not yet handed to the publisher
//   relay.after_publish    the broker answered a batch, nothing recorded yet
//   relay.before_settle    a round published, its record not yet begun
//   relay.before_settle_commit  the round's record written, not committed
//   relay.after_settle     the round's record committed
//   store.purge_batch      a marker purge committed a batch, the next not yet begun
//   http.after_claim       an HTTP request's key claimed, the handler not yet run
//   http.before_complete   the handler's effect done, the response not yet stored
//   http.group_before_commit  a group of transactional requests run, COMMIT not yet issued
//   http.group_after_commit   the group committed, no request of it answered yet
//
// Thread safety: safe from many threads.
#ifndef IDEM_SRC_CORE_KILL_POINT_H_
#define IDEM_SRC_CORE_KILL_POINT_H_

#if defined(IDEM_KILL_POINTS) && IDEM_KILL_POINTS

#include <atomic>
#include <functional>
#include <string_view>

namespace idem::internal {

extern std::atomic<bool> g_kill_point_armed;
// Counts a hit of `name`; runs the armed action on the armed hit.
void HitKillPoint(std::string_view name);

// The registry behind idem::ArmKillPoint and idem::DisarmKillPoints (the test
// kit's API): `name`'s `hit`-th hit (1-based) runs `action`, or SIGKILLs the
// process when `action` is empty. One point is armed at a time.
void SetKillPoint(std::string_view name, int hit, std::function<void()> action);
void ClearKillPoint();

}  // namespace idem::internal

#define IDEM_KILL_POINT(name)                                                                                       \
  do {                                                                                                              \
    if (::idem::internal::g_kill_point_armed.load(std::memory_order_relaxed)) ::idem::internal::HitKillPoint(name); \
  } while (0)

#else

#define IDEM_KILL_POINT(name) \
  do {                        \
  } while (0)

#endif

#endif  // IDEM_SRC_CORE_KILL_POINT_H_
