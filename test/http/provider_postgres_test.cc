// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The provider's cases (provider_cases.cc) on PostgreSQL: a fresh schema of
// the throwaway server (CTest fixture "postgres") per test.
#include "http/provider_cases.h"
#include "idem/env.h"
#include "idem/testing/fake_env.h"
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

}  // namespace
}  // namespace idem::testing
