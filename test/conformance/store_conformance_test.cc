// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The store conformance suite: every store runs these unchanged. Every test
// delivers every message at least twice.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "idem/claims.h"
#include "idem/inbox.h"
#include "idem/sqlite/store.h"
#include "idem/testing/kill_points.h"
#include "idem/versioned.h"
#include "util/store_conformance.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

// Claims inside a transaction (the HTTP middleware's transactional routes),
// many at once: each is answered as the one-key call would be, and the
// records commit or roll back with the transaction. Every key is claimed at
// least twice.
TEST_P(StoreConformance, ManyClaimsInsideATransactionCommitAndRollBackWithIt) {
  ClaimStore* claims = store_->claim_store();
  ASSERT_NE(claims, nullptr) << "every SQL store keeps claims";
  using Kind = ClaimOutcome::Kind;
  auto req = [](std::string key, std::string_view body = "body") {
    return ClaimRequest{
        .scope = "charges", .key = std::move(key), .fingerprint = FingerprintOf(body), .lease_ms = 30'000};
  };
  auto complete_all = [](StoreTransaction& tx, const std::vector<ClaimToken>& tokens) {
    std::vector<std::string> results;
    for (const ClaimToken& t : tokens) results.push_back("result of " + t.key);
    std::vector<Completion> done;
    for (size_t i = 0; i < tokens.size(); ++i) done.push_back(Completion{&tokens[i], results[i]});
    return tx.CompleteManyInTransaction(done, 60'000);
  };
  int64_t last_fence = 0;
  // 1. Claimed, completed, rolled back: nothing stays. The same key twice in
  //    one call: the second finds the first in progress.
  {
    auto tx = store_->Begin();
    ASSERT_OK(tx);
    std::vector<ClaimRequest> reqs = {req("k1"), req("k2"), req("k1")};
    auto got = (*tx)->ClaimManyInTransaction(reqs);
    ASSERT_EQ(got.size(), 3u);
    for (auto& g : got) ASSERT_OK(g);
    EXPECT_EQ(got[0]->kind, Kind::kStarted);
    EXPECT_EQ(got[1]->kind, Kind::kStarted);
    EXPECT_EQ(got[2]->kind, Kind::kInProgress);
    for (const Status& s : complete_all(**tx, {got[0]->token, got[1]->token})) EXPECT_TRUE(s.ok()) << s;
    (*tx)->Rollback();
  }
  for (const char* k : {"k1", "k2"}) {
    auto rec = claims->FindClaim("charges", k);
    ASSERT_OK(rec);
    EXPECT_FALSE(rec->has_value()) << k << " survived the rollback";
  }
  // 2. Again, committed this time.
  {
    auto tx = store_->Begin();
    ASSERT_OK(tx);
    std::vector<ClaimRequest> reqs = {req("k1"), req("k2")};
    auto got = (*tx)->ClaimManyInTransaction(reqs);
    ASSERT_EQ(got.size(), 2u);
    for (auto& g : got) {
      ASSERT_OK(g);
      EXPECT_EQ(g->kind, Kind::kStarted);
    }
    EXPECT_NE(got[0]->token.fence, got[1]->token.fence) << "two claims with one fence";
    last_fence = std::max(got[0]->token.fence, got[1]->token.fence);
    for (const Status& s : complete_all(**tx, {got[0]->token, got[1]->token})) EXPECT_TRUE(s.ok()) << s;
    ASSERT_OK((*tx)->Commit());
  }
  // 3. A replay, a conflict and a new key in one call; a completion with a
  //    token that does not hold its key fails.
  {
    auto tx = store_->Begin();
    ASSERT_OK(tx);
    std::vector<ClaimRequest> reqs = {req("k1"), req("k2", "another body"), req("k3")};
    auto got = (*tx)->ClaimManyInTransaction(reqs);
    ASSERT_EQ(got.size(), 3u);
    for (auto& g : got) ASSERT_OK(g);
    EXPECT_EQ(got[0]->kind, Kind::kCompleted);
    EXPECT_EQ(got[0]->result, "result of k1");
    EXPECT_EQ(got[1]->kind, Kind::kConflict);
    ASSERT_EQ(got[2]->kind, Kind::kStarted);
    EXPECT_GT(got[2]->token.fence, last_fence) << "a later claim's fence must be larger";
    ClaimToken stale = got[2]->token;
    stale.fence += 1000;
    auto done = complete_all(**tx, {got[2]->token, stale});
    ASSERT_EQ(done.size(), 2u);
    EXPECT_TRUE(done[0].ok()) << done[0];
    EXPECT_EQ(done[1].code(), Code::kLeaseLost) << done[1];
    (*tx)->Rollback();
  }
  auto k3 = claims->FindClaim("charges", "k3");
  ASSERT_OK(k3);
  EXPECT_FALSE(k3->has_value());
  {  // k3 again: rolled back, so it starts afresh
    auto tx = store_->Begin();
    ASSERT_OK(tx);
    std::vector<ClaimRequest> reqs = {req("k3")};
    auto got = (*tx)->ClaimManyInTransaction(reqs);
    ASSERT_EQ(got.size(), 1u);
    ASSERT_TRUE(got[0].ok()) << got[0].status();
    EXPECT_EQ(got[0]->kind, Kind::kStarted);
    (*tx)->Rollback();
  }
  auto k1 = claims->FindClaim("charges", "k1");
  ASSERT_OK(k1);
  ASSERT_TRUE(k1->has_value());
  EXPECT_EQ((*k1)->state, ClaimRecord::State::kCompleted);
}

// Transaction::InsertLater: rows queued for one statement go in together
// before the next statement (which sees them) or at the commit; a rollback
// takes them; their error is the error of the statement they went with.
TEST_P(SqlStoreConformance, InsertLaterRowsGoInBeforeTheNextStatementOrTheCommit) {
  constexpr const char* kLater = "INSERT INTO payments(message_id, cents) VALUES ($1, $2)";
  auto count_in = [](Transaction& tx) {
    auto rows = tx.Query("SELECT count(*) FROM payments");
    EXPECT_OK(rows);
    return rows.ok() ? rows->rows[0][0].AsInt() : -1;
  };
  for (int round = 0; round < 2; ++round) {  // every row delivered twice: the second round adds as many again
    auto tx = store_->Begin();
    ASSERT_OK(tx);
    for (int i = 0; i < 5; ++i) ASSERT_OK((*tx)->InsertLater(kLater, {"later-" + std::to_string(i), 100 + i}));
    EXPECT_EQ(count_in(**tx), 6 * round + 5) << "the next statement sees the queued rows";
    ASSERT_OK((*tx)->InsertLater(kLater, {"at-commit", 7}));
    ASSERT_OK((*tx)->Commit());
  }
  EXPECT_EQ(Paid(*store_), 12);
  EXPECT_EQ(Paid(*store_, "later-3"), 2);
  {
    auto tx = store_->Begin();
    ASSERT_OK(tx);
    ASSERT_OK((*tx)->InsertLater(kLater, {"rolled-back", 1}));
    (*tx)->Rollback();
  }
  EXPECT_EQ(Paid(*store_, "rolled-back"), 0);
  // Refused at once: no VALUES tuple, RETURNING, a row of another width.
  auto tx = store_->Begin();
  ASSERT_OK(tx);
  EXPECT_EQ((*tx)->InsertLater("INSERT INTO payments SELECT 'x', 1", {1}).code(), Code::kInvalidArgument);
  EXPECT_EQ((*tx)->InsertLater(std::string(kLater) + " RETURNING cents", {"r", 1}).code(), Code::kInvalidArgument);
  ASSERT_OK((*tx)->InsertLater(kLater, {"w", 1}));
  EXPECT_EQ((*tx)->InsertLater(kLater, {"w"}).code(), Code::kInvalidArgument);
  // An insert that fails (a NULL in a NOT NULL column) fails the commit: nothing of the transaction stays.
  ASSERT_OK((*tx)->InsertLater(kLater, {"bad", Value()}));
  EXPECT_FALSE((*tx)->Commit().ok());
  EXPECT_EQ(Paid(*store_, "w"), 0);
  EXPECT_EQ(Paid(*store_), 12);
  // ... and the statement it went with, which says why.
  auto tx2 = store_->Begin();
  ASSERT_OK(tx2);
  ASSERT_OK((*tx2)->InsertLater(kLater, {"bad", Value()}));
  auto after = (*tx2)->Query("SELECT count(*) FROM payments");
  ASSERT_FALSE(after.ok());
  std::string why(after.status().message());
  std::transform(why.begin(), why.end(), why.begin(), [](unsigned char c) { return std::tolower(c); });
  EXPECT_NE(why.find("null"), std::string::npos) << after.status();
  (*tx2)->Rollback();
  EXPECT_EQ(Paid(*store_), 12);
}

// In a batch, a handler's later insert that fails is its own message's
// failure, not the next message's.
TEST_P(SqlStoreConformance, InsertLaterErrorsInABatchAreTheirOwnMessages) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  const Handler h = [](Transaction& tx, const Message& m) -> Status {
    const Value cents = m.payload == "null" ? Value() : Value(int64_t{4000});
    return tx.InsertLater("INSERT INTO payments(message_id, cents) VALUES ($1, $2)", {m.id, cents});
  };
  std::vector<Message> batch = {Msg("a"), Msg("bad", "null"), Msg("c"), Msg("d")};
  for (int round = 0; round < 2; ++round) {
    std::vector<Outcome> out = inbox.HandleBatch(batch, h);
    ASSERT_EQ(out.size(), 4u);
    for (size_t i : {0u, 2u, 3u})
      EXPECT_EQ(out[i].kind, round == 0 ? Outcome::Kind::kApplied : Outcome::Kind::kDuplicate) << out[i].ToString();
    EXPECT_EQ(out[1].kind, Outcome::Kind::kFailed) << out[1].ToString();
  }
  EXPECT_EQ(Paid(*store_), 3);
  EXPECT_EQ(Paid(*store_, "bad"), 0);
}

TEST_P(StoreConformance, EveryMessageDeliveredTwiceHasOneEffect) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 20; ++i) {
      Outcome o = inbox.Handle(Msg("m-" + std::to_string(i)), Charge());
      EXPECT_EQ(o.kind, round == 0 ? Outcome::Kind::kApplied : Outcome::Kind::kDuplicate) << o.ToString();
      EXPECT_TRUE(o.ShouldAck());
    }
  }
  EXPECT_EQ(Paid(*store_), 20);
  InboxCounters c = inbox.counters();
  EXPECT_EQ(c.applied, 20u);
  EXPECT_EQ(c.duplicates, 20u);
  auto n = store_->CountMarkers("payments");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 20);
}

TEST_P(StoreConformance, FailingHandlerLeavesNothingAndRedeliveryApplies) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  bool fail = true;
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    IDEM_RETURN_IF_ERROR(Charge()(tx, m));  // a write that must be undone
    if (fail) return Status::Unavailable("provider down");
    return Status::OK();
  };
  Outcome first = inbox.Handle(Msg("m-7f3"), h);
  EXPECT_EQ(first.kind, Outcome::Kind::kFailed);
  EXPECT_EQ(first.status.code(), Code::kHandlerFailed);
  EXPECT_NE(first.status.message().find("provider down"), std::string::npos);
  EXPECT_FALSE(first.ShouldAck());
  EXPECT_EQ(Paid(*store_), 0);
  auto marker = store_->FindMarker("payments", "m-7f3");
  ASSERT_TRUE(marker.ok());
  EXPECT_FALSE(marker->has_value());

  fail = false;
  EXPECT_EQ(inbox.Handle(Msg("m-7f3"), h).kind, Outcome::Kind::kApplied);
  EXPECT_EQ(inbox.Handle(Msg("m-7f3"), h).kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(Paid(*store_), 1);
  EXPECT_EQ(inbox.counters().failures, 1u);
}

// A negative list limit is refused, not read as "all" (SQL's LIMIT -1).
TEST_P(StoreConformance, ANegativeListLimitIsRefused) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(inbox.Handle(Msg("m-list"), Charge()).ShouldAck());
  EXPECT_EQ(store_->ListMarkers("", -1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(store_->ListDeadLetters("", -1).status().code(), Code::kInvalidArgument);
  auto one = store_->ListMarkers("", 5);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->size(), 1u);
}

// An empty handler is the caller's mistake: refused, nothing counted as the
// message's failure, nothing stored.
TEST_P(StoreConformance, AnEmptyHandlerIsRefused) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  for (int i = 0; i < 2; ++i) {
    Outcome o = inbox.Handle(Msg("m-nohandler"), Handler{});
    EXPECT_EQ(o.kind, Outcome::Kind::kFailed);
    EXPECT_EQ(o.status.code(), Code::kInvalidArgument) << o.status;
  }
  EXPECT_EQ(inbox.counters().failures, 0u);
  auto marker = store_->FindMarker("payments", "m-nohandler");
  ASSERT_TRUE(marker.ok());
  EXPECT_FALSE(marker->has_value());
}

// A handler cannot end the transaction idem gave it: the marker and the
// effect commit together or not at all. Savepoints stay allowed.
TEST_P(SqlStoreConformance, AHandlerCannotEndIdemsTransaction) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  const char* const kEnders[] = {
      "COMMIT", "ROLLBACK", "begin", "END", "rollback work", "/* x */ Commit", "-- note\nROLLBACK TRANSACTION"};
  for (const char* ender : kEnders) {
    for (int i = 0; i < 2; ++i) {  // every message delivered twice
      std::string refused;
      Handler h = [&](Transaction& tx, const Message& m) -> Status {
        IDEM_RETURN_IF_ERROR(Charge()(tx, m));
        Status s = tx.Exec(ender).status();
        refused = s.ToString();
        return s;  // a handler passing the error on
      };
      Outcome o = inbox.Handle(Msg("m-end"), h);
      EXPECT_EQ(o.kind, Outcome::Kind::kFailed) << ender;
      EXPECT_NE(refused.find("inside idem's transaction"), std::string::npos) << ender << ": " << refused;
      EXPECT_EQ(Paid(*store_), 0) << ender;
      auto marker = store_->FindMarker("payments", "m-end");
      ASSERT_TRUE(marker.ok());
      EXPECT_FALSE(marker->has_value()) << ender;
    }
  }
  // Savepoints inside the work are fine.
  Handler with_savepoint = [&](Transaction& tx, const Message& m) -> Status {
    IDEM_RETURN_IF_ERROR(tx.Exec("SAVEPOINT step").status());
    IDEM_RETURN_IF_ERROR(Charge()(tx, m));
    IDEM_RETURN_IF_ERROR(tx.Exec("ROLLBACK TO SAVEPOINT step").status());  // undo the first try
    IDEM_RETURN_IF_ERROR(Charge()(tx, m));
    return tx.Exec("RELEASE SAVEPOINT step").status();
  };
  EXPECT_EQ(inbox.Handle(Msg("m-end"), with_savepoint).kind, Outcome::Kind::kApplied);
  EXPECT_EQ(inbox.Handle(Msg("m-end"), with_savepoint).kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(Paid(*store_), 1);
}

TEST_P(StoreConformance, ThrowingHandlerRollsBackAndSaysSo) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  int calls = 0;
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    IDEM_RETURN_IF_ERROR(Charge()(tx, m));
    if (++calls == 1) throw std::runtime_error("card declined by test");
    return Status::OK();
  };
  Outcome o = inbox.Handle(Msg("m-1"), h);
  EXPECT_EQ(o.kind, Outcome::Kind::kFailed);
  EXPECT_NE(o.status.message().find("card declined by test"), std::string::npos);
  EXPECT_EQ(Paid(*store_), 0);
  EXPECT_EQ(inbox.Handle(Msg("m-1"), h).kind, Outcome::Kind::kApplied);
  EXPECT_EQ(inbox.Handle(Msg("m-1"), h).kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(Paid(*store_), 1);
}

TEST_P(StoreConformance, IdReusedForDifferentPayloadIsAConflictNeverSilent) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  EXPECT_EQ(inbox.Handle(Msg("m-1", "4000"), Charge()).kind, Outcome::Kind::kApplied);
  EXPECT_EQ(inbox.Handle(Msg("m-1", "4000"), Charge()).kind, Outcome::Kind::kDuplicate);
  Outcome o = inbox.Handle(Msg("m-1", "9900"), Charge());
  EXPECT_EQ(o.kind, Outcome::Kind::kConflict);
  EXPECT_EQ(o.stored_fingerprint, FingerprintOf("4000"));
  EXPECT_EQ(o.incoming_fingerprint, FingerprintOf("9900"));
  EXPECT_TRUE(o.ShouldAck());
  EXPECT_EQ(inbox.Handle(Msg("m-1", "9900"), Charge()).kind, Outcome::Kind::kConflict);
  EXPECT_EQ(Paid(*store_), 1);
  EXPECT_EQ(inbox.counters().conflicts, 2u);
  auto dead = store_->ListDeadLetters("payments", 10);
  ASSERT_OK(dead);
  ASSERT_EQ(dead->size(), 1u);
  EXPECT_EQ((*dead)[0].reason, "conflict");
  EXPECT_NE((*dead)[0].error.find(ToHex(FingerprintOf("4000"))), std::string::npos);
  EXPECT_EQ((*dead)[0].payload, "9900");
}

TEST_P(StoreConformance, IdsAreByteExactAndValidated) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  // The business row names the message by the hex of its id's hash: a text
  // column cannot hold every byte (PostgreSQL text has no NUL), the marker can.
  Handler charge = [pay = GetParam().payments.pay](Transaction& tx, const Message& m) -> Status {
    return pay(tx, ToHex(FingerprintOf(m.id)), 1);
  };
  std::string with_nul("m\0x", 3);
  std::string longest(kMaxIdBytes, 'z');
  for (int round = 0; round < 2; ++round) {
    Outcome::Kind want = round == 0 ? Outcome::Kind::kApplied : Outcome::Kind::kDuplicate;
    EXPECT_EQ(inbox.Handle(Msg("m-7f3"), charge).kind, want);
    EXPECT_EQ(inbox.Handle(Msg("M-7F3"), charge).kind, want);
    EXPECT_EQ(inbox.Handle(Msg(std::string("m")), charge).kind, want);
    EXPECT_EQ(inbox.Handle(Msg(with_nul), charge).kind, want);
    EXPECT_EQ(inbox.Handle(Msg(longest), charge).kind, want);
  }
  EXPECT_EQ(Paid(*store_), 5);
  auto found = store_->FindMarker("payments", with_nul);
  ASSERT_TRUE(found.ok() && found->has_value());
  EXPECT_EQ((*found)->id, with_nul);

  for (const std::string& bad : {std::string(), std::string(kMaxIdBytes + 1, 'z')}) {
    for (int round = 0; round < 2; ++round) {
      Outcome o = inbox.Handle(Msg(bad, "1"), charge);
      EXPECT_EQ(o.kind, Outcome::Kind::kFailed);
      EXPECT_EQ(o.status.code(), Code::kInvalidArgument);
      EXPECT_NE(o.status.message().find("message id"), std::string::npos) << o.status;
    }
  }
  EXPECT_EQ(Paid(*store_), 5);
}

TEST_P(StoreConformance, ConsumersSharingADatabaseEachHandleEveryMessage) {
  auto a_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& a = *a_owned;
  auto b_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "emails", .env = &env_});
  Inbox& b = *b_owned;
  for (int round = 0; round < 2; ++round) {
    EXPECT_EQ(a.Handle(Msg("m-1"), Charge()).applied(), round == 0);
    EXPECT_EQ(b.Handle(Msg("m-1"), Charge()).applied(), round == 0);
  }
  EXPECT_EQ(Paid(*store_, "m-1"), 2);
}

TEST_P(StoreConformance, BatchDetectsDuplicatesInsideAndAgainstTheTable) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  ASSERT_EQ(inbox.Handle(Msg("old"), Charge()).kind, Outcome::Kind::kApplied);
  std::vector<Message> batch = {Msg("a"), Msg("b"), Msg("a"), Msg("old"), Msg("c"), Msg("b"), Msg("a", "9")};
  std::vector<Outcome> out = inbox.HandleBatch(batch, Charge());
  ASSERT_EQ(out.size(), batch.size());
  using K = Outcome::Kind;
  std::vector<K> want = {K::kApplied, K::kApplied,   K::kDuplicate, K::kDuplicate,
                         K::kApplied, K::kDuplicate, K::kConflict};
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i].kind, want[i]) << i << " " << out[i].ToString();
  // The whole batch again: nothing new.
  for (const Outcome& o : inbox.HandleBatch(batch, Charge())) EXPECT_NE(o.kind, K::kApplied);
  EXPECT_EQ(Paid(*store_), 4);
}

TEST_P(StoreConformance, FailingMessageInABatchDoesNotRollBackTheOthers) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  bool fail_bad = true;
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    IDEM_RETURN_IF_ERROR(Charge()(tx, m));
    if (m.id == "bad" && fail_bad) return Status::InvalidArgument("bad amount");
    return Status::OK();
  };
  std::vector<Message> batch = {Msg("a"), Msg("bad"), Msg("c")};
  std::vector<Outcome> out = inbox.HandleBatch(batch, h);
  EXPECT_EQ(out[0].kind, Outcome::Kind::kApplied);
  EXPECT_EQ(out[1].kind, Outcome::Kind::kFailed);
  EXPECT_EQ(out[1].status.code(), Code::kHandlerFailed);
  EXPECT_EQ(out[2].kind, Outcome::Kind::kApplied);
  EXPECT_EQ(Paid(*store_), 2);
  EXPECT_EQ(Paid(*store_, "bad"), 0);
  auto m = store_->FindMarker("payments", "bad");
  ASSERT_TRUE(m.ok());
  EXPECT_FALSE(m->has_value());
  fail_bad = false;
  out = inbox.HandleBatch(batch, h);
  EXPECT_EQ(out[0].kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(out[1].kind, Outcome::Kind::kApplied);
  EXPECT_EQ(out[2].kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(Paid(*store_), 3);
}

TEST_P(StoreConformance, CopyOfAFailedMessageInTheSameBatchIsNotADuplicate) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  int calls = 0;
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    IDEM_RETURN_IF_ERROR(Charge()(tx, m));
    if (m.id == "x" && ++calls == 1) return Status::Unavailable("first try fails");
    return Status::OK();
  };
  std::vector<Message> batch = {Msg("x"), Msg("y"), Msg("x")};
  std::vector<Outcome> out = inbox.HandleBatch(batch, h);
  EXPECT_EQ(out[0].kind, Outcome::Kind::kFailed);
  EXPECT_EQ(out[1].kind, Outcome::Kind::kApplied);
  // Acking this copy as a duplicate would lose x: its effect was rolled back.
  EXPECT_EQ(out[2].kind, Outcome::Kind::kFailed);
  EXPECT_FALSE(out[2].ShouldAck());
  EXPECT_EQ(Paid(*store_, "x"), 0);
  out = inbox.HandleBatch(batch, h);
  EXPECT_EQ(out[0].kind, Outcome::Kind::kApplied);
  EXPECT_EQ(out[1].kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(out[2].kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(Paid(*store_, "x"), 1);
  EXPECT_EQ(Paid(*store_), 2);
}

TEST_P(StoreConformance, ThreadsRacingOnOneMessageApplyItOnce) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  for (int msg = 0; msg < 10; ++msg) {
    std::atomic<int> applied{0}, duplicates{0}, failed{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, msg] {
        while (!go.load()) std::this_thread::yield();
        Outcome o = inbox.Handle(Msg("race-" + std::to_string(msg)), Charge());
        (o.applied() ? applied : o.kind == Outcome::Kind::kDuplicate ? duplicates : failed).fetch_add(1);
      });
    }
    go = true;
    for (auto& t : threads) t.join();
    EXPECT_EQ(applied.load(), 1);
    EXPECT_EQ(duplicates.load(), 3);
    EXPECT_EQ(failed.load(), 0);
  }
  EXPECT_EQ(Paid(*store_), 10);
}

// Two processes handle every message (each delivered to both = twice): the
// unique key lets exactly one of them apply each.
TEST_P(StoreConformance, TwoProcessesRacingApplyEachMessageOnce) {
  constexpr int kMessages = 150;
  store_.reset();  // no connection crosses the fork
  auto child = [&]() -> int {
    auto store = GetParam().open(dir_, Env::Default());
    if (!store.ok()) return 2;
    auto inbox_owned = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "payments"});
    Inbox& inbox = *inbox_owned;
    int applied = 0;
    for (int i = 0; i < kMessages; ++i) {
      Outcome o = inbox.Handle(Msg("m-" + std::to_string(i)), Charge());
      if (o.kind == Outcome::Kind::kFailed) return 3;
      applied += o.applied();
    }
    std::ofstream(dir_.File("applied-" + std::to_string(::getpid()))) << applied;
    return 0;
  };
  pid_t a = ::fork();
  if (a == 0) ::_exit(child());
  pid_t b = ::fork();
  if (b == 0) ::_exit(child());
  int sa = 0, sb = 0;
  ::waitpid(a, &sa, 0);
  ::waitpid(b, &sb, 0);
  ASSERT_TRUE(WIFEXITED(sa) && WEXITSTATUS(sa) == 0) << sa;
  ASSERT_TRUE(WIFEXITED(sb) && WEXITSTATUS(sb) == 0) << sb;
  int total = 0;
  for (pid_t p : {a, b}) {
    int n = -1;
    std::ifstream(dir_.File("applied-" + std::to_string(p))) >> n;
    total += n;
  }
  EXPECT_EQ(total, kMessages);
  auto store = GetParam().open(dir_, &env_);
  ASSERT_OK(store);
  EXPECT_EQ(Paid(**store), kMessages);
}

TEST_P(StoreConformance, FailuresAreCountedOutsideTheTransactionAndDeadLettered) {
  Message m = Msg("poison", "bad");
  for (int i = 1; i <= 3; ++i) {
    FailureRecord rec{"payments", &m, "boom " + std::to_string(i), 3, env_.NowMs()};
    auto c = store_->RecordFailure(rec);
    ASSERT_OK(c);
    EXPECT_EQ(c->attempts, i);
    EXPECT_EQ(c->dead_lettered, i == 3);
  }
  auto dead = store_->ListDeadLetters("payments", 10);
  ASSERT_TRUE(dead.ok());
  ASSERT_EQ(dead->size(), 1u);
  EXPECT_EQ((*dead)[0].reason, "failed");
  EXPECT_EQ((*dead)[0].attempts, 3);
  EXPECT_EQ((*dead)[0].error, "boom 3");
  EXPECT_EQ((*dead)[0].payload, "bad");
  ASSERT_TRUE(store_->ClearFailures("payments", "poison").ok());
  FailureRecord again{"payments", &m, "boom", 3, env_.NowMs()};
  auto c = store_->RecordFailure(again);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->attempts, 1);
}

TEST_P(StoreConformance, AFailureOfAnAppliedMessageIsNotCounted) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  Message m = Msg("m-1");
  FailureRecord before{"payments", &m, "slow copy failed", 2, env_.NowMs()};
  ASSERT_EQ(store_->RecordFailure(before)->attempts, 1);
  ASSERT_TRUE(inbox.Handle(m, Charge()).applied());
  // A racing copy whose lease ran out fails after the message was applied:
  // nothing is counted, the old count goes, nothing is dead-lettered.
  auto c = store_->RecordFailure(before);
  ASSERT_OK(c);
  EXPECT_TRUE(c->already_applied);
  EXPECT_EQ(c->attempts, 0);
  EXPECT_FALSE(c->dead_lettered);
  EXPECT_TRUE(store_->ListDeadLetters("payments", 10)->empty());
  EXPECT_EQ(inbox.Handle(m, Charge()).kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(Paid(*store_), 1);
}

TEST_P(StoreConformance, PurgeDeletesOnlyOldMarkersInBatches) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  for (int i = 0; i < 25; ++i) ASSERT_TRUE(inbox.Handle(Msg("old-" + std::to_string(i)), Charge()).applied());
  env_.Advance(3'600'000);
  int64_t cut = env_.NowMs();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(inbox.Handle(Msg("new-" + std::to_string(i)), Charge()).applied());
  auto n = store_->Purge("payments", cut, 7);
  ASSERT_OK(n);
  EXPECT_EQ(*n, 25);
  EXPECT_EQ(*store_->CountMarkers("payments"), 5);
  // A purged id is forgotten: its late duplicate would apply again. That is
  // why retention must cover the longest redelivery.
  EXPECT_EQ(inbox.Handle(Msg("old-0"), Charge()).kind, Outcome::Kind::kApplied);
  EXPECT_EQ(inbox.Handle(Msg("new-0"), Charge()).kind, Outcome::Kind::kDuplicate);
  EXPECT_FALSE(store_->Purge("payments", cut, 0).ok());
}

// A purge paused between two batches (a stall, SIGSTOP) while consumers go
// on: when it resumes, it deletes only what its cut names. The markers
// committed during the pause are newer than the cut, and their ids sort
// after the old ones, so they lie in the windows the resumed purge still
// walks (SQLite walks by key): it skips them, and their redeliveries stay
// duplicates.
TEST_P(StoreConformance, APurgePausedBetweenBatchesDeletesOnlyWhatItsCutNames) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  for (int i = 0; i < 25; ++i) ASSERT_TRUE(inbox.Handle(Msg("old-" + std::to_string(i)), Charge()).applied());
  env_.Advance(3'600'000);
  const int64_t cut = env_.NowMs();
  std::mutex mu;
  std::condition_variable cv;
  bool paused = false, resume = false, done = false;
  ArmKillPoint("store.purge_batch", 1, [&] {
    std::unique_lock lock(mu);
    paused = true;
    cv.notify_all();
    cv.wait_for(lock, std::chrono::seconds(60), [&] { return resume; });
  });
  Result<int64_t> purged = Status::Internal("not run");
  std::thread purger([&] {
    purged = store_->Purge("payments", cut, 7);
    std::lock_guard lock(mu);
    done = true;
    cv.notify_all();
  });
  bool was_paused;
  {
    std::unique_lock lock(mu);
    cv.wait_for(lock, std::chrono::seconds(60), [&] { return paused || done; });
    was_paused = paused;
  }
  // Another consumer commits while the purge is paused.
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(inbox.Handle(Msg("paused-" + std::to_string(i)), Charge()).applied()) << i;
  {
    std::lock_guard lock(mu);
    resume = true;
  }
  cv.notify_all();
  purger.join();
  DisarmKillPoints();
  EXPECT_TRUE(was_paused) << "the purge never reached store.purge_batch";
  ASSERT_OK(purged);
  EXPECT_EQ(*purged, 25);
  EXPECT_EQ(*store_->CountMarkers("payments"), 5);
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(inbox.Handle(Msg("paused-" + std::to_string(i)), Charge()).kind, Outcome::Kind::kDuplicate) << i;
  EXPECT_EQ(Paid(*store_), 30);
}

TEST_P(SqlStoreConformance, HandlerSeesItsOwnWritesAndParameters) {
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  Handler h = [](Transaction& tx, const Message& m) -> Status {
    IDEM_RETURN_IF_ERROR(tx.Exec("INSERT INTO payments(message_id, cents) VALUES ($1, $2)", {m.id, 40}).status());
    auto rows = tx.Query("SELECT cents FROM payments WHERE message_id = $1", {m.id});
    if (!rows.ok()) return rows.status();
    if (rows->rows.size() != 1 || rows->rows[0][0].AsInt() != 40) return Status::Internal("own write not visible");
    if (tx.NativeHandle() == nullptr) return Status::Internal("no native handle");
    return Status::OK();
  };
  for (int i = 0; i < 2; ++i) inbox.Handle(Msg("m-1"), h);
  EXPECT_EQ(Paid(*store_), 1);
  EXPECT_EQ(inbox.counters().applied, 1u);
  // A SQL error is reported as a value, and the handler that returns it
  // rolls back (PostgreSQL aborts a transaction after a failed statement).
  Handler bad = [this](Transaction& tx, const Message& m) -> Status {
    IDEM_RETURN_IF_ERROR(Charge()(tx, m));
    return tx.Exec("INSERT INTO no_such_table VALUES (1)").status();
  };
  for (int i = 0; i < 2; ++i) {
    Outcome o = inbox.Handle(Msg("m-2"), bad);
    EXPECT_EQ(o.kind, Outcome::Kind::kFailed);
    EXPECT_NE(o.status.message().find("no_such_table"), std::string::npos) << o.status;
  }
  EXPECT_EQ(Paid(*store_), 1);
}

TEST_P(StoreConformance, SchemaIsVersioned) {
  auto info = store_->Schema();
  ASSERT_OK(info);
  EXPECT_GE(info->version, 1);
  bool markers = false;
  for (auto& s : info->statements) markers |= s.find("idem_markers") != std::string::npos;
  EXPECT_TRUE(markers);
}

TEST_P(SqlStoreConformance, ApplyIfNewerAppliesEachVersionOnceAndNeverAnOlderOne) {
  auto apply = [&](const std::string& key, int64_t version) -> bool {
    auto tx = store_->Begin();
    EXPECT_OK(tx);
    auto newer = ApplyIfNewer(**tx, "account", key, version);
    EXPECT_OK(newer);
    EXPECT_OK((*tx)->Commit());
    return newer.ok() && *newer;
  };
  // Every version delivered twice, and out of order.
  EXPECT_TRUE(apply("acc-1", 2));
  EXPECT_FALSE(apply("acc-1", 2)) << "the redelivery of version 2";
  EXPECT_FALSE(apply("acc-1", 1)) << "a late version 1";
  EXPECT_FALSE(apply("acc-1", 1));
  EXPECT_TRUE(apply("acc-1", 3));
  EXPECT_FALSE(apply("acc-1", 3));
  EXPECT_TRUE(apply("acc-2", 1)) << "keys are separate";
  EXPECT_FALSE(apply("acc-2", 1));
  // A rolled-back transaction records nothing.
  {
    auto tx = store_->Begin();
    ASSERT_TRUE(tx.ok());
    auto newer = ApplyIfNewer(**tx, "account", "acc-1", 9);
    ASSERT_TRUE(newer.ok() && *newer);
    (*tx)->Rollback();
  }
  EXPECT_TRUE(apply("acc-1", 4));
  auto tx = store_->Begin();
  ASSERT_TRUE(tx.ok());
  EXPECT_EQ(ApplyIfNewer(**tx, "", "k", 1).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace idem::testing
