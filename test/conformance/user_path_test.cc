// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The path the README recommends, as a user's service meets it: a Consumer
// and an Inbox on the store under test, fed by the embedded queue, with calls
// no transaction covers. Part of the store conformance suite (it runs on
// SQLite and PostgreSQL). The queue and the consumer read one FakeEnv, so
// backoffs, leases and the park horizon pass at once. Every message is
// published twice.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "idem/call_first.h"
#include "idem/claims.h"
#include "idem/consumer.h"
#include "idem/embedded/queue.h"
#include "idem/inbox.h"
#include "util/store_conformance.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

std::unique_ptr<embedded::Queue> OpenQueue(const TempDir& dir, Env* env) {
  auto q = embedded::Queue::Open(
      {.path = dir.File("queue.db"), .queue = "payments", .lease_ms = 60'000, .durable = false, .env = env});
  EXPECT_OK(q);
  return q.ok() ? std::move(*q) : nullptr;
}

void PublishTwice(embedded::Queue& q, const std::vector<Message>& messages) {
  for (int copy = 0; copy < 2; ++copy)
    for (const Message& m : messages) ASSERT_TRUE(q.Publish(m).ok());
}

std::vector<DeadLetter> Letters(Store& store, const std::string& reason) {
  auto all = store.ListDeadLetters("", 100);
  EXPECT_OK(all);
  std::vector<DeadLetter> out;
  if (all.ok())
    for (auto& l : *all)
      if (l.reason == reason) out.push_back(l);
  return out;
}

// A downstream service that counts calls per idempotency key and can answer
// "in progress" (as an Idempotency-Key server answers 409) for a while.
class Downstream {
 public:
  Result<std::string> Call(const std::string& key) {
    std::lock_guard<std::mutex> l(mu_);
    ++calls_[key];
    if (in_progress_answers_ > 0) {
      --in_progress_answers_;
      if (on_in_progress) on_in_progress();
      return Status::InProgress("409: a request with key " + key + " is being processed");
    }
    return "ch_" + std::to_string(++charges_[key]);
  }
  void AnswerInProgress(int n) { in_progress_answers_ = n; }
  int calls(const std::string& key) {
    std::lock_guard<std::mutex> l(mu_);
    return calls_[key];
  }
  int charges() {
    std::lock_guard<std::mutex> l(mu_);
    int n = 0;
    for (auto& [k, v] : charges_) n += v;
    return n;
  }
  std::function<void()> on_in_progress;

 private:
  std::mutex mu_;
  int in_progress_answers_ = 0;
  std::map<std::string, int> calls_, charges_;
};

// 1. A downstream "in progress" longer than the consumer's whole retry
// budget (max_attempts 2, max_deliveries 3) is not a failure: the message is
// redelivered, parked once it has been in progress for park_after_ms (listed
// with the step and key, still redelivered), and applied once when the
// downstream finishes; the parked entry is then gone. Nothing dead-lettered
// as failed, no failure counted.
TEST_P(StoreConformance, ADownstreamInProgressIsRedeliveredAndParkedNeverDeadLettered) {
  auto queue = OpenQueue(dir_, &env_);
  ASSERT_NE(queue, nullptr);
  auto claims_store = sqlite::Store::Open({.path = dir_.File("claims.db"), .env = &env_});
  ASSERT_OK(claims_store);
  auto claims_owned = MustOpen<Claims>(*(*claims_store)->claim_store(), Claims::Options{.env = &env_});
  Claims& claims = *claims_owned;
  Downstream provider;
  provider.AnswerInProgress(12);
  provider.on_in_progress = [&] { env_.Advance(10 * 60'000); };  // each answer: 10 minutes later
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  bool saw_parked = false;
  Handler charge = [&](Transaction& tx, const Message& m) -> Status {
    if (!Letters(*store_, "parked").empty()) saw_parked = true;
    auto r = CallOnce(claims, m, "charge", [&](const std::string& key) { return provider.Call(key); });
    if (!r.ok()) return r.status();
    return tx.Exec("INSERT INTO payments(message_id, cents) VALUES ($1, $2)", {m.id, 4000}).status();
  };
  PublishTwice(*queue, {Msg("order-1042")});
  auto consumer_owned = MustOpen<Consumer>(
      *queue, inbox, charge,
      Consumer::Options{
          .max_attempts = 2, .max_deliveries = 3, .stop_when_idle = true, .park_after_ms = 3'600'000, .env = &env_});
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  EXPECT_EQ(Charges(*store_, "order-1042"), 1);
  EXPECT_EQ(provider.charges(), 1);
  EXPECT_EQ(provider.calls(DownstreamKey(Msg("order-1042"), "charge")), 13) << "one key on every call";
  EXPECT_TRUE(saw_parked) << "in progress for 2 hours > park_after_ms: parked while it lasted";
  EXPECT_TRUE(Letters(*store_, "parked").empty()) << "applied: no longer parked";
  EXPECT_TRUE(Letters(*store_, "failed").empty());
  ConsumerStats st = consumer.stats();
  EXPECT_EQ(st.in_progress, 12u);
  EXPECT_EQ(st.parked, 1u);
  EXPECT_EQ(st.dead_lettered, 0u);
  InboxCounters c = inbox.counters();
  EXPECT_EQ(c.failures, 0u) << "in progress is not a failure";
  EXPECT_EQ(c.in_progress, 12u);
  EXPECT_EQ(c.applied, 1u);
  auto qs = queue->Stats();
  ASSERT_TRUE(qs.ok());
  EXPECT_EQ(qs->ready + qs->leased, 0);
}

// A parked message is listed with the dead letters while it is parked,
// naming its step and key (what `idem inspect` shows an operator), and a
// rejection afterwards replaces the entry.
TEST_P(StoreConformance, AParkedMessageNamesItsStepAndKey) {
  auto queue = OpenQueue(dir_, &env_);
  ASSERT_NE(queue, nullptr);
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  int calls = 0;
  std::vector<DeadLetter> parked_seen;
  Handler stuck = [&](Transaction&, const Message& m) -> Status {
    ++calls;
    if (calls == 3) parked_seen = Letters(*store_, "parked");
    if (calls == 4) return Status::Rejected("the operator refunded it");
    env_.Advance(3'600'000);
    return Status::InProgress("step 'charge' of message " + m.id + " (key " + DownstreamKey(m, "charge") +
                              ") is in progress downstream");
  };
  ASSERT_TRUE(queue->Publish(Msg("order-7")).ok());  // delivered four times
  auto consumer_owned = MustOpen<Consumer>(
      *queue, inbox, stuck, Consumer::Options{.stop_when_idle = true, .park_after_ms = 60'000, .env = &env_});
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  ASSERT_EQ(parked_seen.size(), 1u) << "parked on the second answer, an hour after the first";
  EXPECT_EQ(parked_seen[0].id, "order-7");
  EXPECT_NE(parked_seen[0].error.find("step 'charge'"), std::string::npos) << parked_seen[0].error;
  EXPECT_NE(parked_seen[0].error.find("order-7:charge"), std::string::npos) << parked_seen[0].error;
  EXPECT_EQ(consumer.stats().parked, 1u);
  EXPECT_TRUE(Letters(*store_, "parked").empty());
  ASSERT_EQ(Letters(*store_, "rejected").size(), 1u);
  EXPECT_EQ(calls, 4);
}

// 4. A permanent failure: dead-lettered after one attempt with its reason,
// counted, never retried (its copy is not handled either).
TEST_P(StoreConformance, ARejectedMessageIsDeadLetteredAtOnce) {
  auto queue = OpenQueue(dir_, &env_);
  ASSERT_NE(queue, nullptr);
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  std::atomic<int> runs{0};
  Handler parse = [&](Transaction& tx, const Message& m) -> Status {
    if (m.payload.front() != '{') {
      ++runs;
      return Status::Rejected("payload is not JSON: " + m.payload.substr(0, 10));
    }
    return ChargeHandler()(tx, m);
  };
  PublishTwice(*queue, {Msg("bad-1", "not json"), Msg("good-1", "{\"cents\":4000}")});
  auto consumer_owned = MustOpen<Consumer>(*queue, inbox, parse,
                                           Consumer::Options{.max_attempts = 5, .stop_when_idle = true, .env = &env_});
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  EXPECT_EQ(runs.load(), 2) << "one attempt per copy, no retries";
  auto letters = Letters(*store_, "rejected");
  ASSERT_EQ(letters.size(), 1u);
  EXPECT_EQ(letters[0].id, "bad-1");
  EXPECT_NE(letters[0].error.find("payload is not JSON"), std::string::npos) << letters[0].error;
  EXPECT_EQ(letters[0].payload, "not json");
  EXPECT_EQ(Charges(*store_, "good-1"), 1);
  EXPECT_EQ(Charges(*store_, "bad-1"), 0);
  EXPECT_EQ(consumer.stats().rejected, 2u);
  EXPECT_EQ(consumer.stats().nacked, 0u) << "never given back for a retry";
  EXPECT_EQ(inbox.counters().failures, 0u);
  EXPECT_EQ(inbox.counters().rejected, 2u);
}

// 3. Call first: the calls run before the transaction (no connection held,
// so another writer gets the store during the call), a redelivery after the
// transaction failed replays the stored result instead of calling again,
// and a duplicate makes no call at all. Claims in the inbox's own store.
TEST_P(StoreConformance, CallFirstCallsBeforeTheTransactionAndOncePerStep) {
  ClaimStore* own = store_->claim_store();
  ASSERT_NE(own, nullptr);
  auto claims_owned = MustOpen<Claims>(*own, Claims::Options{.env = &env_});
  Claims& claims = *claims_owned;
  Downstream provider;
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  std::atomic<int> apply_runs{0};
  CallFirst charge(
      claims,
      [&](Calls& calls, const Message& m) -> Status {
        // No transaction of the inbox is open: another writer commits now
        // (on SQLite it would wait for the inbox's write lock otherwise).
        auto other = store_->Begin();
        if (!other.ok()) return other.status();
        IDEM_RETURN_IF_ERROR((*other)->Exec("INSERT INTO payments(message_id, cents) VALUES ('other', 1)").status());
        IDEM_RETURN_IF_ERROR((*other)->Commit());
        return calls.Once("charge", [&](const std::string& key) { return provider.Call(key); }).status();
      },
      [&](Transaction& tx, const Message& m, const Calls& calls) -> Status {
        // The first apply fails, as a crash between the call and the commit
        // would leave it: nothing committed, the call's result stored.
        if (++apply_runs == 1) return Status::HandlerFailed("crashed before the commit");
        return tx
            .Exec("INSERT INTO payments(message_id, cents) VALUES ($1, $2)", {m.id + "/" + calls.at("charge"), 4000})
            .status();
      });
  const Message m = Msg("order-9");
  Outcome first = inbox.Handle(m, charge);
  EXPECT_EQ(first.kind, Outcome::Kind::kFailed);
  Outcome second = inbox.Handle(m, charge);
  EXPECT_EQ(second.kind, Outcome::Kind::kApplied) << second.ToString();
  Outcome third = inbox.Handle(m, charge);
  EXPECT_EQ(third.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(provider.calls(DownstreamKey(m, "charge")), 1) << "replayed, then not called for the duplicate";
  EXPECT_EQ(Charges(*store_, "order-9/ch_1"), 1);
  EXPECT_EQ(Charges(*store_, "other"), 2) << "the other writer ran during both calls phases that ran";
  EXPECT_EQ(apply_runs.load(), 2);
}

// Two consumers race on one message in the call-first form: one call, one
// effect. And a batch through the Consumer with copies in it.
TEST_P(StoreConformance, CallFirstRacesAndBatchesApplyOnce) {
  auto claims_store = sqlite::Store::Open({.path = dir_.File("claims.db"), .env = &env_});
  ASSERT_TRUE(claims_store.ok());
  auto claims_owned = MustOpen<Claims>(*(*claims_store)->claim_store(), Claims::Options{.env = &env_});
  Claims& claims = *claims_owned;
  Downstream provider;
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  CallFirst charge(
      claims,
      [&](Calls& calls, const Message&) -> Status {
        Result<std::string> r = Status::Internal("not called");
        for (int i = 0; i < 200; ++i) {  // the racer waits for the holder's result
          r = calls.Once("charge", [&](const std::string& key) { return provider.Call(key); });
          if (r.ok() || r.status().code() != Code::kInProgress) break;
          std::this_thread::yield();
        }
        return r.status();
      },
      [&](Transaction& tx, const Message& m, const Calls& calls) -> Status {
        return tx.Exec("INSERT INTO payments(message_id, cents) VALUES ($1, $2)", {m.id, calls.at("charge").size()})
            .status();
      });
  const Message m = Msg("order-race");
  std::vector<Outcome> outs(2);
  std::thread a([&] { outs[0] = inbox.Handle(m, charge); });
  std::thread b([&] { outs[1] = inbox.Handle(m, charge); });
  a.join();
  b.join();
  int applied = 0;
  for (auto& o : outs) {
    EXPECT_TRUE(o.ShouldAck() || o.status.code() == Code::kInProgress) << o.ToString();
    applied += o.applied();
  }
  EXPECT_LE(applied, 1);
  (void)inbox.Handle(m, charge);
  EXPECT_EQ(Charges(*store_, "order-race"), 1);
  EXPECT_EQ(provider.calls(DownstreamKey(m, "charge")), 1);

  auto queue = OpenQueue(dir_, &env_);
  ASSERT_NE(queue, nullptr);
  std::vector<Message> batch;
  for (int i = 0; i < 10; ++i) batch.push_back(Msg("b-" + std::to_string(i)));
  PublishTwice(*queue, batch);
  auto consumer_owned = MustOpen<Consumer>(
      *queue, inbox, charge, Consumer::Options{.workers = 2, .batch = 4, .stop_when_idle = true, .env = &env_});
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  for (const Message& b : batch) {
    EXPECT_EQ(Charges(*store_, b.id), 1) << b.id;
    EXPECT_EQ(provider.calls(DownstreamKey(b, "charge")), 1) << b.id;
  }
}

// On SQLite, claims kept in the inbox's own file cannot be committed by a
// CallOnce inside the inbox's transaction (its write lock is held): refused
// at once, saying why and what to do, instead of waiting for the busy
// timeout and failing with "database is locked". The same file through a
// second store object is the same lock. On PostgreSQL it works.
TEST_P(StoreConformance, InTransactionCallOnceOnTheInboxsOwnSqliteFileIsRefused) {
  auto own_owned = MustOpen<Claims>(*store_->claim_store(), Claims::Options{.env = &env_});
  Claims& own = *own_owned;
  Downstream provider;
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  auto handler_with = [&](Claims& claims) -> Handler {
    return [&](Transaction& tx, const Message& m) -> Status {
      auto r = CallOnce(claims, m, "charge", [&](const std::string& key) { return provider.Call(key); });
      if (!r.ok()) return r.status();
      return tx.Exec("INSERT INTO payments(message_id, cents) VALUES ($1, 1)", {m.id}).status();
    };
  };
  const Message m = Msg("order-own");
  Outcome o = inbox.Handle(m, handler_with(own));
  if (store_->Kind() == "sqlite") {
    EXPECT_EQ(o.kind, Outcome::Kind::kFailed);
    EXPECT_NE(o.status.message().find("write lock"), std::string::npos) << o.status;
    EXPECT_NE(o.status.message().find("CallFirst"), std::string::npos) << o.status;
    EXPECT_EQ(provider.calls(DownstreamKey(m, "charge")), 0) << "refused before the call";
  } else {
    EXPECT_EQ(o.kind, Outcome::Kind::kApplied) << o.ToString();
    EXPECT_EQ(Charges(*store_, "order-own"), 1);
  }
  EXPECT_EQ(inbox.Handle(m, handler_with(own)).ShouldAck(), store_->Kind() != "sqlite");
}

// Ids of every shape a Message accepts go through CallOnce and apply once:
// 1, 249 and 255 bytes, UTF-8, with spaces, with bytes no header can carry.
TEST_P(StoreConformance, EveryValidIdGoesThroughCallOnce) {
  auto claims_store = sqlite::Store::Open({.path = dir_.File("claims.db"), .env = &env_});
  ASSERT_TRUE(claims_store.ok());
  auto claims_owned = MustOpen<Claims>(*(*claims_store)->claim_store(), Claims::Options{.env = &env_});
  Claims& claims = *claims_owned;
  Downstream provider;
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& inbox = *inbox_owned;
  std::vector<std::string> seen_keys;
  Handler charge = [&](Transaction& tx, const Message& m) -> Status {
    auto r = CallOnce(claims, m, "charge", [&](const std::string& key) {
      seen_keys.push_back(key);
      return provider.Call(key);
    });
    if (!r.ok()) return r.status();
    return tx.Exec("INSERT INTO payments(message_id, cents) VALUES ($1, 1)", {Blob{m.id}}).status();
  };
  const std::vector<std::string> ids = {"1",
                                        std::string(249, 'a'),
                                        std::string(255, 'b'),
                                        "commande-\xc3\xa9t\xc3\xa9",
                                        "order 1042 for alice",
                                        std::string("\x01\x02\xff", 3)};
  for (const std::string& id : ids) {
    Message m = Msg(id, "4000");
    for (int copy = 0; copy < 2; ++copy) {
      Outcome o = inbox.Handle(m, charge);
      EXPECT_TRUE(o.ShouldAck()) << Printable(id) << ": " << o.ToString();
      EXPECT_EQ(o.applied(), copy == 0);
    }
  }
  EXPECT_EQ(provider.charges(), static_cast<int>(ids.size()));
  EXPECT_EQ(seen_keys.size(), ids.size());
  for (const std::string& key : seen_keys) EXPECT_LE(key.size(), kMaxKeyBytes);
}

}  // namespace
}  // namespace idem::testing
