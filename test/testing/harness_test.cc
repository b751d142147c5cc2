// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The test kit's own tests (idem/testing/): the corrected handlers of
// examples/testing/handlers.h pass every scenario, on SQLite and on a
// PostgreSQL the kit starts itself (TempPostgres); each wrong one is caught by
// the scenario that should catch it, with a report that names the scenario,
// the message and the difference; a double effect hidden until the third
// delivery is caught too. Also the parts users take one by one: MemorySource
// under a Consumer, FakeDownstream, TempDir, the assertions of gtest.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <string>
#include <thread>

#include "idem/consumer.h"
#include "idem/inbox.h"
#include "idem/open.h"
#include "idem/testing/fake_env.h"
#include "idem/testing/gtest.h"
#include "idem/testing/harness.h"
#include "idem/testing/memory_source.h"
#include "idem/testing/throwaway.h"
#include "testing/handlers.h"

namespace idem::testing {
namespace {

using payments::kSchema;
using payments::kState;

Harness::Options PaymentsOptions(std::string url = "") {
  return {.schema = kSchema, .state_query = kState, .store_url = std::move(url)};
}
Harness::Options LedgerOptions(std::string url = "") {
  Harness::Options o = PaymentsOptions(std::move(url));
  o.state = payments::LedgerState;
  return o;
}

std::set<Scenario> Broken(const Report& r) {
  std::set<Scenario> out;
  for (const Failure& f : r.failures) out.insert(f.scenario);
  return out;
}
const Failure* FailureOf(const Report& r, Scenario s) {
  for (const Failure& f : r.failures)
    if (f.scenario == s) return &f;
  return nullptr;
}

Subject HandlerSubject(std::string name, std::function<Handler(Context&)> make) {
  return {.name = std::move(name), .handler = std::move(make)};
}

// ---- The corrected handlers pass everything.

TEST(Harness, TheCorrectHandlerIsIdempotentInEveryScenario) {
  Harness harness(PaymentsOptions());
  auto report =
      harness.Run(HandlerSubject("charge", [](Context&) { return payments::Charge(); }), payments::Messages());
  ASSERT_OK(report);
  EXPECT_TRUE(report->ok()) << *report;
  EXPECT_EQ(report->store_kind, "sqlite");
  // Everything but lost_response ran (the handler calls nothing).
  EXPECT_EQ(report->ran.size(), AllScenarios().size() - 1);
  ASSERT_EQ(report->skipped.size(), 1u);
  EXPECT_NE(report->skipped[0].find("lost_response"), std::string::npos);
  EXPECT_GT(report->deliveries, 12 * 20);
  EXPECT_NE(report->ToString().find("is idempotent"), std::string::npos);
}

TEST(Harness, TheCorrectCallFirstIsIdempotentInEveryScenario) {
  Harness harness(PaymentsOptions());
  Subject s{.name = "charge-card", .call_first = [](Context& c) { return payments::ChargeCard(c, true); }};
  auto report = harness.Run(s, payments::Messages(8));
  ASSERT_OK(report);
  EXPECT_TRUE(report->ok()) << *report;
  EXPECT_TRUE(report->skipped.empty()) << *report;
}

TEST(Harness, EXPECT_IDEMPOTENT_PassesTheCorrectHandler) {
  Harness harness(PaymentsOptions());
  auto subject = HandlerSubject("charge", [](Context&) { return payments::Charge(); });
  auto messages = payments::Messages(4);
  EXPECT_IDEMPOTENT(harness, subject, messages);
}

// ---- Each wrong one is caught by the scenario that should catch it.

TEST(Harness, AnEffectOutsideTheTransactionIsCaughtByACrashAfterTheWork) {
  Harness harness(LedgerOptions());
  auto report = harness.Run(HandlerSubject("outside-ledger", payments::ChargeWithOutsideLedger), payments::Messages());
  ASSERT_OK(report);
  EXPECT_FALSE(report->ok());
  std::set<Scenario> broken = Broken(*report);
  EXPECT_EQ(broken, (std::set<Scenario>{Scenario::kCrash, Scenario::kInDoubt})) << *report;
  const Failure* crash = FailureOf(*report, Scenario::kCrash);
  ASSERT_NE(crash, nullptr);
  // Killed before the handler ran, nothing leaked; the first point after it
  // is the one that doubles.
  EXPECT_NE(crash->what.find("inbox.after_work"), std::string::npos) << crash->what;
  EXPECT_EQ(crash->message_id, "pay-0");
  EXPECT_NE(std::find(crash->diff.begin(), crash->diff.end(), "- ledger bob 10"), crash->diff.end())
      << report->ToString();
  EXPECT_NE(std::find(crash->diff.begin(), crash->diff.end(), "+ ledger bob 30"), crash->diff.end())
      << report->ToString();
  const std::string text = report->ToString();
  EXPECT_NE(text.find("NOT idempotent"), std::string::npos) << text;
  EXPECT_NE(text.find("[crash] killed at inbox.after_work"), std::string::npos) << text;
  EXPECT_NE(text.find("message: \"pay-0\""), std::string::npos) << text;
}

TEST(Harness, ACallWithoutAKeyIsCaughtByALostAnswerAndACrashAfterTheCall) {
  Harness harness(PaymentsOptions());
  Subject s{.name = "no-key", .call_first = [](Context& c) { return payments::ChargeCard(c, false); }};
  auto report = harness.Run(s, payments::Messages(6));
  ASSERT_OK(report);
  std::set<Scenario> broken = Broken(*report);
  EXPECT_TRUE(broken.count(Scenario::kLostResponse)) << *report;
  EXPECT_TRUE(broken.count(Scenario::kCrash)) << *report;
  EXPECT_FALSE(broken.count(Scenario::kTwice)) << *report;
  const Failure* crash = FailureOf(*report, Scenario::kCrash);
  ASSERT_NE(crash, nullptr);
  EXPECT_NE(crash->what.find("downstream.after_call"), std::string::npos) << crash->what;
  // The service charged twice: two effects where one was expected.
  const Failure* lost = FailureOf(*report, Scenario::kLostResponse);
  ASSERT_NE(lost, nullptr);
  EXPECT_NE(std::find(lost->diff.begin(), lost->diff.end(), "+ downstream: charge bob 10 key=none"), lost->diff.end())
      << report->ToString();
}

TEST(Harness, AnIncrementWithoutAMarkerIsCaughtByTheSecondDelivery) {
  Harness harness(PaymentsOptions());
  Subject s{.name = "no-marker", .consumer = payments::IncrementWithoutMarker};
  auto report = harness.Run(s, payments::Messages(6));
  ASSERT_OK(report);
  const Failure* twice = FailureOf(*report, Scenario::kTwice);
  ASSERT_NE(twice, nullptr) << *report;
  EXPECT_EQ(twice->message_id, "pay-0");
  EXPECT_NE(twice->what.find("delivery 2 of \"pay-0\""), std::string::npos) << twice->what;
  // Every scenario that delivers a message twice catches it.
  EXPECT_EQ(report->failures.size(), report->ran.size()) << *report;
}

TEST(Harness, ADoubleEffectHiddenUntilTheThirdDeliveryIsCaught) {
  Harness harness(PaymentsOptions());
  Subject s{.name = "third-delivery", .consumer = payments::DedupeExceptOnThirdDelivery};
  auto report = harness.Run(s, payments::Messages(6));
  ASSERT_OK(report);
  std::set<Scenario> broken = Broken(*report);
  EXPECT_FALSE(broken.count(Scenario::kTwice)) << *report;  // two deliveries look right
  const Failure* f = FailureOf(*report, Scenario::kInterleaved);
  ASSERT_NE(f, nullptr) << *report;
  EXPECT_NE(f->what.find("delivery 3 of"), std::string::npos) << f->what;
}

TEST(Harness, AHandlerThatFailsItsCleanRunIsReportedAsSuch) {
  Harness harness(PaymentsOptions());
  auto report = harness.Run(HandlerSubject("broken",
                                           [](Context&) -> Handler {
                                             return [](Transaction& tx, const Message&) {
                                               return tx.Exec("INSERT INTO no_such_table VALUES (1)").status();
                                             };
                                           }),
                            payments::Messages(2));
  ASSERT_OK(report);
  EXPECT_FALSE(report->ok());
  ASSERT_EQ(report->clean_errors.size(), 2u);
  EXPECT_NE(report->clean_errors[0].find("no_such_table"), std::string::npos) << report->clean_errors[0];
  EXPECT_NE(report->ToString().find("failed its clean run"), std::string::npos);
}

TEST(Harness, AMisconfiguredRunIsAnErrorNamingTheProblem) {
  Harness harness(PaymentsOptions());
  auto none = harness.Run(Subject{}, payments::Messages(1));
  EXPECT_TRUE(none.status().IsInvalidArgument());
  EXPECT_NE(none.status().message().find("exactly one of handler, call_first and consumer"), std::string::npos);
  auto twice = harness.Run(HandlerSubject("c", [](Context&) { return payments::Charge(); }),
                           {Msg("a", "alice 1"), Msg("a", "alice 1")});
  EXPECT_TRUE(twice.status().IsInvalidArgument());
  EXPECT_NE(twice.status().message().find("share the id \"a\""), std::string::npos) << twice.status();
  Harness no_state({.schema = kSchema});
  auto r = no_state.Run(HandlerSubject("c", [](Context&) { return payments::Charge(); }), payments::Messages(1));
  EXPECT_NE(r.status().message().find("no state to compare"), std::string::npos) << r.status();
  Harness bad_schema({.schema = {"CREATE TABLEX oops"}, .state_query = kState});
  auto b = bad_schema.Run(HandlerSubject("c", [](Context&) { return payments::Charge(); }), payments::Messages(1));
  EXPECT_NE(b.status().message().find("schema statement"), std::string::npos) << b.status();
}

// ---- What SQLite cannot show, said in the report.

TEST(Harness, ASecondConnectionOnSqliteIsNamedAsTheLikelyMistake) {
  Harness harness(PaymentsOptions());
  auto report =
      harness.Run(HandlerSubject("second-connection", payments::ChargeThroughSecondConnection), payments::Messages(1));
  ASSERT_OK(report);
  ASSERT_FALSE(report->clean_errors.empty()) << *report;
  const std::string text = report->ToString();
  EXPECT_NE(text.find("database is locked"), std::string::npos) << text;
  EXPECT_NE(text.find("second connection"), std::string::npos) << text;
  EXPECT_NE(text.find("PostgreSQL"), std::string::npos) << text;
}

TEST(Harness, AReadThenWriteOnSqliteIsSaidToBeOutOfReach) {
  Harness harness(PaymentsOptions());
  auto report = harness.Run(HandlerSubject("read-then-write", [](Context&) { return payments::ChargeReadThenWrite(); }),
                            payments::Messages(4));
  ASSERT_OK(report);
  EXPECT_TRUE(report->ok()) << *report;  // SQLite runs one writer at a time: no update is lost
  ASSERT_FALSE(report->notes.empty()) << *report;
  const std::string text = report->ToString();
  EXPECT_NE(text.find("read-then-write"), std::string::npos) << text;
  EXPECT_NE(text.find("PostgreSQL"), std::string::npos) << text;
}

// ---- The parts users take one by one.

TEST(MemorySource, ALostAckBringsTheMessageAgainAndTheInboxAbsorbsIt) {
  auto db = TempSqlite::Open();
  ASSERT_OK(db);
  Store* store = &(*db)->store();
  {
    auto tx = store->Begin();
    ASSERT_OK(tx);
    for (const std::string& sql : kSchema) ASSERT_OK((*tx)->Exec(sql));
    ASSERT_OK((*tx)->Commit());
  }
  auto inbox = Inbox::Open(*store, {.consumer = "payments"});
  ASSERT_OK(inbox);
  MemorySource source({.lease_ms = 0});
  for (const Message& m : payments::Messages(5)) source.Push(m);
  source.LoseAcks(3);
  // Lost acks come again at once (no lease): the run ends when nothing is
  // left for it.
  auto consumer = Consumer::Open(source, **inbox, payments::Charge(), {.workers = 2, .stop_when_idle = true});
  ASSERT_OK(consumer);
  ASSERT_OK((*consumer)->Run());
  EXPECT_EQ(source.pending(), 0);
  EXPECT_EQ(source.acked(), 5);
  EXPECT_EQ(source.lost_acks(), 3);
  EXPECT_EQ(source.deliveries(), 8);
  EXPECT_EQ((*inbox)->counters().applied, 5u);
  EXPECT_EQ((*inbox)->counters().duplicates, 3u);
  auto tx = store->Begin();
  ASSERT_OK(tx);
  auto n = (*tx)->Query("SELECT count(*) FROM payments");
  ASSERT_OK(n);
  EXPECT_EQ(n->rows[0][0].AsInt(), 5);
}

TEST(MemorySource, ANackComesBackAfterItsDelayOnTheSourcesClockAndAStaleReceiptIsRefused) {
  FakeEnv clock;
  MemorySource source({.lease_ms = 1000, .env = &clock});
  source.Push(Msg("m", "x"));
  auto first = source.Receive(10, 0);
  ASSERT_OK(first);
  ASSERT_EQ(first->size(), 1u);
  EXPECT_EQ((*first)[0].message.attempt, 1);
  ASSERT_OK(source.Nack((*first)[0], 500));
  EXPECT_TRUE(source.Receive(10, 0)->empty());
  clock.Advance(500);
  auto second = source.Receive(10, 0);
  ASSERT_EQ(second->size(), 1u);
  EXPECT_EQ((*second)[0].message.attempt, 2);
  EXPECT_TRUE(source.Ack((*first)[0]).IsLeaseLost());  // the first delivery's receipt is stale
  clock.Advance(1000);                                 // the lease runs out: delivered again
  auto third = source.Receive(10, 0);
  ASSERT_EQ(third->size(), 1u);
  EXPECT_TRUE(source.Ack((*second)[0]).IsLeaseLost());
  EXPECT_OK(source.Ack((*third)[0]));
  EXPECT_EQ(source.acked_ids(), std::vector<std::string>{"m"});
  EXPECT_TRUE(source.Ack(Delivery{.receipt = "nonsense"}).IsInvalidArgument());
}

TEST(FakeDownstream, AKeyIsDoneOnceAndReplayedAKeylessCallEveryTime) {
  TempDir dir;
  FakeDownstream d(dir.File("d.db"));
  auto a = d.Call("k1", "charge 5");
  auto b = d.Call("k1", "charge 5");
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ(*a, *b);
  EXPECT_TRUE(d.Call("k1", "charge 6").status().IsConflict());
  auto n1 = d.Call("", "charge 5");
  auto n2 = d.Call("", "charge 5");
  ASSERT_OK(n1);
  EXPECT_NE(*n1, *n2);
  auto effects = d.Effects();
  ASSERT_OK(effects);
  EXPECT_EQ(*effects, (std::vector<std::string>{"charge 5 key=k1", "charge 5 key=none", "charge 5 key=none"}));
  d.Arm({.kind = FakeDownstream::Fault::Kind::kLoseResponse, .at = 1});
  auto lost = d.Call("k2", "refund 1");
  EXPECT_TRUE(lost.status().IsUnavailable());
  EXPECT_NE(lost.status().message().find("lost"), std::string::npos);
  EXPECT_EQ(d.Effects()->size(), 4u);  // the work was done
  ASSERT_OK(d.Call("k2", "refund 1"));
  EXPECT_EQ(d.Effects()->size(), 4u);  // and is not done again
  EXPECT_EQ(d.Calls()->size(), 6u);    // the refused call is not one
}

TEST(GtestAssertions, ExpectOkSaysTheStatusOfWhatFailed) {
  Status bad = Status::NotFound("no such order");
  ::testing::AssertionResult a = internal::IsOk("bad", bad);
  EXPECT_FALSE(a);
  EXPECT_STREQ(a.message(), "bad is not OK: not_found: no such order");
  Result<int> r = Status::Busy("locked");
  EXPECT_STREQ(internal::IsOk("r", r).message(), "r is not OK: busy: locked");
  Result<int> good = 3;
  EXPECT_TRUE(internal::IsOk("good", good));
  EXPECT_OK(good);
  EXPECT_OK(Status::OK());
}

TEST(GtestAssertions, ExpectIdempotentFailsWithTheReport) {
  Harness harness({.schema = kSchema, .state_query = kState, .scenarios = {Scenario::kTwice}});
  Subject s{.name = "no-marker", .consumer = payments::IncrementWithoutMarker};
  ::testing::AssertionResult a = internal::Idempotent("harness", "s", "m", harness, s, payments::Messages(2));
  EXPECT_FALSE(a);
  EXPECT_NE(std::string(a.message()).find("[twice] delivery 2 of \"pay-0\""), std::string::npos) << a.message();
}

// ---- On PostgreSQL, started by the kit itself.

class HarnessOnPostgres : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto pg = TempPostgres::Start();
    ASSERT_OK(pg);  // idem's tests need the server: apt-get install postgresql
    pg_ = pg->release();
  }
  static void TearDownTestSuite() {
    delete pg_;
    pg_ = nullptr;
  }
  static TempPostgres* pg_;
};
TempPostgres* HarnessOnPostgres::pg_ = nullptr;

TEST_F(HarnessOnPostgres, TheCorrectHandlersAreIdempotent) {
  Harness harness(PaymentsOptions(pg_->url()));
  auto report =
      harness.Run(HandlerSubject("charge", [](Context&) { return payments::Charge(); }), payments::Messages(5));
  ASSERT_OK(report);
  EXPECT_TRUE(report->ok()) << *report;
  EXPECT_EQ(report->store_kind, "postgres");
  EXPECT_TRUE(report->notes.empty()) << *report;  // what SQLite cannot show, PostgreSQL does
  Subject s{.name = "charge-card", .call_first = [](Context& c) { return payments::ChargeCard(c, true); }};
  auto card = harness.Run(s, payments::Messages(4));
  ASSERT_OK(card);
  EXPECT_TRUE(card->ok()) << *card;
}

// A CallFirst whose call reads the balance first, in a read-only
// transaction of its own on ctx.store(), while its claim is held. That
// transaction is the handler's, not the Inbox's: no crash point is on it (a
// child stopped there would die holding a claim whose lease runs on the
// server's clock). `send_key` false: the same with a keyless call (wrong).
idem::CallFirst ChargeCardReadingTheBalance(Context& ctx, bool send_key) {
  Store* store = &ctx.store();
  FakeDownstream* provider = &ctx.downstream();
  return idem::CallFirst(
      ctx.claims(),
      [store, provider, send_key](Calls& calls, const Message& m) -> Status {
        payments::Payment p = payments::Parse(m);
        return calls
            .Once("charge",
                  [&](const std::string& key) -> Result<std::string> {
                    IDEM_ASSIGN_OR_RETURN(auto tx, store->Begin());
                    IDEM_ASSIGN_OR_RETURN(auto rows,
                                          tx->Query("SELECT cents FROM balances WHERE account = $1", {p.account}));
                    tx->Rollback();
                    if (rows.rows.empty()) return Status::Rejected("no account " + p.account);
                    return provider->Call(send_key ? key : "", "charge " + p.account + " " + std::to_string(p.cents));
                  })
            .status();
      },
      payments::ChargeCard(ctx, send_key).apply());  // the same apply
}

TEST_F(HarnessOnPostgres, ACallFirstReadingInItsCallsPartIsIdempotentAndAKeylessOneIsStillCaught) {
  Harness harness(PaymentsOptions(pg_->url()));
  Subject right{.name = "charge-reading",
                .call_first = [](Context& c) { return ChargeCardReadingTheBalance(c, true); }};
  auto report = harness.Run(right, payments::Messages(4));
  ASSERT_OK(report);
  EXPECT_TRUE(report->ok()) << *report;
  EXPECT_EQ(report->ToString().find("never acknowledged"), std::string::npos) << *report;
  Subject wrong{.name = "keyless-reading",
                .call_first = [](Context& c) { return ChargeCardReadingTheBalance(c, false); }};
  auto caught = harness.Run(wrong, payments::Messages(4));
  ASSERT_OK(caught);
  EXPECT_TRUE(Broken(*caught).count(Scenario::kLostResponse)) << *caught;
  EXPECT_EQ(caught->ToString().find("never acknowledged"), std::string::npos) << *caught;
}

// Wrong: the calls part adds to the balance itself, in a transaction of
// its own on ctx.store(), outside the apply. Those transactions reach no
// crash point, but the Inbox's do: a crash once the calls are done, before
// the apply commits (from inbox.before_marker on), makes the redelivery add
// again.
TEST(Harness, ACallFirstWritingThroughTheStoreInItsCallsPartIsStillCaught) {
  Harness harness(PaymentsOptions());
  Subject s{
      .name = "calls-part-writes", .call_first = [](Context& c) {
        Store* store = &c.store();
        return idem::CallFirst(
            c.claims(),
            [store](Calls&, const Message& m) -> Status {
              payments::Payment p = payments::Parse(m);
              IDEM_ASSIGN_OR_RETURN(auto tx, store->Begin());  // WRONG: commits apart from the marker
              IDEM_RETURN_IF_ERROR(
                  tx->Exec("UPDATE balances SET cents = cents + $1 WHERE account = $2", {p.cents, p.account}).status());
              return tx->Commit();
            },
            [](Transaction& tx, const Message& m, const Calls&) -> Status {
              payments::Payment p = payments::Parse(m);
              return tx
                  .Exec("INSERT INTO payments(message_id, account, cents) VALUES ($1, $2, $3)",
                        {m.id, p.account, p.cents})
                  .status();
            });
      }};
  auto report = harness.Run(s, payments::Messages(3));
  ASSERT_OK(report);
  const Failure* crash = FailureOf(*report, Scenario::kCrash);
  ASSERT_NE(crash, nullptr) << *report;
  EXPECT_NE(crash->what.find("killed at inbox.before_marker"), std::string::npos) << crash->what;
  EXPECT_EQ(crash->message_id, "pay-0");
}

// The same on SQLite (it passed there before: the claims' leases run on the
// kit's clock).
TEST(Harness, ACallFirstReadingInItsCallsPartIsIdempotentOnSqlite) {
  Harness harness(PaymentsOptions());
  Subject right{.name = "charge-reading",
                .call_first = [](Context& c) { return ChargeCardReadingTheBalance(c, true); }};
  auto report = harness.Run(right, payments::Messages(4));
  ASSERT_OK(report);
  EXPECT_TRUE(report->ok()) << *report;
}

TEST_F(HarnessOnPostgres, ASecondConnectionIsCaughtByACrashAfterTheWork) {
  Harness harness(PaymentsOptions(pg_->url()));
  auto report =
      harness.Run(HandlerSubject("second-connection", payments::ChargeThroughSecondConnection), payments::Messages(6));
  ASSERT_OK(report);
  const Failure* crash = FailureOf(*report, Scenario::kCrash);
  ASSERT_NE(crash, nullptr) << *report;
  EXPECT_NE(crash->what.find("inbox.after_work"), std::string::npos) << crash->what;
  EXPECT_FALSE(Broken(*report).count(Scenario::kTwice)) << *report;
}

TEST_F(HarnessOnPostgres, AReadItShouldHaveLockedIsCaughtByConcurrentMessages) {
  Harness harness(PaymentsOptions(pg_->url()));
  auto report = harness.Run(HandlerSubject("read-then-write", [](Context&) { return payments::ChargeReadThenWrite(); }),
                            payments::Messages(6));
  ASSERT_OK(report);
  EXPECT_TRUE(Broken(*report).count(Scenario::kConcurrent)) << *report;
  EXPECT_FALSE(Broken(*report).count(Scenario::kTwice)) << *report;
}

TEST_F(HarnessOnPostgres, AnEffectOutsideTheTransactionAndAKeylessCallAreCaught) {
  Harness ledger(LedgerOptions(pg_->url()));
  auto a = ledger.Run(HandlerSubject("outside-ledger", payments::ChargeWithOutsideLedger), payments::Messages(3));
  ASSERT_OK(a);
  EXPECT_TRUE(Broken(*a).count(Scenario::kCrash)) << *a;
  Harness harness(PaymentsOptions(pg_->url()));
  Subject s{.name = "no-key", .call_first = [](Context& c) { return payments::ChargeCard(c, false); }};
  auto b = harness.Run(s, payments::Messages(3));
  ASSERT_OK(b);
  EXPECT_TRUE(Broken(*b).count(Scenario::kLostResponse)) << *b;
}

}  // namespace
}  // namespace idem::testing
