// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// A consumer keeps running while its PostgreSQL server stops and starts
// again: deliveries fail without being acknowledged while it is down, and
// once it is back the consumer recovers by itself, every message applied once.
// The test starts its own server (its own port), so restarting it disturbs
// no other test.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "idem/consumer.h"
#include "idem/embedded/queue.h"
#include "idem/inbox.h"
#include "idem/postgres/store.h"
#include "util/test_servers.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

std::string Script() { return std::string(IDEM_SOURCE_DIR) + "/scripts/test-postgres.sh"; }

class PostgresRestart : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* p = std::getenv("IDEM_TEST_PG_RESTART_PORT");
    port_ = p ? p : "25441";
    state_ = dir_.File("pg");
    ASSERT_EQ(std::system((Script() + " start " + state_ + " " + port_ + " >/dev/null").c_str()), 0)
        << "could not start the test's own PostgreSQL from port " << port_ << " on";
    url_ = StartedServerUrl(state_);  // the first free port from port_ on
  }
  void TearDown() override { (void)std::system((Script() + " stop " + state_ + " 2>/dev/null").c_str()); }

  TempDir dir_;
  std::string port_, state_, url_;
};

TEST_F(PostgresRestart, ConsumerRecoversWhenTheServerComesBack) {
  auto store = postgres::Store::Open({.url = url_, .connect_timeout_ms = 2000});
  ASSERT_OK(store);
  ASSERT_TRUE(CreatePayments(**store).ok());
  auto queue = embedded::Queue::Open({.path = dir_.File("queue.db"), .queue = "payments", .lease_ms = 5'000});
  ASSERT_OK(queue);
  constexpr int kMessages = 60;
  for (int copy = 0; copy < 2; ++copy)
    for (int i = 0; i < kMessages; ++i) ASSERT_TRUE((*queue)->Publish(Msg("m-" + std::to_string(i))).ok());

  auto inbox_owned = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  std::atomic<int> applied{0};
  std::atomic<bool> paused{false};
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    // From the 10th on, deliveries wait (in their transactions) until the
    // server is down: stopping it takes a while, and without the wait the
    // rest could all be applied before it goes, so nothing would meet it down.
    while (applied.load() >= 10 && !paused.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    IDEM_RETURN_IF_ERROR(ChargeHandler()(tx, m));
    ++applied;
    return Status::OK();
  };
  auto consumer_owned = MustOpen<Consumer>(
      **queue, inbox, h,
      Consumer::Options{
          .workers = 2, .max_attempts = 0, .backoff_base_ms = 20, .backoff_max_ms = 200, .receive_wait_ms = 50});
  Consumer& consumer = *consumer_owned;
  std::thread runner([&] { (void)consumer.Run(); });

  ASSERT_TRUE(WaitFor([&] { return applied.load() >= 10; }));
  ASSERT_EQ(std::system((Script() + " pause " + state_).c_str()), 0);
  paused = true;
  // While the server is down, deliveries fail and are given back, not acked.
  EXPECT_TRUE(WaitFor([&] { return inbox.counters().failures >= 3; }));
  ASSERT_EQ(std::system((Script() + " resume " + state_).c_str()), 0);
  bool drained = WaitFor([&] {
    auto st = (*queue)->Stats();
    return st.ok() && st->ready + st->leased + st->delayed == 0;
  });
  consumer.Stop();
  runner.join();
  EXPECT_TRUE(drained);
  EXPECT_GE(inbox.counters().failures, 3u);
  EXPECT_EQ(Charges(**store), kMessages);
  EXPECT_EQ(*(*store)->CountMarkers("payments"), kMessages);
  auto st = (*queue)->Stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->acked, 2 * kMessages);
}

}  // namespace
}  // namespace idem::testing
