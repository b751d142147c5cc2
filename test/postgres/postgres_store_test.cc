// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The PostgreSQL store on a real server (127.0.0.1, started by the CTest
// fixture): the conformance suite, plus what only a server has: races
// between connections in both orders, a connection lost at COMMIT, a backend
// killed mid-batch, bad connection strings, concurrent purges.
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "idem/claims.h"
#include "idem/inbox.h"
#include "idem/open.h"
#include "idem/outbox.h"
#include "idem/outbox_relay.h"
#include "idem/outbox_store.h"
#include "idem/postgres/store.h"
#include "idem/testing/fake_env.h"
#include "idem/testing/kill_points.h"
#include "idem/url.h"
#include "postgres/pg.h"
#include "postgres/pg_test_util.h"
#include "util/claims_conformance.h"
#include "util/outbox_conformance.h"
#include "util/store_conformance.h"
#include "util/test_util.h"

namespace idem::testing {

// The stores under test: every case of StoreConformance, and (SQL stores)
// those of SqlStoreConformance.
const auto kPostgresStores = ::testing::Values(
    StoreParam{"postgres", [](const TempDir& d,
                              Env* env) { return postgres::Store::Open({.url = SchemaUrl(d.path()), .env = env}); }},
    StoreParam{"postgres_daily_partitions", [](const TempDir& d, Env* env) {
                 return postgres::Store::Open({.url = SchemaUrl(d.path()), .partition_by_day = true, .env = env});
               }});
INSTANTIATE_TEST_SUITE_P(Stores, StoreConformance, kPostgresStores, StoreParamName);
INSTANTIATE_TEST_SUITE_P(Stores, SqlStoreConformance, kPostgresStores, StoreParamName);

INSTANTIATE_TEST_SUITE_P(Stores, OutboxConformance,
                         ::testing::Values(StoreParam{"postgres",
                                                      [](const TempDir& d, Env* env) {
                                                        return postgres::Store::Open(
                                                            {.url = SchemaUrl(d.path()), .env = env});
                                                      }}),
                         StoreParamName);

INSTANTIATE_TEST_SUITE_P(Stores, ClaimsConformance,
                         ::testing::Values(ClaimsParam{"postgres",
                                                       [](const TempDir& d, Env* env) {
                                                         return ClaimsOf(postgres::Store::Open(
                                                             {.url = SchemaUrl(d.path()), .claim_clock = env}));
                                                       }}),
                         ClaimsParamName);

namespace {

TEST(PostgresErrors, SqlStateTranslationTable) {
  using pg_internal::CodeForSqlState;
  struct Row {
    const char* state;
    Code code;
  } rows[] = {
      {"23505", Code::kDuplicate},
      {"23502", Code::kInvalidArgument},
      {"40001", Code::kRetryable},
      {"40P01", Code::kRetryable},
      {"08006", Code::kUnavailable},
      {"08001", Code::kUnavailable},
      {"57P01", Code::kUnavailable},
      {"57P03", Code::kUnavailable},
      {"53300", Code::kUnavailable},
      {"53200", Code::kRetryable},
      {"55P03", Code::kBusy},
      {"57014", Code::kAborted},
      {"25P02", Code::kAborted},
      {"42P01", Code::kInvalidArgument},
      {"42601", Code::kInvalidArgument},
      {"22P02", Code::kInvalidArgument},
      {"28P01", Code::kUnavailable},
      {"3D000", Code::kUnavailable},
      {"XX001", Code::kCorruption},
      {"58030", Code::kIoError},
      {"XX000", Code::kInternal},
      {"", Code::kUnavailable},
  };
  for (const Row& r : rows) EXPECT_EQ(CodeForSqlState(r.state), r.code) << r.state;
}

class Postgres : public ::testing::Test {
 protected:
  virtual bool daily() const { return false; }
  void SetUp() override {
    url_ = FreshSchemaUrl();
    auto s = postgres::Store::Open({.url = url_, .partition_by_day = daily()});
    ASSERT_OK(s);
    store_ = std::move(*s);
    ASSERT_TRUE(CreatePayments(*store_).ok());
  }
  static int BackendPid(Transaction& tx) {
    auto r = tx.Query("SELECT pg_backend_pid()");
    return r.ok() ? static_cast<int>(r->rows[0][0].AsInt()) : -1;
  }
  // Terminates a backend and waits (bounded) until it is gone.
  static void Terminate(int pid) {
    EXPECT_EQ(PgAdmin("SELECT pg_terminate_backend(" + std::to_string(pid) + ")"), "");
    for (int i = 0; i < 500; ++i) {
      PGconn* c = PQconnectdb(PgUrl().c_str());
      PGresult* r = PQexec(c, ("SELECT 1 FROM pg_stat_activity WHERE pid = " + std::to_string(pid)).c_str());
      bool gone = PQntuples(r) == 0;
      PQclear(r);
      PQfinish(c);
      if (gone) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "backend " << pid << " still alive";
  }
  void RaceBothOrders();
  void PauseARelayWhileItsBackendEnds(const char* point);
  // Waits (bounded) until some backend of this test waits on a lock.
  static bool SomeoneWaitsOnALock() {
    for (int i = 0; i < 1000; ++i) {
      PGconn* c = PQconnectdb(PgUrl().c_str());
      PGresult* r = PQexec(c,
                           "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                           " AND (query LIKE '%idem_markers%' OR query LIKE '%pg_advisory_xact_lock%')");
      bool waiting = PQntuples(r) > 0;
      PQclear(r);
      PQfinish(c);
      if (waiting) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  std::string url_;
  std::unique_ptr<Store> store_;
};

// The same with markers partitioned by day.
class PostgresDaily : public Postgres {
 protected:
  bool daily() const override { return true; }
};

// Two consumers race on one message. The second insert waits for the first
// transaction; then it sees a duplicate (first committed) or applies the
// work itself (first rolled back). Both orders, driven explicitly, on both
// layouts (the unique key arbitrates in one, the per-key advisory lock in the other).
TEST_F(Postgres, RaceSecondWaitsThenSeesDuplicateOrApplies) { RaceBothOrders(); }
TEST_F(PostgresDaily, RaceSecondWaitsThenSeesDuplicateOrApplies) { RaceBothOrders(); }

void Postgres::RaceBothOrders() {
  for (bool first_commits : {true, false}) {
    SCOPED_TRACE(first_commits ? "first commits" : "first rolls back");
    auto inbox_owned =
        MustOpen<Inbox>(*store_, Inbox::Options{.consumer = first_commits ? "commit-order" : "rollback-order"});
    Inbox& inbox = *inbox_owned;
    std::mutex mu;
    std::condition_variable cv;
    bool release = false, in_handler = false;
    Outcome a, b;
    std::thread ta([&] {
      a = inbox.Handle(Msg("race"), [&](Transaction& tx, const Message& m) -> Status {
        IDEM_RETURN_IF_ERROR(ChargeHandler()(tx, m));
        std::unique_lock<std::mutex> l(mu);
        in_handler = true;
        cv.notify_all();
        cv.wait(l, [&] { return release; });
        return first_commits ? Status::OK() : Status::Unavailable("first consumer fails");
      });
    });
    {
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return in_handler; });
    }
    std::thread tb([&] { b = inbox.Handle(Msg("race"), ChargeHandler()); });
    EXPECT_TRUE(SomeoneWaitsOnALock());  // B's marker insert is blocked by A's
    {
      std::lock_guard<std::mutex> l(mu);
      release = true;
    }
    cv.notify_all();
    ta.join();
    tb.join();
    if (first_commits) {
      EXPECT_EQ(a.kind, Outcome::Kind::kApplied) << a.ToString();
      EXPECT_EQ(b.kind, Outcome::Kind::kDuplicate) << b.ToString();
    } else {
      EXPECT_EQ(a.kind, Outcome::Kind::kFailed) << a.ToString();
      EXPECT_EQ(b.kind, Outcome::Kind::kApplied) << b.ToString();
    }
  }
  EXPECT_EQ(Charges(*store_, "race"), 2);  // one per consumer name
}

// The backend dies after the handler's writes, before COMMIT: the outcome is
// in doubt, the marker is read back (absent), nothing is acknowledged, and
// the redelivery applies the work once.
TEST_F(Postgres, BackendTerminatedAtCommitIsResolvedByReadingTheMarker) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  int pid = -1;
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    pid = BackendPid(tx);
    return ChargeHandler()(tx, m);
  };
  ArmKillPoint("inbox.after_work", 1, [&] { Terminate(pid); });
  Outcome o = inbox.Handle(Msg("m-7f3"), h);
  DisarmKillPoints();
  EXPECT_EQ(o.kind, Outcome::Kind::kFailed) << o.ToString();
  EXPECT_TRUE(o.status.code() == Code::kInDoubt || o.status.code() == Code::kUnavailable) << o.status;
  EXPECT_FALSE(o.ShouldAck());
  auto marker = store_->FindMarker("payments", "m-7f3");
  ASSERT_OK(marker);
  EXPECT_FALSE(marker->has_value());
  EXPECT_EQ(inbox.Handle(Msg("m-7f3"), h).kind, Outcome::Kind::kApplied);
  EXPECT_EQ(inbox.Handle(Msg("m-7f3"), h).kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(Charges(*store_), 1);
}

// The connection is cut after COMMIT was sent: the server commits but the
// client never hears it. Whatever the client concludes, it acknowledges only
// if the marker is committed, and the redelivery never applies twice.
TEST_F(Postgres, ConnectionCutAfterCommitSentNeverAcksWithoutTheMarker) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  for (int i = 0; i < 5; ++i) {
    std::string id = "cut-" + std::to_string(i);
    PGconn* conn = nullptr;
    Handler h = [&](Transaction& tx, const Message& m) -> Status {
      conn = static_cast<PGconn*>(tx.NativeHandle());
      return ChargeHandler()(tx, m);
    };
    ArmKillPoint("postgres.commit_sent", 1, [&] { ::shutdown(PQsocket(conn), SHUT_RDWR); });
    Outcome o = inbox.Handle(Msg(id), h);
    DisarmKillPoints();
    auto marker = store_->FindMarker("payments", id);
    ASSERT_TRUE(marker.ok());
    std::cerr << "cut after COMMIT sent: " << o.ToString() << ", marker "
              << (marker->has_value() ? "present" : "absent") << "\n";
    if (o.ShouldAck()) {
      EXPECT_TRUE(marker->has_value()) << o.ToString();
    } else {
      EXPECT_TRUE(o.status.code() == Code::kInDoubt || o.status.code() == Code::kUnavailable) << o.status;
    }
    // Redelivered until acknowledged: exactly one effect.
    for (int d = 0; d < 2; ++d) inbox.Handle(Msg(id), ChargeHandler());
    EXPECT_EQ(Charges(*store_, id), 1);
  }
}

// BEGIN goes with the marker in one flight (libpq pipeline mode): a guarded
// transaction makes as many round trips as the same work in a transaction
// of its own (BEGIN, INSERT, COMMIT), for one message and for a batch.
TEST_F(Postgres, TheMarkerTravelsWithBeginSoTheGuardAddsNoRoundTrip) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  int next = 0, next_bare = 0;
  auto fresh = [&] { return Msg("rt-" + std::to_string(next++)); };
  auto bare = [&](int n) {
    auto tx = store_->Begin();
    ASSERT_OK(tx);
    for (int i = 0; i < n; ++i) ASSERT_TRUE(ChargeHandler()(**tx, Msg("bare-" + std::to_string(next_bare++))).ok());
    ASSERT_OK((*tx)->Commit());
  };
  auto guarded = [&](int n) {
    std::vector<Message> batch;
    for (int i = 0; i < n; ++i) batch.push_back(fresh());
    for (const Outcome& o : inbox.HandleBatch(batch, ChargeHandler()))
      ASSERT_EQ(o.kind, Outcome::Kind::kApplied) << o.ToString();
  };
  for (int n : {1, 10}) {
    bare(n);  // statements are prepared once per connection: warm both up
    guarded(n);
    const int bare_trips = RoundTrips([&] { bare(n); });
    const int guarded_trips = RoundTrips([&] { guarded(n); });
    EXPECT_EQ(bare_trips, n + 2) << n;  // BEGIN, the inserts, COMMIT
    EXPECT_EQ(guarded_trips, bare_trips) << n;
  }
  // Every guarded message delivered again: a duplicate, one charge each.
  for (int i = 0; i < next; ++i) {
    const std::string id = "rt-" + std::to_string(i);
    EXPECT_EQ(inbox.Handle(Msg(id), ChargeHandler()).kind, Outcome::Kind::kDuplicate) << id;
    EXPECT_EQ(Charges(*store_, id), 1) << id;
  }
}

// A held-back BEGIN that is never followed by a statement sends nothing, and
// the connection goes back to the pool clean.
TEST_F(Postgres, ATransactionWithNothingInItSendsNothing) {
  const int trips = RoundTrips([&] {
    auto tx = store_->BeginDeferred();
    ASSERT_OK(tx);
    ASSERT_OK((*tx)->Commit());
    auto tx2 = store_->BeginDeferred();
    ASSERT_OK(tx2);
    (*tx2)->Rollback();
  });
  EXPECT_EQ(trips, 0);
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  for (int d = 0; d < 2; ++d) inbox.Handle(Msg("after-empty"), ChargeHandler());
  EXPECT_EQ(Charges(*store_, "after-empty"), 1);
}

// A statement that fails in the flight that carries the held-back BEGIN is a
// clear error naming the problem, and the connection comes out of pipeline
// mode usable: the next transactions on the pool work.
TEST_F(Postgres, AFailingFirstStatementIsAClearErrorAndTheConnectionStaysUsable) {
  for (int i = 0; i < 3; ++i) {
    auto tx = store_->BeginDeferred();
    ASSERT_OK(tx);
    auto r = (*tx)->Exec("INSERT INTO no_such_table(x) VALUES ($1)", {int64_t{1}});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("no_such_table"), std::string::npos) << r.status();
    (*tx)->Rollback();
  }
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  for (int d = 0; d < 2; ++d) inbox.Handle(Msg("after-error"), ChargeHandler());
  EXPECT_EQ(Charges(*store_, "after-error"), 1);
}

// A handler that takes the native handle of a transaction whose BEGIN is held
// back gets it with the transaction begun: what it runs there rolls back with it.
TEST_F(Postgres, TheNativeHandleOfADeferredTransactionIsInsideIt) {
  for (bool commit : {false, true}) {
    auto tx = store_->BeginDeferred();
    ASSERT_OK(tx);
    auto* conn = static_cast<PGconn*>((*tx)->NativeHandle());
    ASSERT_NE(conn, nullptr);
    EXPECT_EQ(PQtransactionStatus(conn), PQTRANS_INTRANS);
    PGresult* r = PQexec(conn, "INSERT INTO payments(message_id, cents) VALUES ('native', 1)");
    EXPECT_EQ(PQresultStatus(r), PGRES_COMMAND_OK) << PQresultErrorMessage(r);
    PQclear(r);
    if (commit) {
      ASSERT_OK((*tx)->Commit());
    } else {
      (*tx)->Rollback();
    }
    EXPECT_EQ(Charges(*store_, "native"), commit ? 1 : 0);
  }
}

// The backend dies in the middle of a batch: nothing of it is committed or
// acknowledged, and the redelivered batch applies every message once.
TEST_F(Postgres, DroppedConnectionMidBatchLosesNothing) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  std::vector<Message> batch;
  for (int i = 0; i < 10; ++i) batch.push_back(Msg("b-" + std::to_string(i)));
  int pid = -1;
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    if (pid < 0) pid = BackendPid(tx);
    return ChargeHandler()(tx, m);
  };
  ArmKillPoint("inbox.batch_mid", 1, [&] { Terminate(pid); });
  std::vector<Outcome> out = inbox.HandleBatch(batch, h);
  DisarmKillPoints();
  for (const Outcome& o : out) {
    EXPECT_FALSE(o.ShouldAck()) << o.ToString();
    EXPECT_TRUE(o.status.code() == Code::kUnavailable || o.status.code() == Code::kInDoubt ||
                o.status.code() == Code::kHandlerFailed)
        << o.status;
  }
  EXPECT_EQ(Charges(*store_), 0);
  for (int round = 0; round < 2; ++round)
    for (const Outcome& o : inbox.HandleBatch(batch, ChargeHandler()))
      EXPECT_EQ(o.kind, round == 0 ? Outcome::Kind::kApplied : Outcome::Kind::kDuplicate) << o.ToString();
  EXPECT_EQ(Charges(*store_), 10);
}

// A pooled connection whose backend went away (a server restart, as the
// client sees it) is replaced on the next transaction: the consumer recovers
// by itself.
TEST_F(Postgres, RecoversWhenPooledConnectionsDie) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  int pid = -1;
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    pid = BackendPid(tx);
    return ChargeHandler()(tx, m);
  };
  ASSERT_EQ(inbox.Handle(Msg("r-1"), h).kind, Outcome::Kind::kApplied);
  Terminate(pid);
  EXPECT_EQ(inbox.Handle(Msg("r-2"), h).kind, Outcome::Kind::kApplied);
  EXPECT_EQ(inbox.Handle(Msg("r-1"), h).kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(inbox.Handle(Msg("r-2"), h).kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(Charges(*store_), 2);
}

// A pooled connection cut after its last answer (so it still looks healthy)
// fails the next read on it: the read runs again on a new connection. (The
// in-doubt resolution reads the marker this way.)
// The HTTP middleware's group commit claims and completes many keys in one
// transaction: on PostgreSQL the claims go in one round trip, and the
// completions in one more, whatever their number.
TEST_F(Postgres, ManyClaimsAndTheirCompletionsTakeOneRoundTripEach) {
  int next = 0;
  std::vector<ClaimRequest> all;
  auto group = [&](int n) {
    auto tx = store_->Begin();
    ASSERT_OK(tx);
    std::vector<ClaimRequest> reqs;
    for (int i = 0; i < n; ++i)
      reqs.push_back(ClaimRequest{.scope = "charges",
                                  .key = "rt-" + std::to_string(next++),
                                  .fingerprint = FingerprintOf("body"),
                                  .lease_ms = 30'000});
    auto got = (*tx)->ClaimManyInTransaction(reqs);
    std::vector<ClaimToken> tokens;
    for (auto& g : got) {
      ASSERT_OK(g);
      ASSERT_EQ(g->kind, ClaimOutcome::Kind::kStarted);
      tokens.push_back(g->token);
    }
    std::vector<std::string> results;
    for (const ClaimToken& t : tokens) results.push_back("charged " + t.key);
    std::vector<Completion> done;
    for (size_t i = 0; i < tokens.size(); ++i) done.push_back(Completion{&tokens[i], results[i]});
    for (const Status& st : (*tx)->CompleteManyInTransaction(done, 60'000)) ASSERT_TRUE(st.ok()) << st;
    ASSERT_OK((*tx)->Commit());
    all.insert(all.end(), reqs.begin(), reqs.end());
  };
  for (int n : {1, 2, 16}) EXPECT_EQ(RoundTrips([&] { group(n); }), 4) << n;  // BEGIN, claims, completions, COMMIT
  // Each key claimed again: the stored result, once.
  Claims claims(*store_->claim_store());
  for (const ClaimRequest& r : all) {
    auto again = claims.Claim(r);
    ASSERT_OK(again);
    EXPECT_EQ(again->kind, ClaimOutcome::Kind::kCompleted) << r.key;
    EXPECT_EQ(again->result, "charged " + r.key);  // each key its own result
  }
}

// Claims `keys` (scope "group") from a thread each so that they go in one
// flight, on a store whose pool keeps two connections: two flights (keys
// "alone-1", "alone-2") stop before they are sent
// while the callers of `keys` queue, then everything goes. got[0] and got[1]
// are the lone ones, got[2 + i] keys[i]'s. `meanwhile(done)` runs once they
// go, before the threads are joined; done(i) waits (bounded) for got[i].
// False when the store never queued them (then nothing is left waiting).
bool ClaimTogether(Claims& claims, const std::vector<std::string>& keys, std::vector<Result<ClaimOutcome>>& got,
                   const std::function<void(const std::function<bool(size_t)>&)>& meanwhile = {}) {
  std::mutex mu;
  std::condition_variable cv;
  int stopped = 0;
  size_t queued = 0;
  bool go = false;
  std::vector<bool> finished(keys.size() + 2, false);
  got.assign(keys.size() + 2, Status::Internal("not run"));
  std::vector<std::thread> threads;
  auto claim = [&](size_t i, const std::string& key) {
    threads.emplace_back([&, i, key] {
      Result<ClaimOutcome> c = claims.Claim(GroupRequest(key));
      std::lock_guard l(mu);
      got[i] = std::move(c);
      finished[i] = true;
      cv.notify_all();
    });
  };
  auto stop = [&] {
    std::unique_lock l(mu);
    ++stopped;
    cv.notify_all();
    cv.wait(l, [&] { return go; });
  };
  // Until `reached` (bounded: a store that never queues fails the test
  // instead of hanging it; then everything stopped goes on).
  auto wait_for = [&](const std::function<bool()>& reached) {
    std::unique_lock l(mu);
    if (cv.wait_for(l, std::chrono::seconds(60), reached)) return true;
    go = true;
    cv.notify_all();
    return false;
  };
  // The first flight stops at its first round trip and arms the second's
  // stop; the second arms the count of the callers that wait.
  ArmKillPoint("postgres.round_trip", 1, [&] {
    ArmKillPoint("postgres.round_trip", 1, [&] {
      ArmKillPoint("postgres.claim_queued", static_cast<int>(keys.size()), [&] {
        std::lock_guard l(mu);
        queued = keys.size();
        cv.notify_all();
      });
      stop();
    });
    stop();
  });
  claim(0, "alone-1");
  bool reached = wait_for([&] { return stopped == 1; });
  if (reached) claim(1, "alone-2");
  reached = reached && wait_for([&] { return stopped == 2; });
  for (size_t i = 0; reached && i < keys.size(); ++i) claim(i + 2, keys[i]);
  reached = reached && wait_for([&] { return queued == keys.size(); });
  {
    std::lock_guard l(mu);
    go = true;
  }
  cv.notify_all();
  if (reached && meanwhile) meanwhile([&](size_t i) { return wait_for([&] { return finished[i]; }); });
  for (auto& t : threads) t.join();
  DisarmKillPoints();
  return reached;
}

// Claims outside a transaction from more threads at once than the pool
// keeps connections share commits: while two flights are out on a pool of
// two (both stopped before they are sent), the claims that come meanwhile
// wait, then go together in one flight, one transaction (their rows carry
// one xmin). Each still gets its own answer and fence, a
// key claimed twice in the group is in progress for the second caller, and
// every completion and replay is as it would be alone.
TEST_F(Postgres, ConcurrentClaimsOutsideATransactionShareOneCommit) {
  auto store = postgres::Store::Open({.url = url_, .pool_size = 2});
  ASSERT_OK(store);
  Claims claims(*(*store)->claim_store());
  std::vector<Result<ClaimOutcome>> got;
  ASSERT_TRUE(ClaimTogether(claims, {"g-2", "g-3", "g-4", "g-5", "g-6", "g-7", "g-8", "g-2"}, got))
      << "the callers never waited for a flight";
  {
    auto tx = store_->Begin();
    ASSERT_OK(tx);
    auto xmins = (*tx)->Query(
        "SELECT count(*), count(DISTINCT xmin::text) FROM idem_claims WHERE scope = 'group' AND key <> ALL("
        "ARRAY[convert_to('alone-1', 'UTF8'), convert_to('alone-2', 'UTF8')])");
    ASSERT_OK(xmins);
    EXPECT_EQ(xmins->rows[0][0].AsInt(), 7);  // g-2 .. g-8
    EXPECT_EQ(xmins->rows[0][1].AsInt(), 1);  // in one transaction
  }
  ExpectAnsweredAsAlone(claims, got, 9, {"alone-1", "alone-2", "g-2", "g-3", "g-8"});
}

// A group does not wait long for a row another transaction holds: a key
// claimed in a caller's open transaction, whose thread now waits for the
// answer of another key that went in the same group, would otherwise wait
// forever (the server sees no deadlock: the cycle runs through the client).
// The group gives up; each claim goes alone; the free key is answered while
// the transaction is still open, the held one once it commits.
TEST_F(Postgres, AGroupWaitingForARowAnOpenTransactionHoldsGoesAlone) {
  auto store = postgres::Store::Open({.url = url_, .pool_size = 2});
  ASSERT_OK(store);
  Claims claims(*(*store)->claim_store());
  auto tx = store_->Begin();
  ASSERT_OK(tx);
  auto held = (*tx)->ClaimInTransaction(GroupRequest("held"));
  ASSERT_OK(held);
  ASSERT_EQ(held->kind, ClaimOutcome::Kind::kStarted);
  std::vector<Result<ClaimOutcome>> got;
  bool free_answered = false;
  ASSERT_TRUE(ClaimTogether(claims, {"held", "free"}, got, [&](const std::function<bool(size_t)>& done) {
    free_answered = done(3);  // while the transaction is open
    EXPECT_OK((*tx)->Commit());
  })) << "the callers never waited for a flight";
  EXPECT_TRUE(free_answered);
  ASSERT_OK(got[3]);
  EXPECT_EQ(got[3]->kind, ClaimOutcome::Kind::kStarted);
  ASSERT_OK(got[2]);
  EXPECT_EQ(got[2]->kind, ClaimOutcome::Kind::kInProgress);  // the transaction's claim, committed
}

// A group commits at its flight's end; a commit that fails there (here a
// deferred constraint trigger refuses one key at commit) committed none of
// its statements. No caller is told it holds a key that was never written:
// the refused key is an error, the other is an error too (to retry: the
// flight's connection is given up, as one lost) or claimed with its record
// there; claimed again, it starts.
TEST_F(Postgres, AGroupWhoseCommitFailsTellsNoCallerItHoldsAKeyNeverWritten) {
  ASSERT_EQ(PgAdmin("CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                    " IF NEW.key = convert_to('poison', 'UTF8') THEN RAISE EXCEPTION 'poison refused at commit';"
                    " END IF; RETURN NULL; END $$;"
                    "CREATE CONSTRAINT TRIGGER refuse_poison AFTER INSERT ON idem_claims DEFERRABLE INITIALLY"
                    " DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_poison()",
                    url_),
            "");
  auto store = postgres::Store::Open({.url = url_, .pool_size = 2});
  ASSERT_OK(store);
  ClaimStore& claim_store = *(*store)->claim_store();
  Claims claims(claim_store);
  std::vector<Result<ClaimOutcome>> got;
  ASSERT_TRUE(ClaimTogether(claims, {"poison", "ok"}, got)) << "the callers never waited for a flight";
  EXPECT_FALSE(got[2].ok());
  auto poison = claim_store.FindClaim("group", "poison");
  ASSERT_OK(poison);
  EXPECT_FALSE(poison->has_value());
  auto ok = claim_store.FindClaim("group", "ok");
  ASSERT_OK(ok);
  if (got[3].ok()) {
    EXPECT_EQ(got[3]->kind, ClaimOutcome::Kind::kStarted);
    ASSERT_TRUE(ok->has_value());
    EXPECT_EQ((*ok)->fence, got[3]->token.fence);
  } else {
    EXPECT_FALSE(ok->has_value()) << got[3].status();
    auto again = claims.Claim(GroupRequest("ok"));
    ASSERT_OK(again);
    EXPECT_EQ(again->kind, ClaimOutcome::Kind::kStarted);
  }
}

// A claim of a new key is one round trip (the insert reads the row instead
// when the key is there), and so is a replay. After a run of replays the
// store reads first (a plain read: cheaper for the server when keys are
// there), so a new key takes two; a run of new keys brings the insert first
// back.
TEST_F(Postgres, AClaimIsOneRoundTripWhileMostKeysAreNewAndAReplayIsOne) {
  Claims claims(*store_->claim_store());
  auto request = [](int i) {
    return ClaimRequest{
        .scope = "rt", .key = "k" + std::to_string(i), .fingerprint = FingerprintOf("b"), .lease_ms = 60'000};
  };
  int next = 0;
  auto claim_new = [&] {
    auto c = claims.Claim(request(next++));
    ASSERT_OK(c);
    ASSERT_EQ(c->kind, ClaimOutcome::Kind::kStarted);
    ASSERT_OK(claims.Complete(c->token, "done " + c->token.key));
  };
  auto replay = [&] {
    auto c = claims.Claim(request(0));
    ASSERT_OK(c);
    EXPECT_EQ(c->kind, ClaimOutcome::Kind::kCompleted);
    EXPECT_EQ(c->result, "done k0");
  };
  claim_new();  // warm: a pooled connection, the prepared statements
  // (RoundTrips counts the claim and its completion: one each.)
  EXPECT_EQ(RoundTrips(claim_new), 2) << "a new key: the insert alone";
  EXPECT_EQ(RoundTrips(replay), 1);
  for (int i = 0; i < 40; ++i) replay();
  EXPECT_EQ(RoundTrips(replay), 1) << "a replay, read first";
  EXPECT_EQ(RoundTrips(claim_new), 3) << "a new key after many replays: the read, then the insert";
  for (int i = 0; i < 40; ++i) claim_new();
  EXPECT_EQ(RoundTrips(claim_new), 2) << "insert first again";
}

// Rows queued with InsertLater ride with the next statement: BEGIN, the
// multi-row insert and the read go in one round trip, COMMIT in another.
TEST_F(Postgres, InsertLaterRowsGoWithTheNextStatementInOneRoundTrip) {
  constexpr const char* kLater = "INSERT INTO payments(message_id, cents) VALUES ($1, $2)";
  int next = 0;
  auto work = [&] {
    auto tx = store_->BeginDeferred();
    ASSERT_OK(tx);
    for (int i = 0; i < 3; ++i) ASSERT_OK((*tx)->InsertLater(kLater, {"rt-" + std::to_string(next++), 100}));
    auto n = (*tx)->Query("SELECT count(*) FROM payments");
    ASSERT_OK(n);
    EXPECT_EQ(n->rows[0][0].AsInt(), next);
    ASSERT_OK((*tx)->Commit());
  };
  work();  // warm: the statements prepared
  EXPECT_EQ(RoundTrips(work), 2);
}

// A held row is never lost: when the statement it was to ride with cannot
// be sent (a text parameter with a NUL byte), the transaction can only fail.
// And FlushLater sends held rows at once even when their statement was
// refused, so their error is the caller's at that point.
TEST_F(Postgres, HeldRowsAreNeverLostAndFlushLaterSendsThemNow) {
  constexpr const char* kLater = "INSERT INTO payments(message_id, cents) VALUES ($1, $2)";
  {
    auto tx = store_->Begin();
    ASSERT_OK(tx);
    ASSERT_OK((*tx)->Exec("SELECT 1"));
    ASSERT_OK((*tx)->InsertLater(kLater, {"held", 1}));
    auto q = (*tx)->Query("SELECT $1::text", {std::string("a\0b", 3)});
    EXPECT_EQ(q.status().code(), Code::kInvalidArgument) << q.status();
    EXPECT_FALSE((*tx)->Commit().ok()) << "the held row was never written";
  }
  EXPECT_EQ(Charges(*store_, "held"), 0);
  {
    auto tx = store_->Begin();
    ASSERT_OK(tx);
    ASSERT_OK((*tx)->InsertLater(kLater, {"bad", Value()}));
    EXPECT_FALSE((*tx)->Exec("BEGIN").ok());  // refused: idem's transaction
    Status flushed = (*tx)->FlushLater();
    EXPECT_FALSE(flushed.ok()) << "the held insert's error, now";
    (*tx)->Rollback();
  }
  for (int round = 0; round < 2; ++round) {  // the pooled connections are clean
    auto tx = store_->Begin();
    ASSERT_OK(tx);
    ASSERT_OK((*tx)->InsertLater(kLater, {"after-" + std::to_string(round), 1}));
    ASSERT_OK((*tx)->Commit());
  }
  EXPECT_EQ(Charges(*store_, "after-1"), 1);
}

// A relay round whose rows were all confirmed settles in one statement: the
// rows leave the outbox and are kept as sent, together.
TEST_F(Postgres, ARelayRoundOfSentRowsSettlesInOneRoundTrip) {
  auto outbox = MustOpen<Outbox>(*store_, Outbox::Options{});
  {
    auto tx = store_->Begin();
    ASSERT_OK(tx);
    for (int i = 0; i < 20; ++i)
      ASSERT_OK(outbox->Add(
          **tx,
          OutgoingMessage{.destination = "d", .key = "k" + std::to_string(i % 3), .payload = "p" + std::to_string(i)}));
    ASSERT_OK((*tx)->Commit());
  }
  OutboxStore& os = *store_->outbox_store();
  auto session = os.OpenSession("rt");
  ASSERT_OK(session);
  ASSERT_OK((*session)->Rebalance());
  for (int round = 0; round < 2; ++round) {
    auto rows = (*session)->Fetch(10, nullptr);
    ASSERT_OK(rows);
    ASSERT_EQ(rows->size(), 10u);
    OutboxSettlement settled{.now_ms = 1};
    for (const OutboxRow& r : *rows) settled.sent.push_back(r.seq);
    EXPECT_EQ(RoundTrips([&] { ASSERT_OK((*session)->Settle(settled)); }), 1);
    // (RoundTrips runs Settle again: the second time it moves nothing.)
  }
  auto st = os.Stats();
  ASSERT_OK(st);
  EXPECT_EQ(st->backlog, 0);
  EXPECT_EQ(st->sent_kept, 20);
}

// Relay A is paused with a round's rows fetched (at `point`), and the server
// ends its session meanwhile, as a keepalive after a cut or an operator
// would: A's lane locks go with the session, and relay B takes the lanes and
// drains the outbox. Then A resumes. It still believes it holds the lanes
// (libpq learns that the session is gone only at the next statement), so
// paused before its publish it hands its rows to the broker once more: late
// copies after B's, which the next Inbox drops. What it cannot do is record
// anything: its settle travels over the ended session and fails, so every
// row is kept as sent once, nothing is dead, nothing moves back into the
// outbox, and A counts nothing as published.
void Postgres::PauseARelayWhileItsBackendEnds(const char* point) {
  Store& store = *store_;
  auto outbox = MustOpen<Outbox>(store, Outbox::Options{});
  std::vector<OutgoingMessage> batch;
  for (int i = 0; i < 12; ++i)
    batch.push_back(
        OutgoingMessage{.destination = "d", .key = "k" + std::to_string(i % 3), .payload = "p" + std::to_string(i)});
  std::map<std::string, std::vector<std::string>> added;
  {
    auto tx = store.Begin();
    ASSERT_OK(tx);
    auto ids = outbox->AddMany(**tx, batch);
    ASSERT_OK(ids);
    ASSERT_OK((*tx)->Commit());
    for (size_t i = 0; i < batch.size(); ++i) added[batch[i].key].push_back((*ids)[i]);
  }
  RecordingPublisher wire;  // both relays publish to it, as to one broker
  std::mutex mu;
  std::condition_variable cv;
  bool paused = false, resume = false;
  ArmKillPoint(point, 1, [&] {
    std::unique_lock lock(mu);
    paused = true;
    cv.notify_all();
    cv.wait_for(lock, std::chrono::seconds(60), [&] { return resume; });
  });
  OutboxRelay::Options oa{.name = "a", .poll_ms = 20, .rebalance_ms = 20};
  auto a = MustOpen<OutboxRelay>(store, wire, oa);
  std::thread ta([&] { EXPECT_OK(a->Run()); });
  // Lets A go and waits for it, whatever the assertions below say.
  bool a_gone = false;
  auto let_a_go = [&] {
    if (a_gone) return;
    a_gone = true;
    {
      std::lock_guard lock(mu);
      resume = true;
    }
    cv.notify_all();
    a->Stop();  // after the round in flight: A publishes and settles it first
    ta.join();
    DisarmKillPoints();
  };
  struct Finally {
    std::function<void()> f;
    ~Finally() { f(); }
  } finally{let_a_go};
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return paused; })) << "A never reached " << point;
  }
  const size_t before_takeover = wire.copies().size();
  {
    auto tx = store.Begin();
    ASSERT_OK(tx);
    auto pid = (*tx)->Query("SELECT backend_pid FROM idem_outbox_relays WHERE name LIKE 'a:%'");
    ASSERT_OK(pid);
    ASSERT_EQ(pid->rows.size(), 1u);
    ASSERT_OK((*tx)->Commit());
    Terminate(static_cast<int>(pid->rows[0][0].AsInt()));
  }
  OutboxRelay::Options ob{.name = "b", .poll_ms = 20, .rebalance_ms = 20, .stop_when_idle = true};
  auto b = MustOpen<OutboxRelay>(store, wire, ob);
  ASSERT_OK(b->Run());
  EXPECT_EQ(b->stats().published, batch.size());
  const size_t after_b = wire.copies().size();
  let_a_go();

  EXPECT_EQ(a->stats().published, 0u) << "A's settle went over an ended session";
  EXPECT_EQ(a->stats().rounds, 0u);
  auto st = outbox->Stats();
  ASSERT_OK(st);
  EXPECT_EQ(st->backlog, 0);
  EXPECT_EQ(st->dead_letters, 0);
  EXPECT_EQ(st->sent_kept, static_cast<int64_t>(batch.size()));
  {
    auto tx = store.Begin();
    ASSERT_OK(tx);
    auto sent = (*tx)->Query("SELECT count(*), count(DISTINCT id) FROM idem_outbox_sent");
    ASSERT_OK(sent);
    EXPECT_EQ(sent->rows[0][0].AsInt(), static_cast<int64_t>(batch.size()));
    EXPECT_EQ(sent->rows[0][1].AsInt(), static_cast<int64_t>(batch.size()));
    ASSERT_OK((*tx)->Commit());
  }
  // The first copy of each message, per key, in commit order; a late copy
  // only repeats a message B already published.
  const auto copies = wire.copies();
  EXPECT_EQ(FirstCopiesByKey(copies), added);
  std::set<std::string> by_b;
  for (size_t i = before_takeover; i < after_b; ++i) by_b.insert(copies[i].id);
  EXPECT_EQ(by_b.size(), batch.size()) << "B published every message";
  for (size_t i = after_b; i < copies.size(); ++i) EXPECT_TRUE(by_b.count(copies[i].id)) << copies[i].id;
  // Paused before its publish, A does publish late: nothing on the broker's
  // side fences it (doc/outbox.md).
  if (std::string_view(point) == "relay.before_publish") {
    EXPECT_GT(copies.size(), after_b);
  }
  std::map<std::string, int> per_id;
  for (const auto& c : copies) ++per_id[c.id];
  for (const auto& [id, n] : per_id) EXPECT_LE(n, 2) << id << ": at most once by each relay";
}

// Paused before its first publish: A's late copies reach the wire after B's
// (the documented duplicate of outbox.md), and its settle fails.
TEST_F(Postgres, ARelayWhoseBackendEndedWhilePausedBeforePublishCannotSettleAndKeepsFirstCopiesInOrder) {
  PauseARelayWhileItsBackendEnds("relay.before_publish");
}

// Paused after its publish, before its settle: B publishes the same messages
// again (same ids), and A's settle fails: each is kept as sent once.
TEST_F(Postgres, ARelayWhoseBackendEndedWhilePausedBeforeSettleCannotSettleAndEveryRowIsSentOnce) {
  PauseARelayWhileItsBackendEnds("relay.before_settle");
}

// A statement whose PREPARE succeeded in the flight that carried BEGIN, and
// whose execution then failed: the server keeps the prepared statement, and
// the connection's cache must know it, or every new statement after it on
// that connection fails ("prepared statement already exists").
TEST_F(Postgres, AStatementThatFailsAfterItsPrepareLeavesTheConnectionUsable) {
  auto one = postgres::Store::Open({.url = url_, .pool_size = 1});
  ASSERT_OK(one);
  Store& store = **one;
  for (int divisor : {0, 0, 2}) {
    auto tx = store.BeginDeferred();
    ASSERT_OK(tx);
    auto r = (*tx)->Query("SELECT 10 / $1::bigint", {int64_t{divisor}});
    if (divisor == 0) {
      EXPECT_FALSE(r.ok());
      (*tx)->Rollback();
      continue;
    }
    ASSERT_OK(r);
    EXPECT_EQ(r->rows[0][0].AsInt(), 5);
    ASSERT_OK((*tx)->Commit());
  }
  // A statement new to the connection after it.
  auto inbox_owned = MustOpen<Inbox>(store, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  for (int d = 0; d < 2; ++d)
    EXPECT_NE(inbox.Handle(Msg("after-failed-exec"), ChargeHandler()).kind, Outcome::Kind::kFailed);
  EXPECT_EQ(Charges(store, "after-failed-exec"), 1);
}

// After a server restart every pooled connection is dead, though each looks
// fine until used: reads, new transactions and the Inbox still work, on new
// connections, whichever of them meets the dead pool first.
TEST_F(Postgres, EveryPooledConnectionDeadIsRecoveredFrom) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  ASSERT_EQ(inbox.Handle(Msg("before-restart"), ChargeHandler()).kind, Outcome::Kind::kApplied);
  // Four connections at once, back in the pool afterwards, then their backends ended.
  auto kill_the_pool = [&] {
    std::vector<std::unique_ptr<StoreTransaction>> open;
    std::vector<int> pids;
    for (int i = 0; i < 4; ++i) {
      auto tx = store_->Begin();
      ASSERT_OK(tx);
      pids.push_back(BackendPid(**tx));
      open.push_back(std::move(*tx));
    }
    for (auto& tx : open) ASSERT_TRUE(tx->Commit().ok());
    for (int pid : pids) Terminate(pid);
  };
  kill_the_pool();
  auto count = store_->CountMarkers("payments");  // a read
  ASSERT_OK(count);
  EXPECT_EQ(*count, 1);
  kill_the_pool();
  {
    auto tx = store_->Begin();  // BEGIN on its own
    ASSERT_OK(tx);
    auto one = (*tx)->Query("SELECT 1", {});
    ASSERT_OK(one);
    ASSERT_OK((*tx)->Commit());
  }
  kill_the_pool();
  for (int d = 0; d < 2; ++d)  // BEGIN held back, sent with the marker
    EXPECT_NE(inbox.Handle(Msg("after-restart"), ChargeHandler()).kind, Outcome::Kind::kFailed);
  EXPECT_EQ(Charges(*store_, "after-restart"), 1);
  EXPECT_EQ(inbox.Handle(Msg("before-restart"), ChargeHandler()).kind, Outcome::Kind::kDuplicate);
}

// A transaction whose held-back BEGIN never went out (its first flight
// failed before anything was sent: here a text parameter with a NUL byte)
// fails, and the connection goes back to the pool clean: the next read and
// the next transaction on it work.
TEST_F(Postgres, AFailedHeldBackBeginDoesNotStickToThePooledConnection) {
  auto one = postgres::Store::Open({.url = url_, .pool_size = 1});
  ASSERT_OK(one);
  Store& store = **one;
  for (bool rollback : {true, false}) {
    {
      auto tx = store.BeginDeferred();
      ASSERT_OK(tx);
      Value p[] = {std::string("a\0b", 3)};
      auto r = (*tx)->Query("SELECT $1::text", p);
      EXPECT_FALSE(r.ok());
      EXPECT_NE(r.status().message().find("NUL"), std::string::npos) << r.status();
      if (rollback) {
        (*tx)->Rollback();
      } else {
        EXPECT_FALSE((*tx)->Commit().ok());
      }
    }
    auto count = store.CountMarkers("payments");
    EXPECT_OK(count);
    auto tx = store.Begin();
    ASSERT_OK(tx);
    auto r = (*tx)->Query("SELECT 1", {});
    EXPECT_OK(r);
    EXPECT_OK((*tx)->Commit());
  }
}

TEST_F(Postgres, ReadsOutsideATransactionRecoverFromADeadPooledConnection) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  int sock = -1;
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    sock = PQsocket(static_cast<PGconn*>(tx.NativeHandle()));
    return ChargeHandler()(tx, m);
  };
  auto cut_pooled = [&](const std::string& id) {
    ASSERT_EQ(inbox.Handle(Msg(id), h).kind, Outcome::Kind::kApplied);
    ASSERT_EQ(::shutdown(sock, SHUT_RDWR), 0);  // that connection is back in the pool now
  };
  cut_pooled("dead-1");
  auto marker = store_->FindMarker("payments", "dead-1");
  ASSERT_OK(marker);
  EXPECT_TRUE(marker->has_value());
  cut_pooled("dead-2");
  auto count = store_->CountMarkers("payments");
  ASSERT_OK(count);
  EXPECT_EQ(*count, 2);
  cut_pooled("dead-3");
  auto list = store_->ListMarkers("payments", 10);
  ASSERT_OK(list);
  EXPECT_EQ(list->size(), 3u);
  for (const char* id : {"dead-1", "dead-2", "dead-3"}) {
    EXPECT_EQ(inbox.Handle(Msg(id), ChargeHandler()).kind, Outcome::Kind::kDuplicate) << id;
    EXPECT_EQ(Charges(*store_, id), 1) << id;
  }
}

TEST_F(Postgres, ConcurrentPurgesTakeDisjointRows) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  std::vector<Message> batch;
  for (int i = 0; i < 600; ++i) batch.push_back(Msg("p-" + std::to_string(i)));
  for (size_t at = 0; at < batch.size(); at += 100)
    for (const Outcome& o : inbox.HandleBatch(std::span(batch).subspan(at, 100), ChargeHandler()))
      ASSERT_TRUE(o.applied());
  std::atomic<int64_t> total{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> purgers;
  for (int t = 0; t < 3; ++t)
    purgers.emplace_back([&] {
      auto n = store_->Purge("payments", Env::Default()->NowMs() + 1000, 25);
      if (n.ok())
        total += *n;
      else
        ++errors;
    });
  for (auto& t : purgers) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(total.load(), 600);
  EXPECT_EQ(*store_->CountMarkers("payments"), 0);
}

// Purge drops whole days: the partition tables go, their markers with them,
// and younger days stay.
TEST(PostgresDailyPurge, DropsWholeDaysAndKeepsYoungerOnes) {
  const int64_t day = 86'400'000;
  FakeEnv env(20'000 * day + 3'600'000);  // 01:00 on day 20000
  std::string url = FreshSchemaUrl();
  auto store = postgres::Store::Open({.url = url, .partition_by_day = true, .partition_days_ahead = 3, .env = &env});
  ASSERT_OK(store);
  ASSERT_TRUE(CreatePayments(**store).ok());
  auto inbox_owned = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "payments", .env = &env});
  Inbox& inbox = *inbox_owned;
  for (int d = 0; d < 3; ++d) {
    for (int i = 0; i < 10; ++i) {
      std::string id = "d";
      id += std::to_string(d);
      id += '-';
      id += std::to_string(i);
      for (int copy = 0; copy < 2; ++copy) inbox.Handle(Msg(id), ChargeHandler());
    }
    env.Advance(day);
  }
  EXPECT_EQ(*(*store)->CountMarkers(""), 30);
  auto tables = [&] {
    PGconn* c = PQconnectdb(url.c_str());
    PGresult* r = PQexec(c,
                         "SELECT count(*) FROM pg_tables WHERE tablename IN"
                         " ('idem_markers_d20000', 'idem_markers_d20001', 'idem_markers_d20002')"
                         " AND schemaname = current_schema()");
    int n = std::atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    PQfinish(c);
    return n;
  };
  EXPECT_EQ(tables(), 3);
  // Retention: everything before day 20002.
  auto n = (*store)->Purge("", 20'002 * day, 1000);
  ASSERT_OK(n);
  EXPECT_EQ(*n, 20);
  EXPECT_EQ(tables(), 1);
  EXPECT_EQ(*(*store)->CountMarkers(""), 10);
  // The kept day still rejects its duplicates; the purged ones are forgotten.
  EXPECT_EQ(inbox.Handle(Msg("d2-0"), ChargeHandler()).kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(inbox.Handle(Msg("d0-0"), ChargeHandler()).kind, Outcome::Kind::kApplied);
}

// Without a clock given, claims are judged by the server's clock: a client
// whose own clock is far off (here: a day behind) still gets the server's
// leases, and a lease it sees as live by its clock is live by the server's.
TEST(PostgresClaims, LeasesFollowTheServerClockNotTheClients) {
  FakeEnv skewed(Env::Default()->NowMs() - 86'400'000);
  auto store = ClaimsOf(postgres::Store::Open({.url = FreshSchemaUrl(), .env = &skewed}));
  ASSERT_OK(store);
  auto server_now = (*store)->NowMs();
  ASSERT_OK(server_now);
  EXPECT_GT(*server_now, skewed.NowMs() + 86'000'000) << "the store's clock is the server's, not the client's";
  auto claims_owned = MustOpen<Claims>(**store, Claims::Options{.env = &skewed});
  Claims& claims = *claims_owned;
  ClaimRequest r{.scope = "charges", .key = "k", .fingerprint = FingerprintOf("b"), .lease_ms = 600'000};
  auto c = claims.Claim(r);
  ASSERT_TRUE(c.ok() && c->kind == ClaimOutcome::Kind::kStarted) << c.status();
  EXPECT_GE(c->token.lease_until_ms, *server_now + 600'000);
  skewed.Advance(2 * 86'400'000);  // the client's clock jumps far past the lease: the server's did not
  auto again = claims.Claim(r);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->kind, ClaimOutcome::Kind::kInProgress);
}

TEST(PostgresBadInput, UnreachableServerIsAClearError) {
  auto s = postgres::Store::Open({.url = "postgres://postgres@127.0.0.1:1/idem_test", .connect_timeout_ms = 2000});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kUnavailable);
  EXPECT_NE(s.status().message().find("cannot connect to PostgreSQL at postgres://postgres@127.0.0.1:1"),
            std::string::npos)
      << s.status();
}

TEST(PostgresBadInput, WrongPasswordIsNamedAndNotEchoed) {
  std::string url = PgUrl();
  auto at = url.find("postgres@");
  ASSERT_NE(at, std::string::npos);
  url.replace(at, 9, "idem_pw:hunter2@");
  auto s = postgres::Store::Open({.url = url});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kUnavailable);
  EXPECT_NE(s.status().message().find("password authentication failed"), std::string::npos) << s.status();
  EXPECT_EQ(s.status().message().find("hunter2"), std::string::npos) << s.status();
  // The right password opens it.
  std::string good = FreshSchemaUrl();
  good.replace(good.find("postgres@"), 9, "idem_pw:secret@");
  auto ok = postgres::Store::Open({.url = good});
  EXPECT_OK(ok);
}

TEST(PostgresBadInput, MissingDatabaseIsNamed) {
  std::string url = PgUrl();
  url.replace(url.rfind('/') + 1, std::string::npos, "no_such_db");
  auto s = postgres::Store::Open({.url = url});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kUnavailable);
  EXPECT_NE(s.status().message().find("no_such_db"), std::string::npos) << s.status();
}

// A multi-host URL that asks for the primary (target_session_attrs=read-write)
// and reaches only servers that cannot write (standbys; here a database
// whose sessions are read-only, which libpq judges the same way): refused
// at once, kUnavailable (exit 3 from the CLI), naming every host tried and
// why, nothing written.
TEST(PostgresBadInput, AUrlWhoseHostsAreAllReadOnlyIsRefusedNamingEachHost) {
  const std::string db = "ro_" + std::to_string(::getpid());
  PgAdmin("DROP DATABASE IF EXISTS " + db);
  ASSERT_EQ(PgAdmin("CREATE DATABASE " + db), "");
  ASSERT_EQ(PgAdmin("ALTER DATABASE " + db + " SET default_transaction_read_only = on"), "");
  std::string url = PgUrl();  // postgres://postgres@127.0.0.1:PORT/idem_test
  const size_t at = url.find('@') + 1, slash = url.rfind('/');
  const std::string hostport = url.substr(at, slash - at);
  url = url.substr(0, at) + hostport + "," + hostport + "/" + db + "?target_session_attrs=read-write";
  auto s = postgres::Store::Open({.url = url});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kUnavailable) << s.status();
  EXPECT_NE(s.status().message().find("read-only"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find(hostport.substr(0, hostport.find(':'))), std::string::npos) << s.status();
  PgAdmin("DROP DATABASE IF EXISTS " + db);
}

TEST(PostgresBadInput, DatabaseWithoutTheSchemaAndNewerSchema) {
  std::string url = FreshSchemaUrl();
  auto none = postgres::Store::Open({.url = url, .create_if_missing = false});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Code::kSchemaMismatch);
  EXPECT_NE(none.status().message().find("no idem schema"), std::string::npos) << none.status();
  {
    auto s = postgres::Store::Open({.url = url});
    ASSERT_OK(s);
    auto tx = (*s)->Begin();
    ASSERT_TRUE((*tx)->Exec("INSERT INTO idem_migrations VALUES (99, 'from the future', 0)").ok());
    ASSERT_OK((*tx)->Commit());
  }
  auto newer = postgres::Store::Open({.url = url});
  ASSERT_FALSE(newer.ok());
  EXPECT_EQ(newer.status().code(), Code::kSchemaMismatch);
  EXPECT_NE(newer.status().message().find("99"), std::string::npos) << newer.status();
}

TEST(PostgresBadInput, IdemOptionsInTheUrl) {
  std::string url = FreshSchemaUrl();
  auto daily = postgres::Store::Open({.url = url + "&idem_partition_by_day=true"});
  ASSERT_OK(daily);
  auto inbox_owned = MustOpen<Inbox>(**daily, Inbox::Options{.consumer = "c"});
  Inbox& inbox = *inbox_owned;
  ASSERT_TRUE(CreatePayments(**daily).ok());
  for (int i = 0; i < 2; ++i) inbox.Handle(Msg("m"), ChargeHandler());
  // The daily table holds it; the plain layout does not see it.
  EXPECT_EQ(*(*daily)->CountMarkers("c"), 1);
  EXPECT_EQ(*(*postgres::Store::Open({.url = url}))->CountMarkers("c"), 0);
  auto bad = postgres::Store::Open({.url = url + "&idem_colour=blue"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("idem_colour"), std::string::npos);
}

// RedactUrl's cases for PostgreSQL URLs and key=value strings: test/core/url_test.cc.

TEST(PostgresBadInput, AnUnparsableUrlIsBadUsageAndKeepsItsPasswordSecret) {
  auto bad = postgres::Store::Open({.url = "postgres://u:s3cret@[::1/x"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("not a valid PostgreSQL URL"), std::string::npos) << bad.status();
  EXPECT_EQ(bad.status().message().find("s3cret"), std::string::npos) << bad.status();
}

TEST(PostgresBadInput, UrlParsing) {
  EXPECT_TRUE(postgres::Store::ParseUrl("postgres://h/db").ok());
  EXPECT_TRUE(postgres::Store::ParseUrl("postgresql://h/db").ok());
  EXPECT_EQ(postgres::Store::ParseUrl("sqlite:x.db").status().code(), Code::kInvalidArgument);
  // idem's keys go to the fields; libpq's stay in the URL as written.
  auto o = postgres::Store::ParseUrl(
      "postgres://u:pw@h:5432/db?sslmode=disable&idem_pool_size=3&idem_partition_by_day=true"
      "&idem_connect_timeout_ms=1500&application_name=a%20b&idem_create_if_missing=false"
      "&idem_ack_after=standby_flush&idem_standby_wait_ms=2500&idem_pooler=transaction");
  ASSERT_OK(o);
  EXPECT_EQ(o->ack_after, postgres::Store::Options::AckAfter::kStandbyFlush);
  EXPECT_EQ(o->standby_wait_ms, 2500);
  EXPECT_EQ(o->pooler, postgres::Store::Options::Pooler::kTransaction);
  EXPECT_EQ(o->url, "postgres://u:pw@h:5432/db?sslmode=disable&application_name=a%20b");
  EXPECT_EQ(o->pool_size, 3);
  EXPECT_TRUE(o->partition_by_day);
  EXPECT_EQ(o->connect_timeout_ms, 1500);
  EXPECT_FALSE(o->create_if_missing);
  auto plain = postgres::Store::ParseUrl("postgres://h/db");
  EXPECT_EQ(plain->url, "postgres://h/db");
  EXPECT_EQ(plain->pool_size, postgres::Store::Options{}.pool_size);
  // Unknown idem keys, keys given twice, numbers out of range: named, password hidden.
  for (const char* bad :
       {"postgres://u:s3cret@h/db?idem_colour=blue", "postgres://u:s3cret@h/db?idem_pool_size=0",
        "postgres://u:s3cret@h/db?idem_pool_size=2&idem_pool_size=3",
        "postgres://u:s3cret@h/db?idem_partition_by_day=maybe", "postgres://u:s3cret@h/db?idem_ack_after=replica",
        "postgres://u:s3cret@h/db?idem_pooler=x", "postgres://u:s3cret@h/db?idem_standby_wait_ms=0"}) {
    auto r = postgres::Store::ParseUrl(bad);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("idem_"), std::string::npos) << r.status();
    EXPECT_EQ(r.status().message().find("s3cret"), std::string::npos) << r.status();
  }
}

TEST(PostgresOpenByUrl, OpenStoreAndOpenClaimStore) {
  auto store = idem::OpenStore(PgUrl() + (PgUrl().find('?') == std::string::npos ? "?" : "&") + "idem_pool_size=2");
  ASSERT_OK(store);
  EXPECT_EQ((*store)->Kind(), "postgres");
  auto claims = idem::OpenClaimStore(PgUrl());
  ASSERT_OK(claims);
  EXPECT_OK((*claims)->NowMs());
  // Unreachable: kUnavailable, password hidden.
  auto down = idem::OpenStore("postgres://u:s3cret@127.0.0.1:1/db?idem_connect_timeout_ms=1000");
  EXPECT_EQ(down.status().code(), Code::kUnavailable) << down.status();
  EXPECT_EQ(down.status().message().find("s3cret"), std::string::npos) << down.status();
}

TEST(PostgresBadInput, OpenChecksTheOptions) {
  for (postgres::Store::Options o :
       {postgres::Store::Options{.pool_size = 0}, postgres::Store::Options{.connect_timeout_ms = 0},
        postgres::Store::Options{.partition_days_ahead = -1}}) {
    o.url = "postgres://u:s3cret@127.0.0.1:1/db";
    auto r = postgres::Store::Open(o);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status();
    EXPECT_EQ(r.status().message().find("s3cret"), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace idem::testing
