// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Leases that follow the work: the Consumer renews the lease of a delivery
// whose handler runs long (Source::ExtendLease), so no other worker gets the
// message meanwhile. Real time (the lease is 600 ms). Every message is
// published twice.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "idem/consumer.h"
#include "idem/embedded/queue.h"
#include "idem/inbox.h"
#include "idem/sqlite/store.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

// 5. Leases that follow the work: a handler three times the queue's lease
// runs once per copy, with no second delivery, because the Consumer renews
// the lease while it runs. Without the renewal (extend_leases = false) the
// message is redelivered to the other worker meanwhile. Real time: the
// lease is 600 ms.
TEST(LeaseKeeping, AHandlerThreeTimesTheLeaseRunsOnceWithNoSecondDelivery) {
  for (bool extend : {true, false}) {
    TempDir dir;
    auto store = sqlite::Store::Open({.path = dir.File("inbox.db")});
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE(CreatePayments(**store).ok());
    auto queue = embedded::Queue::Open({.path = dir.File("queue.db"), .lease_ms = 600, .durable = false});
    ASSERT_TRUE(queue.ok());
    for (int copy = 0; copy < 2; ++copy) ASSERT_TRUE((*queue)->Publish(Msg("slow-1")).ok());
    auto inbox_owned = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "payments"});
    Inbox& inbox = *inbox_owned;
    std::atomic<int> runs{0}, max_attempt{0};
    Handler slow = [&](Transaction& tx, const Message& m) -> Status {
      ++runs;
      int seen = max_attempt.load();
      while (m.attempt > seen && !max_attempt.compare_exchange_weak(seen, m.attempt)) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1800));
      return ChargeHandler()(tx, m);
    };
    auto consumer_owned = MustOpen<Consumer>(
        **queue, inbox, slow,
        Consumer::Options{.workers = 3, .receive_wait_ms = 50, .stop_when_idle = true, .extend_leases = extend});
    Consumer& consumer = *consumer_owned;
    ASSERT_TRUE(consumer.Run().ok());
    EXPECT_EQ(Charges(**store, "slow-1"), 1);
    if (extend) {
      // The copy waits for the first's commit (SQLite's write lock) and
      // finds its marker: the handler runs once.
      EXPECT_EQ(runs.load(), 1);
      EXPECT_EQ(max_attempt.load(), 1);
      EXPECT_EQ(consumer.stats().received, 2u) << "each copy received once: no second delivery";
      EXPECT_GE(consumer.stats().leases_extended, 2u);
    } else {
      EXPECT_GT(consumer.stats().received, 2u) << "control: without renewal the lease runs out under the handler";
      EXPECT_EQ(consumer.stats().leases_extended, 0u);
    }
  }
}

}  // namespace
}  // namespace idem::testing
