// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The PostgreSQL store behind a real transaction pooler: pgbouncer
// (pool_mode=transaction) in front of the test server, started by the CTest
// fixture "pgbouncer" (scripts/test-pgbouncer.sh). pgbouncer refuses a URL's
// options=-c search_path, so each test has a database of its own, and each
// conformance test a role whose search_path is its schema; always reached
// through the pooler, which idem finds out by itself (idem_pooler=auto).
// Every message is handled at least twice, from racing threads. The store
// and claims conformance suites run here too (Stores/*/postgres_pgbouncer).
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "idem/inbox.h"
#include "idem/kafka/offset_inbox.h"
#include "idem/kafka/source.h"
#include "idem/outbox.h"
#include "idem/outbox_relay.h"
#include "idem/postgres/store.h"
#include "postgres/pg_test_util.h"
#include "util/claims_conformance.h"
#include "util/outbox_conformance.h"
#include "util/store_conformance.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

// A fresh database, and its URL through the pooler.
std::string PooledDatabase() {
  static std::atomic<int> n{0};
  const std::string db = "pgb_" + std::to_string(::getpid()) + "_" + std::to_string(n++);
  const std::string admin = Pooler("postgres", "idem_test");
  EXPECT_EQ(PgAdmin("DROP DATABASE IF EXISTS " + db, admin), "");
  EXPECT_EQ(PgAdmin("CREATE DATABASE " + db, admin), "");
  return Pooler("postgres", db);
}

}  // namespace

// The stores under test: every case of StoreConformance, and (SQL stores)
// those of SqlStoreConformance.
const auto kPooledStores =
    ::testing::Values(StoreParam{"postgres_pgbouncer", [](const TempDir& d, Env* env) {
                                   return postgres::Store::Open({.url = PooledSchemaUrl(d.path()), .env = env});
                                 }});
INSTANTIATE_TEST_SUITE_P(Stores, StoreConformance, kPooledStores, StoreParamName);
INSTANTIATE_TEST_SUITE_P(Stores, SqlStoreConformance, kPooledStores, StoreParamName);

INSTANTIATE_TEST_SUITE_P(Stores, OutboxConformance,
                         ::testing::Values(StoreParam{"postgres_pgbouncer",
                                                      [](const TempDir& d, Env* env) {
                                                        return postgres::Store::Open(
                                                            {.url = PooledSchemaUrl(d.path()), .env = env});
                                                      }}),
                         StoreParamName);

INSTANTIATE_TEST_SUITE_P(Stores, ClaimsConformance,
                         ::testing::Values(ClaimsParam{"postgres_pgbouncer",
                                                       [](const TempDir& d, Env* env) {
                                                         return ClaimsOf(postgres::Store::Open(
                                                             {.url = PooledSchemaUrl(d.path()), .claim_clock = env}));
                                                       }}),
                         ClaimsParamName);

namespace {

// One value from a fresh libpq connection.
std::string One(PGconn* c, const char* sql) {
  PGresult* r = PQexec(c, sql);
  std::string v = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "error";
  if (v == "error") v += ": " + std::string(PQerrorMessage(c));
  PQclear(r);
  return v;
}

std::unique_ptr<Store> OpenPooled(const std::string& url) {
  auto s = postgres::Store::Open({.url = url, .pool_size = 4});
  EXPECT_OK(s);
  return s.ok() ? std::move(*s) : nullptr;
}

// Every path that runs through the pooler, then fresh clients of it: none
// of them sees anything idem set, prepared, listened to or locked.
TEST(Pgbouncer, EveryPathWorksThroughATransactionPoolerAndLeavesNoSessionState) {
  const std::string url = PooledDatabase();
  auto store = OpenPooled(url);
  ASSERT_NE(store, nullptr);
  ASSERT_OK(CreatePayments(*store));

  // The inbox: 40 messages, each handled twice at once by two threads and
  // once more after.
  auto inbox = MustOpen<Inbox>(*store, Inbox::Options{.consumer = "payments"});
  constexpr int kN = 40;
  std::atomic<int> not_acked{0};
  auto handle_all = [&] {
    for (int i = 0; i < kN; ++i)
      if (!inbox->Handle(Msg("p-" + std::to_string(i)), ChargeHandler()).ShouldAck()) not_acked++;
  };
  std::thread a(handle_all), b(handle_all);
  a.join();
  b.join();
  handle_all();
  EXPECT_EQ(not_acked, 0);
  EXPECT_EQ(Charges(*store), kN);
  for (int i = 0; i < kN; ++i) EXPECT_EQ(Charges(*store, "p-" + std::to_string(i)), 1);

  // Claims: a key claimed; a second claimer finds it in progress; completed;
  // then a replay.
  ClaimStore* claims = store->claim_store();
  ASSERT_NE(claims, nullptr);
  auto first = claims->TryClaim({.scope = "charges", .key = "k-1", .lease_ms = 30'000});
  ASSERT_OK(first);
  ASSERT_EQ(first->kind, ClaimOutcome::Kind::kStarted);
  auto busy = claims->TryClaim({.scope = "charges", .key = "k-1", .lease_ms = 30'000});
  ASSERT_OK(busy);
  EXPECT_EQ(busy->kind, ClaimOutcome::Kind::kInProgress);
  ASSERT_OK(claims->Complete(first->token, "charged", false, 60'000));
  auto replay = claims->TryClaim({.scope = "charges", .key = "k-1", .lease_ms = 30'000});
  ASSERT_OK(replay);
  EXPECT_EQ(replay->kind, ClaimOutcome::Kind::kCompleted);
  EXPECT_EQ(replay->result, "charged");
  // A bounded wait polls (no LISTEN through the pooler) and ends on time.
  auto watch = claims->WatchKey("charges", "k-2");
  ASSERT_NE(watch, nullptr);

  // Kafka's offset inbox: its lock bound is local to its transaction.
  auto oi = kafka::OffsetInbox::Open(*store, {.consumer = "ledger", .lock_wait_ms = 1'234});
  ASSERT_OK(oi);
  for (int round = 0; round < 2; ++round)
    for (int64_t offset = 0; offset < 5; ++offset) {
      Delivery d{.message = Msg("o-" + std::to_string(offset)),
                 .receipt = kafka::EncodeReceipt({"ledger", 0, offset, 1})};
      Outcome o = (*oi)->Handle(d, ChargeHandler());
      EXPECT_TRUE(o.ShouldAck()) << o.ToString();
      EXPECT_EQ(o.applied(), round == 0);
    }

  // The outbox and its relay through the pooler: lanes leased in a table,
  // each settle's synchronous_commit local to its transaction, waits polled.
  auto outbox = Outbox::Open(*store);
  ASSERT_OK(outbox);
  {
    auto tx = store->Begin();
    ASSERT_OK(tx);
    ASSERT_OK((*outbox)->Add(**tx, {.destination = "shipping", .key = "o-1", .payload = "paid"}).status());
    ASSERT_OK((*tx)->Commit());
  }
  RecordingPublisher sink;
  {
    auto relay = OutboxRelay::Open(*store, sink, {.stop_when_idle = true});
    ASSERT_OK(relay);
    ASSERT_OK((*relay)->Run());
  }
  ASSERT_EQ(sink.copies().size(), 1u);
  EXPECT_EQ(sink.copies()[0].payload, "paid");
  // Told rather than found out (?idem_pooler=transaction): the same, with a
  // relay kept waiting (it polls) while a row is added.
  {
    auto told = postgres::Store::Open({.url = url + "?idem_pooler=transaction", .pool_size = 2});
    ASSERT_OK(told);
    auto told_relay = OutboxRelay::Open(**told, sink, {.poll_ms = 100});
    ASSERT_OK(told_relay);
    std::thread run([&] { EXPECT_OK((*told_relay)->Run()); });
    auto tx = (*told)->Begin();
    ASSERT_OK(tx);
    auto told_outbox = Outbox::Open(**told);
    ASSERT_OK(told_outbox);
    ASSERT_OK((*told_outbox)->Add(**tx, {.destination = "shipping", .key = "o-2", .payload = "shipped"}).status());
    ASSERT_OK((*tx)->Commit());
    while (sink.copies().size() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    (*told_relay)->Stop();
    run.join();
    EXPECT_EQ(sink.copies()[1].payload, "shipped");
    EXPECT_NE((*told)->claim_store()->WatchKey("charges", "k-3"), nullptr);
  }

  // Purge through the pooler.
  EXPECT_OK(store->Purge("payments", 0, 100).status());

  // Fresh clients, one after another, each keeping its transaction open so
  // that the next one gets another of the pooler's server sessions for this
  // database (default_pool_size = 8): each sees the server's defaults.
  std::vector<PGconn*> clients;
  for (int i = 0; i < 8; ++i) {
    PGconn* c = PQconnectdb(url.c_str());
    ASSERT_EQ(PQstatus(c), CONNECTION_OK) << PQerrorMessage(c);
    clients.push_back(c);
    PQclear(PQexec(c, "BEGIN"));
    EXPECT_EQ(One(c, "SHOW synchronous_commit"), "on") << "client " << i;
    EXPECT_EQ(One(c, "SHOW lock_timeout"), "0") << "client " << i;
    EXPECT_EQ(One(c, "SHOW statement_timeout"), "0") << "client " << i;
    EXPECT_EQ(One(c, "SELECT count(*) FROM pg_listening_channels()"), "0") << "client " << i;
    EXPECT_EQ(One(c, "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'idem%'"), "0") << "client " << i;
    EXPECT_EQ(One(c, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"), "0")
        << "client " << i;
  }
  for (PGconn* c : clients) {
    PQclear(PQexec(c, "COMMIT"));
    PQfinish(c);
  }
}

// Relays of one database, one through the pooler and one direct to the
// server, share its lanes (leases in one table: neither kind can hold a lane
// the other holds), and every row goes out once, each key in order.
TEST(Pgbouncer, APooledRelayAndADirectOneShareTheLanes) {
  const std::string url = PooledDatabase();
  const std::string direct_url =
      "postgres://postgres@127.0.0.1:" + std::to_string(UrlPort(PgUrl())) + url.substr(url.rfind('/'));
  auto pooled = OpenPooled(url);
  ASSERT_NE(pooled, nullptr);
  auto direct = postgres::Store::Open({.url = direct_url, .pool_size = 2});
  ASSERT_OK(direct);
  auto outbox = Outbox::Open(*pooled);
  ASSERT_OK(outbox);
  std::map<std::string, std::vector<std::string>> added;
  for (int t = 0; t < 20; ++t) {
    std::vector<OutgoingMessage> batch;
    for (int i = 0; i < 10; ++i)
      batch.push_back({.destination = "d", .key = "key-" + std::to_string((t * 7 + i) % 30), .payload = "p"});
    auto tx = pooled->Begin();
    ASSERT_OK(tx);
    auto ids = (*outbox)->AddMany(**tx, batch);
    ASSERT_OK(ids);
    ASSERT_OK((*tx)->Commit());
    for (size_t i = 0; i < batch.size(); ++i) added[batch[i].key].push_back((*ids)[i]);
  }
  RecordingPublisher wire;
  const OutboxRelay::Options o{.batch = 16, .poll_ms = 20, .rebalance_ms = 20, .stop_when_idle = true};
  auto a = OutboxRelay::Open(*pooled, wire, o);
  auto b = OutboxRelay::Open(**direct, wire, o);
  ASSERT_OK(a);
  ASSERT_OK(b);
  std::thread ta([&] { EXPECT_OK((*a)->Run()); });
  std::thread tb([&] { EXPECT_OK((*b)->Run()); });
  ta.join();
  tb.join();
  std::map<std::string, std::vector<std::string>> sent;
  for (const auto& c : wire.copies()) sent[c.key].push_back(c.id);
  for (const auto& [key, ids] : added) EXPECT_EQ(sent[key], ids) << "key " << key;
  EXPECT_FALSE(wire.twice_at_once());
  EXPECT_EQ((*a)->stats().published + (*b)->stats().published, 200u);
}

// A server session that ends under a COMMIT sent through the pooler (an
// administrator's pg_terminate_backend, as a failover or a crash would end
// it; pgbouncer then drops the client's connection too): the outcome is in
// doubt, never a failure, and the store goes on with a new connection.
TEST(Pgbouncer, ASessionEndedUnderACommitIsInDoubtAndTheStoreGoesOn) {
  const std::string url = PooledDatabase();
  auto store = OpenPooled(url);
  ASSERT_NE(store, nullptr);
  ASSERT_OK(CreatePayments(*store));
  const std::string admin = Pooler("postgres", "idem_test");
  int in_doubt = 0;
  for (int round = 0; round < 3; ++round) {
    auto tx = store->Begin();
    ASSERT_OK(tx);
    ASSERT_OK(
        (*tx)->Exec("INSERT INTO payments(message_id, cents) VALUES ($1, 1)", {"d-" + std::to_string(round)}).status());
    auto pid = (*tx)->Query("SELECT pg_backend_pid()");
    ASSERT_OK(pid);
    // Ended from outside while the transaction is open: its COMMIT finds
    // the session gone.
    EXPECT_EQ(PgAdmin("SELECT pg_terminate_backend(" + std::to_string(pid->rows[0][0].AsInt()) + ")", admin), "");
    Status committed = (*tx)->Commit();
    EXPECT_FALSE(committed.ok());
    EXPECT_NE(committed.code(), Code::kHandlerFailed) << committed;
    if (committed.code() == Code::kInDoubt) ++in_doubt;
    EXPECT_TRUE(committed.code() == Code::kInDoubt) << committed;
    // The store goes on.
    auto next = store->Begin();
    ASSERT_OK(next);
    ASSERT_OK((*next)
                  ->Exec("INSERT INTO payments(message_id, cents) VALUES ($1, 1)", {"n-" + std::to_string(round)})
                  .status());
    ASSERT_OK((*next)->Commit());
  }
  EXPECT_EQ(in_doubt, 3);
  EXPECT_EQ(Charges(*store), 3);  // the n-* rows; no d-* row committed
}

// A startup setting the pooler refuses (a URL's options=-c ..., which
// pgbouncer does not pass on): kUnavailable naming the pooler's address, its
// reason and the fix.
TEST(Pgbouncer, AStartupSettingThePoolerRefusesIsNamedWithTheFix) {
  auto s = postgres::Store::Open({.url = Pooler("postgres", "idem_test") + "?options=-csearch_path%3Dx"});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kUnavailable) << s.status();
  EXPECT_NE(s.status().message().find("127.0.0.1:"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("unsupported startup parameter"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("ALTER ROLE"), std::string::npos) << s.status();
}

// Named statements behind a transaction pooler are refused loudly when the
// URL says there is none: never another client's statement run silently.
TEST(Pgbouncer, ANamedStatementOnAForeignSessionFailsNamingTheFix) {
  const std::string url = PooledDatabase();
  auto pooled = OpenPooled(url);
  ASSERT_NE(pooled, nullptr);
  ASSERT_OK(CreatePayments(*pooled));
  // Many stores that think they are direct, each preparing the same
  // statements on whichever server session the pooler hands it, until one
  // finds its statement's name taken (or missing) on a session.
  Status found;
  for (int round = 0; round < 20 && found.ok(); ++round) {
    std::vector<std::unique_ptr<Store>> direct;
    for (int i = 0; i < 6; ++i) {
      auto s = postgres::Store::Open({.url = url + "?idem_pooler=none", .pool_size = 1});
      if (!s.ok()) {
        found = s.status();
        break;
      }
      direct.push_back(std::move(*s));
    }
    for (auto& s : direct) {
      auto tx = s->Begin();
      if (!tx.ok()) {
        found = tx.status();
        break;
      }
      auto r = (*tx)->Query("SELECT count(*) FROM payments WHERE message_id = $1", {"x"});
      if (!r.ok()) {
        found = r.status();
        break;
      }
      (*tx)->Rollback();
    }
  }
  ASSERT_FALSE(found.ok()) << "no store ever met a session another had prepared on";
  EXPECT_EQ(found.code(), Code::kUnavailable) << found;
  EXPECT_NE(found.message().find("PostgreSQL at 127.0.0.1:"), std::string::npos) << found;
  EXPECT_NE(found.message().find("idem_pooler=transaction"), std::string::npos) << found;
}

}  // namespace
}  // namespace idem::testing
