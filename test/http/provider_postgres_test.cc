// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The provider's cases (provider_cases.cc) on PostgreSQL: a fresh schema of
// the throwaway server (CTest fixture "postgres") per test.
#include <libpq-fe.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "http/provider_cases.h"
#include "idem/env.h"
#include "idem/testing/fake_env.h"
#include "idem/testing/kill_points.h"
#include "postgres/pg_test_util.h"

namespace idem::testing {
namespace {

std::string Url(const TempDir&) { return FreshSchemaUrl(); }

INSTANTIATE_TEST_SUITE_P(Postgres, ProviderTest,
                         ::testing::Values(ProviderParam{"Postgres", Url},
                                           ProviderParam{"PostgresOneTransaction", Url, ProviderMode::kOneTransaction},
                                           ProviderParam{"PostgresGroupCommit", Url, ProviderMode::kGroupCommit},
                                           ProviderParam{"PostgresGroupCommitOnFibers", Url,
                                                         ProviderMode::kGroupCommitOnFibers}),
                         ProviderParamName);

// The round trips of a first execution and of a replay on a fresh provider
// (mode: two-phase, or --one-transaction). Every key is sent twice.
void ExpectRoundTrips(bool one_transaction, int first_trips, int replay_trips) {
  FakeEnv env;  // the per-principal key count is read once and then kept
  cli::ProviderServerOptions o;
  o.store_url = FreshSchemaUrl();
  o.api_keys = {{"sk_a", "acct_a"}};
  o.one_transaction = one_transaction;
  o.idempotency.env = &env;
  auto started = cli::ProviderServer::Start(std::move(o));
  ASSERT_TRUE(started.ok()) << started.status();
  cli::ProviderServer& provider = **started;
  const std::string body = R"({"amount":4000,"currency":"usd","customer":"cus_1"})";
  auto post = [&](const std::string& key) {
    return Send(provider.port(), "POST", "/charges", Headers("sk_a", Quoted(key)), body);
  };
  ASSERT_EQ(post("warm-up").status, 201);  // connections, prepared statements, the key count
  int next = 0;
  std::vector<std::string> keys;
  const int first = RoundTrips([&] {
    keys.push_back("rt-" + std::to_string(next++));
    EXPECT_EQ(post(keys.back()).status, 201);
  });
  EXPECT_EQ(first, first_trips);
  const int replay = RoundTrips([&] { EXPECT_TRUE(post(keys.front()).replayed()); });
  EXPECT_EQ(replay, replay_trips);
  for (const std::string& k : keys) EXPECT_TRUE(post(k).replayed()) << k;
  provider.Stop();
}

// A first execution in the two-phase mode makes four round trips: the claim
// (its insert, which reads the key's row instead when it is there), the
// charge's BEGIN with its INSERT, its COMMIT, the completion. (A read before
// the insert would make it five, BEGIN on its own six.) A replay makes one.
TEST(ProviderOnPostgres, ATwoPhaseFirstExecutionMakesFourRoundTripsAndAReplayOne) { ExpectRoundTrips(false, 4, 1); }

// With --one-transaction a first execution makes four round trips: the read
// of the key (a replay ends there, in one), BEGIN with the claim, the charge
// (Transaction::InsertLater: held back) with the stored response, COMMIT.
TEST(ProviderOnPostgres, AOneTransactionFirstExecutionMakesFourRoundTripsAndAReplayOne) {
  ExpectRoundTrips(true, 4, 1);
}

// A group held before its COMMIT (a stall, SIGSTOP) past the claims' 1 ms
// lease while the client retries. Nothing is committed, so there is no
// lease to take over: the retry waits for the next group (groups commit one
// at a time), whose claim would meet the held group's uncommitted row on the
// key and wait for it (or be answered 503, and retried). Once the group commits, the first answers 201 and the retry
// replays it: one charge.
TEST(ProviderOnPostgres, AGroupHeldBeforeItsCommitPastTheLeaseMakesOneChargeAndTheRetryReplaysIt) {
  cli::ProviderServerOptions o;
  o.store_url = FreshSchemaUrl();
  o.api_keys = {{"sk_a", "acct_a"}};
  o.threads = 16;
  o.one_transaction = true;
  o.idempotency.group_commit_max = 64;
  o.lease_ms = 1;
  auto started = cli::ProviderServer::Start(std::move(o));
  ASSERT_TRUE(started.ok()) << started.status();
  cli::ProviderServer& provider = **started;
  const std::string body = R"({"amount":4000,"currency":"usd","customer":"cus_1"})";
  auto post = [&] { return Send(provider.port(), "POST", "/charges", Headers("sk_a", Quoted("held-1")), body); };
  std::mutex mu;
  std::condition_variable cv;
  bool held = false, go = false;
  ArmKillPoint("http.group_before_commit", 1, [&] {
    std::unique_lock lock(mu);
    held = true;
    cv.notify_all();
    cv.wait_for(lock, std::chrono::seconds(60), [&] { return go; });
  });
  Reply first;
  std::thread t1([&] { first = post(); });
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return held; }));
  }
  // Let the 1 ms lease run out on any clock (a precondition, not a timing
  // assertion).
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::atomic<bool> first_done{false}, retry_answered{false};
  Reply retry;
  std::thread t2([&] {
    for (int i = 0; i < 1000; ++i) {
      retry = post();
      retry_answered = true;
      if (retry.status != 503 || first_done) break;
    }
  });
  // Until the retry waits: parked for the next group (one group commits at
  // a time, so it queues behind the held one), on the group's row for the
  // key, or answered while it did.
  bool waited = false;
  for (int i = 0; i < 1000 && !waited && !retry_answered; ++i) {
    waited = provider.counters().group_queue > 0;
    if (!waited) {
      PGconn* c = PQconnectdb(PgUrl().c_str());
      PGresult* r = PQexec(c, "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'");
      waited = PQntuples(r) > 0;
      PQclear(r);
      PQfinish(c);
    }
    if (!waited) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(waited || retry_answered);
  {
    std::lock_guard lock(mu);
    go = true;
  }
  cv.notify_all();
  t1.join();
  first_done = true;
  t2.join();
  DisarmKillPoints();
  ASSERT_TRUE(first.ok && retry.ok) << first.error << retry.error;
  EXPECT_EQ(first.status, 201) << first.body;
  EXPECT_FALSE(first.replayed());
  if (retry.status == 503) retry = post();  // its last try may have come before the commit
  EXPECT_EQ(retry.status, 201) << retry.body;
  EXPECT_TRUE(retry.replayed());
  ExpectSameResponse(first, retry);
  Reply list = Send(provider.port(), "GET", "/charges", Headers("sk_a", std::nullopt));
  ASSERT_EQ(list.status, 200) << list.body;
  EXPECT_EQ(list.json()["data"].size(), 1u);
  EXPECT_EQ(provider.counters().executed, 1u);
  provider.Stop();
}

}  // namespace
}  // namespace idem::testing
