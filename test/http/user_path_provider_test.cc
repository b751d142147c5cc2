// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The recommended path end to end, as a user's service runs it: a Consumer
// with the call-first handler (idem::CallFirst) on the embedded queue and
// SQLite, the charge through idem::http::Client with DownstreamKey, and the
// provider (idem provider's server) in a process of its own that is killed
// after charging and before storing its response. Every message is
// published twice.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "idem/call_first.h"
#include "idem/claims.h"
#include "idem/consumer.h"
#include "idem/embedded/queue.h"
#include "idem/env.h"
#include "idem/http/client.h"
#include "idem/inbox.h"
#include "idem/sqlite/store.h"
#include "idem/testing/kill_points.h"
#include "provider_server.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

constexpr char kBody[] = R"({"amount":4000,"currency":"usd","customer":"cus_1"})";

cli::ProviderServerOptions ProviderOptions(const TempDir& dir, int port, int64_t lease_ms) {
  return {.port = port,
          .store_url = "sqlite:" + dir.File("provider.db"),
          .api_keys = {{"sk_test", "acct_1"}},
          .lease_ms = lease_ms};
}

// Charges the provider holds for `key`, read from its own database.
int64_t ProviderCharges(const TempDir& dir, const std::string& key) {
  auto store = sqlite::Store::Open({.path = dir.File("provider.db")});
  EXPECT_OK(store);
  if (!store.ok()) return -1;
  auto tx = (*store)->Begin();
  EXPECT_TRUE(tx.ok());
  auto rows = (*tx)->Query("SELECT count(*) FROM provider_charges WHERE idem_key = $1", {key});
  EXPECT_OK(rows);
  return rows.ok() ? rows->rows[0][0].AsInt() : -1;
}

// The provider is SIGKILLed after charging, before its response is stored,
// and comes back with a lease (5 s) far longer than the consumer's whole
// retry budget (2 attempts, client retries of 20-100 ms): it answers 409 (in
// progress) until the dead request's lease ends, then the retry takes the
// key over and finds the charge. The order is applied once and charged once;
// nothing is dead-lettered. Before the fix the client's "gave up" was a
// handler failure, and after max_attempts the message was dead-lettered while
// the provider held the charge.
TEST(UserPath, ProviderKilledAfterChargingWithALongLeaseAppliesOnceAndChargesOnce) {
  TempDir dir;
  // The provider's first life, in a child that dies at the kill point.
  int ports[2];
  ASSERT_EQ(::pipe(ports), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ports[0]);
    auto p = cli::ProviderServer::Start(ProviderOptions(dir, 0, 5'000));
    if (!p.ok()) ::_exit(3);
    ArmKillPoint("http.before_complete");
    const int port = (*p)->port();
    if (::write(ports[1], &port, sizeof port) != sizeof port) ::_exit(4);
    for (;;) ::pause();
  }
  ::close(ports[1]);
  int port = 0;
  ASSERT_EQ(::read(ports[0], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  ::close(ports[0]);

  // When it has died, bring it back on the same port with the same long lease.
  std::unique_ptr<cli::ProviderServer> second;
  std::atomic<bool> restarted{false};
  std::thread restarter([&] {
    int status = 0;
    ::waitpid(child, &status, 0);
    for (int i = 0; i < 200 && second == nullptr; ++i) {
      auto p = cli::ProviderServer::Start(ProviderOptions(dir, port, 5'000));
      if (p.ok()) {
        second = std::move(*p);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    restarted = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && second != nullptr;
  });

  auto store = sqlite::Store::Open({.path = dir.File("payments.db")});
  ASSERT_OK(store);
  ASSERT_TRUE(CreatePayments(**store).ok());
  auto queue = embedded::Queue::Open({.path = dir.File("queue.db"), .queue = "payments"});
  ASSERT_OK(queue);
  for (int copy = 0; copy < 2; ++copy) ASSERT_TRUE((*queue)->Publish(Msg("order-1042", kBody)).ok());

  auto client = http::Client::Open({.base_url = "http://127.0.0.1:" + std::to_string(port),
                                    .bearer = "sk_test",
                                    .max_attempts = 3,
                                    .backoff_base_ms = 20,
                                    .backoff_max_ms = 100,
                                    .read_timeout_ms = 2'000});
  ASSERT_OK(client);
  Claims claims(*(*store)->claim_store());
  auto inbox_owned = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  CallFirst charge(
      claims,
      [&](Calls& calls, const Message& m) -> Status {
        return calls
            .Once("charge",
                  [&](const std::string& key) -> Result<std::string> {
                    IDEM_ASSIGN_OR_RETURN(http::Response r, (*client)->Post("/charges", m.payload, key));
                    if (r.status != 201 && r.status != 200)
                      return Status::HandlerFailed("provider answered " + std::to_string(r.status));
                    return r.body;
                  })
            .status();
      },
      [](Transaction& tx, const Message& m, const Calls&) -> Status {
        return tx.Exec("INSERT INTO payments(message_id, cents) VALUES ($1, 4000)", {m.id}).status();
      });
  auto consumer_owned = MustOpen<Consumer>(
      **queue, inbox, charge,
      Consumer::Options{.max_attempts = 2, .backoff_base_ms = 50, .backoff_max_ms = 200, .stop_when_idle = true});
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  restarter.join();
  ASSERT_TRUE(restarted.load()) << "the provider died at its kill point and came back";

  EXPECT_EQ(Charges(**store, "order-1042"), 1);
  EXPECT_EQ(ProviderCharges(dir, DownstreamKey(Msg("order-1042"), "charge")), 1);
  auto letters = (*store)->ListDeadLetters("", 10);
  ASSERT_TRUE(letters.ok());
  EXPECT_TRUE(letters->empty()) << letters->front().reason << ": " << letters->front().error;
  EXPECT_GT(consumer.stats().in_progress, 0u) << "the provider's 409s were in progress, not failures";
  EXPECT_EQ(inbox.counters().applied, 1u);
  second.reset();
}

}  // namespace
}  // namespace idem::testing
