// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Inbox::Options::key_by_producer_time on SQLite: markers keyed by the
// producer's time keep every guarantee for messages whose deliveries carry
// the same producer time, and switching it on never re-applies a message
// handled before.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "idem/inbox.h"
#include "idem/sqlite/store.h"
#include "idem/testing/fake_env.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

Message Timed(std::string id, int64_t produced_at, std::string payload = "") {
  Message m = payload.empty() ? Msg(std::move(id)) : Msg(std::move(id), std::move(payload));
  m.producer_time_ms = produced_at;
  return m;
}

class ProducerTimeKey : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = sqlite::Store::Open({.path = dir_.File("s.db"), .env = &env_});
    ASSERT_OK(s);
    store_ = std::move(*s);
    ASSERT_TRUE(CreatePayments(*store_).ok());
  }
  std::unique_ptr<Inbox> MakeInbox(bool by_time) {
    return MustOpen<Inbox>(*store_,
                           Inbox::Options{.consumer = "payments", .key_by_producer_time = by_time, .env = &env_});
  }
  TempDir dir_;
  FakeEnv env_;
  std::unique_ptr<Store> store_;
};

TEST_F(ProducerTimeKey, DuplicatesAndConflictsAsWithThePlainKey) {
  auto inbox_owned =
      MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .key_by_producer_time = true, .env = &env_});
  Inbox& inbox = *inbox_owned;
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < 10; ++i)
      EXPECT_EQ(inbox.Handle(Timed("m-" + std::to_string(i), 1000 + i), ChargeHandler()).kind,
                round == 0 ? Outcome::Kind::kApplied : Outcome::Kind::kDuplicate);
  Outcome c = inbox.Handle(Timed("m-3", 1003, "9999"), ChargeHandler());
  EXPECT_EQ(c.kind, Outcome::Kind::kConflict);
  EXPECT_EQ(Charges(*store_), 10);
  EXPECT_EQ(*store_->CountMarkers("payments"), 10);
  auto found = store_->FindMarker("payments", "m-3", 1003);
  ASSERT_TRUE(found.ok() && found->has_value());
  EXPECT_EQ((*found)->fingerprint, FingerprintOf("payload-of-m-3"));
  // A message without producer time falls back to the plain key.
  EXPECT_EQ(inbox.Handle(Msg("plain"), ChargeHandler()).kind, Outcome::Kind::kApplied);
  EXPECT_EQ(inbox.Handle(Msg("plain"), ChargeHandler()).kind, Outcome::Kind::kDuplicate);
}

TEST_F(ProducerTimeKey, SwitchingItOnNeverReappliesAMessageHandledBefore) {
  auto before_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& before = *before_owned;
  ASSERT_TRUE(before.Handle(Timed("m-1", 5000), ChargeHandler()).applied());
  auto after_owned =
      MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .key_by_producer_time = true, .env = &env_});
  Inbox& after = *after_owned;
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(after.Handle(Timed("m-1", 5000), ChargeHandler()).kind, Outcome::Kind::kDuplicate);
  // In a batch too.
  std::vector<Message> batch = {Timed("m-2", 5001), Timed("m-1", 5000), Timed("m-2", 5001)};
  std::vector<Outcome> out = after.HandleBatch(batch, ChargeHandler());
  EXPECT_EQ(out[0].kind, Outcome::Kind::kApplied);
  EXPECT_EQ(out[1].kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(out[2].kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(Charges(*store_, "m-1"), 1);
  EXPECT_EQ(Charges(*store_, "m-2"), 1);
}

TEST_F(ProducerTimeKey, AFailureOfAnAppliedMessageIsNotCounted) {
  auto inbox_owned =
      MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .key_by_producer_time = true, .env = &env_});
  Inbox& inbox = *inbox_owned;
  Message m = Timed("m-1", 7000);
  ASSERT_TRUE(inbox.Handle(m, ChargeHandler()).applied());
  auto c = store_->RecordFailure({"payments", &m, "a late copy failed", 1, env_.NowMs()});
  ASSERT_OK(c);
  EXPECT_TRUE(c->already_applied);
  EXPECT_FALSE(c->dead_lettered);
  EXPECT_TRUE(store_->ListDeadLetters("payments", 10)->empty());
}

TEST_F(ProducerTimeKey, ThreadsRacingOnOneMessageApplyItOnce) {
  auto inbox_owned =
      MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .key_by_producer_time = true, .env = &env_});
  Inbox& inbox = *inbox_owned;
  std::atomic<int> applied{0}, duplicates{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      Outcome o = inbox.Handle(Timed("race", 42), ChargeHandler());
      (o.applied() ? applied : duplicates).fetch_add(o.kind == Outcome::Kind::kFailed ? 0 : 1);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(applied.load(), 1);
  EXPECT_EQ(duplicates.load(), 3);
  EXPECT_EQ(Charges(*store_), 1);
}

TEST_F(ProducerTimeKey, PurgeGoesByProducerTimeAndARestampedRetryIsNotCaught) {
  auto inbox_owned =
      MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .key_by_producer_time = true, .env = &env_});
  Inbox& inbox = *inbox_owned;
  for (int i = 0; i < 20; ++i)
    for (int copy = 0; copy < 2; ++copy) inbox.Handle(Timed("m-" + std::to_string(i), 1000 * i), ChargeHandler());
  auto n = store_->Purge("payments", 10'000, 3);
  ASSERT_OK(n);
  EXPECT_EQ(*n, 10);
  EXPECT_EQ(*store_->CountMarkers("payments"), 10);
  EXPECT_EQ(inbox.Handle(Timed("m-15", 15'000), ChargeHandler()).kind, Outcome::Kind::kDuplicate);
  // The documented limit: a producer that stamps its retry anew is not
  // recognised under this option.
  EXPECT_EQ(inbox.Handle(Timed("m-15", 15'001), ChargeHandler()).kind, Outcome::Kind::kApplied);
}

}  // namespace
}  // namespace idem::testing
