// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// StopOnSignals (idem/signals.h) for a Consumer and an OutboxRelay in one
// process: one SIGTERM, raised in the process, stops both cleanly; the
// handlers in place before the first attach come back when the last object
// goes; StopOnSignals(nullptr) detaches everything. (The HTTP server's and
// the webhook receiver's are in test/http.)
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "idem/consumer.h"
#include "idem/embedded/queue.h"
#include "idem/inbox.h"
#include "idem/outbox.h"
#include "idem/outbox_relay.h"
#include "idem/sqlite/store.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

std::atomic<int> g_previous_handler_calls{0};
extern "C" void PreviousHandler(int) { g_previous_handler_calls.fetch_add(1); }

// Installs PreviousHandler for SIGINT and SIGTERM for the test's life, as a
// program's own handling before idem's.
class SignalsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_previous_handler_calls = 0;
    struct sigaction sa {};
    sa.sa_handler = PreviousHandler;
    sigemptyset(&sa.sa_mask);
    ASSERT_EQ(::sigaction(SIGINT, &sa, &old_int_), 0);
    ASSERT_EQ(::sigaction(SIGTERM, &sa, &old_term_), 0);
  }
  void TearDown() override {
    StopOnSignals(nullptr);
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }
  static bool PreviousHandlerInstalled(int sig) {
    struct sigaction now {};
    ::sigaction(sig, nullptr, &now);
    return now.sa_handler == PreviousHandler;
  }

  TempDir dir_;
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

TEST_F(SignalsTest, OneSigtermStopsTheConsumerAndTheRelayAndThePreviousHandlersComeBack) {
  auto s = sqlite::Store::Open({.path = dir_.File("store.db")});
  ASSERT_OK(s);
  std::unique_ptr<Store> store = std::move(*s);
  ASSERT_TRUE(CreatePayments(*store).ok());
  auto outbox = Outbox::Open(*store, {});
  ASSERT_OK(outbox);
  {
    auto tx = store->Begin();
    ASSERT_OK(tx);
    for (int i = 0; i < 3; ++i)
      ASSERT_TRUE((*outbox)->Add(**tx, OutgoingMessage{.id = "paid-" + std::to_string(i), .payload = "paid"}).ok());
    ASSERT_OK((*tx)->Commit());
  }
  auto shipping = embedded::Queue::Open({.path = dir_.File("shipping.db"), .durable = false});
  ASSERT_OK(shipping);
  auto orders = embedded::Queue::Open({.path = dir_.File("orders.db"), .durable = false});
  ASSERT_OK(orders);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE((*orders)->Publish(Msg("order-" + std::to_string(i))).ok());

  // Both run until Stop(): only the signal ends them.
  auto relay = OutboxRelay::Open(*store, **shipping, {.poll_ms = 10});
  ASSERT_OK(relay);
  auto inbox = MustOpen<Inbox>(*store, Inbox::Options{.consumer = "payments"});
  std::atomic<int> handled{0};
  const Handler handler = [&](Transaction& tx, const Message& m) -> Status {
    if (handled.fetch_add(1) == 0) ::raise(SIGTERM);  // while this delivery is in flight
    return ChargeHandler()(tx, m);
  };
  auto consumer = MustOpen<Consumer>(**orders, *inbox, handler, Consumer::Options{.receive_wait_ms = 20});
  StopOnSignals(relay->get());
  StopOnSignals(consumer.get());
  EXPECT_FALSE(PreviousHandlerInstalled(SIGTERM));

  auto relay_run = std::async(std::launch::async, [&] { return (*relay)->Run(); });
  // Bounded waits that end a broken test instead of hanging it; not timing.
  for (int i = 0; i < 6000 && (*relay)->stats().published < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ((*relay)->stats().published, 3u);
  ASSERT_OK(consumer->Run());
  ASSERT_EQ(relay_run.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "the relay did not stop";
  EXPECT_OK(relay_run.get());
  EXPECT_TRUE(consumer->stopping());
  EXPECT_EQ(Charges(*store), 1) << "the delivery in flight finished";
  EXPECT_EQ(consumer->stats().acked, 1u);
  EXPECT_EQ(g_previous_handler_calls, 0) << "idem's handler took the signal";

  // The last object gone, the program's own handling is back.
  relay->reset();
  EXPECT_FALSE(PreviousHandlerInstalled(SIGTERM)) << "the consumer is still attached";
  consumer.reset();
  EXPECT_TRUE(PreviousHandlerInstalled(SIGTERM));
  EXPECT_TRUE(PreviousHandlerInstalled(SIGINT));
  ::raise(SIGTERM);
  EXPECT_EQ(g_previous_handler_calls, 1);
}

TEST_F(SignalsTest, StopOnSignalsNullptrDetachesEveryObject) {
  auto q = embedded::Queue::Open({.path = dir_.File("q.db"), .durable = false});
  ASSERT_OK(q);
  auto s = sqlite::Store::Open({.path = dir_.File("store.db")});
  ASSERT_OK(s);
  auto inbox = MustOpen<Inbox>(**s, Inbox::Options{});
  auto a = MustOpen<Consumer>(**q, *inbox, ChargeHandler(), Consumer::Options{});
  auto b = MustOpen<Consumer>(**q, *inbox, ChargeHandler(), Consumer::Options{});
  StopOnSignals(a.get());
  StopOnSignals(b.get());
  StopOnSignals(a.get());  // again: changes nothing
  StopOnSignals(nullptr);
  EXPECT_TRUE(PreviousHandlerInstalled(SIGTERM));
  ::raise(SIGINT);
  EXPECT_FALSE(a->stopping());
  EXPECT_FALSE(b->stopping());
  EXPECT_EQ(g_previous_handler_calls, 1);
  StopOnSignals(b.get());
  ::raise(SIGINT);
  EXPECT_FALSE(a->stopping());
  EXPECT_TRUE(b->stopping());
  EXPECT_EQ(g_previous_handler_calls, 1);
}

}  // namespace
}  // namespace idem::testing
