// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Retention bound to the redelivery horizon (idem/retention.h): a purge whose
// cut lies after the oldest message a source may still deliver is refused,
// the horizon gauge, and the scenario that made it necessary: a consumer
// down for longer than the retention, whose restart purges before the source
// redelivers what was never acknowledged (Wolverine keeps handled rows five
// minutes and applied such messages again).
//
// The queue, the store and the consumer read one FakeEnv. Every message is
// published twice (a producer retry), and the unacknowledged ones are
// delivered again.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "idem/consumer.h"
#include "idem/embedded/queue.h"
#include "idem/env.h"
#include "idem/inbox.h"
#include "idem/metrics.h"
#include "idem/retention.h"
#include "idem/source.h"
#include "idem/sqlite/store.h"
#include "idem/testing/fake_env.h"
#include "idem/testing/memory_source.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

constexpr int64_t kDayMs = 86'400'000;
constexpr int64_t kLeaseMs = 60'000;

// A source whose acks of some messages are lost: answered OK, never heard by
// the queue, so those messages stay in it and come again.
class LosingAcks final : public Source {
 public:
  LosingAcks(Source& inner, std::set<std::string> lost) : inner_(inner), lost_(std::move(lost)) {}
  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override { return inner_.Receive(max, wait_ms); }
  Status Ack(const Delivery& d) override { return lost_.count(d.message.id) ? Status::OK() : inner_.Ack(d); }
  Status Nack(const Delivery& d, int64_t delay_ms) override { return inner_.Nack(d, delay_ms); }
  std::string_view Kind() const override { return inner_.Kind(); }
  int64_t lease_ms() const override { return inner_.lease_ms(); }
  Status ExtendLease(const Delivery& d) override { return inner_.ExtendLease(d); }
  Result<RedeliveryHorizon> Horizon() override { return inner_.Horizon(); }

 private:
  Source& inner_;
  const std::set<std::string> lost_;
};

NamedHorizon At(int64_t ms) { return DeclaredHorizon(ms, "the test's source"); }

std::unique_ptr<Store> OpenSqlite(const std::string& path, Env* env) {
  auto s = sqlite::Store::Open({.path = path, .env = env});
  if (!s.ok()) {
    ADD_FAILURE() << "opening failed: " << s.status();
    std::abort();
  }
  return std::move(*s);
}

TEST(Retention, ACutAfterTheHorizonIsRefusedNamingTheHorizonItsTimeAndItsSource) {
  const int64_t h = 1'700'000'000'000;  // 2023-11-14T22:13:20Z
  EXPECT_OK(CheckPurgeBefore(h - 1, At(h)));
  EXPECT_OK(CheckPurgeBefore(h, At(h))) << "markers processed at the horizon's time are kept";
  Status refused = CheckPurgeBefore(h + 2 * 3'600'000 + 61'000, At(h));
  EXPECT_EQ(refused.code(), Code::kInvalidArgument) << refused;
  for (const char* part : {"redelivery horizon 2023-11-14T22:13:20.000Z", "of the test's source",
                           "processed before 2023-11-15T00:14:21.000Z", "lies 2h 1m 1s after"})
    EXPECT_NE(refused.message().find(part), std::string::npos) << part << " in " << refused;
  EXPECT_OK(CheckPurgeBefore(h + 365 * kDayMs, {RedeliveryHorizon::None(), "an empty queue"}))
      << "nothing left to deliver: any cut";
  Status unknown = CheckPurgeBefore(h - kDayMs, {RedeliveryHorizon::Unknown(), "the amqp source"});
  EXPECT_EQ(unknown.code(), Code::kInvalidArgument) << unknown;
  EXPECT_NE(unknown.message().find("the amqp source cannot tell"), std::string::npos) << unknown;
  EXPECT_NE(unknown.message().find("declare"), std::string::npos) << unknown;
}

TEST(Retention, TheEarlierHorizonKeepsMore) {
  const NamedHorizon unknown{RedeliveryHorizon::Unknown(), "unknown"};
  const NamedHorizon none{RedeliveryHorizon::None(), "none"};
  const NamedHorizon older = DeclaredHorizon(100, "older"), newer = DeclaredHorizon(200, "newer");
  EXPECT_EQ(EarlierHorizon(older, newer).from, "older");
  EXPECT_EQ(EarlierHorizon(newer, older).from, "older");
  EXPECT_EQ(EarlierHorizon(unknown, newer).from, "newer") << "a declared horizon stands for a source that cannot tell";
  EXPECT_EQ(EarlierHorizon(newer, unknown).from, "newer");
  EXPECT_EQ(EarlierHorizon(none, newer).from, "newer");
  EXPECT_EQ(EarlierHorizon(newer, none).from, "newer");
  EXPECT_EQ(EarlierHorizon(none, unknown).from, "none");
  EXPECT_EQ(EarlierHorizon(unknown, unknown).from, "unknown");
}

// Markers one day apart; the horizon at the second. A cut after it deletes
// nothing; a cut at it deletes only the first; force deletes past it.
TEST(Retention, PurgeMarkersKeepsEveryMarkerFromTheHorizonOnUnlessForced) {
  TempDir dir;
  FakeEnv env;
  auto store = OpenSqlite(dir.File("s.db"), &env);
  auto inbox = MustOpen<Inbox>(*store, Inbox::Options{.consumer = "payments", .env = &env});
  ASSERT_OK(CreatePayments(*store));
  std::vector<int64_t> at;
  for (int i = 0; i < 3; ++i) {
    at.push_back(env.NowMs());
    for (int copy = 0; copy < 2; ++copy)
      EXPECT_TRUE(inbox->Handle(Msg("m-" + std::to_string(i)), ChargeHandler()).ShouldAck());
    env.Advance(kDayMs);
  }
  const NamedHorizon horizon = At(at[1]);
  auto refused = PurgeMarkers(*store, {.consumer = "payments", .before_ms = at[2] + 1}, horizon);
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument) << refused.status();
  EXPECT_EQ(*store->CountMarkers("payments"), 3) << "refused: nothing deleted";
  auto every = PurgeMarkers(*store, {.before_ms = at[2] + 1}, horizon);
  EXPECT_EQ(every.status().code(), Code::kInvalidArgument) << "every consumer: the same bound";
  auto to_horizon = PurgeMarkers(*store, {.consumer = "payments", .before_ms = at[1]}, horizon);
  ASSERT_OK(to_horizon);
  EXPECT_EQ(*to_horizon, 1);
  EXPECT_EQ(*store->CountMarkers("payments"), 2) << "the marker processed at the horizon's time stays";
  auto forced = PurgeMarkers(*store, {.consumer = "payments", .before_ms = at[2] + 1, .force = true}, horizon);
  ASSERT_OK(forced);
  EXPECT_EQ(*forced, 2);
  EXPECT_EQ(PurgeMarkers(*store, {.before_ms = 0, .batch_size = 0}, horizon).status().code(), Code::kInvalidArgument);
}

// idem_redelivery_horizon_seconds: the horizon's age at each render, the
// source asked at most once per refresh.
TEST(Retention, TheHorizonGaugeAgesTheLastAnswerAndAsksAgainEachRefresh) {
  TempDir dir;
  FakeEnv env;
  auto queue =
      MustOpen<embedded::Queue>(embedded::Queue::Options{.path = dir.File("q.db"), .durable = false, .env = &env});
  MemorySource cannot_tell;
  Metrics metrics;
  AddHorizonGauge(metrics, *queue, "payments", &env, 10'000);
  AddHorizonGauge(metrics, cannot_tell, "other", &env, 10'000);
  auto sample = [&](const std::string& consumer) {
    const std::string text = metrics.Render();
    const std::string key = "idem_redelivery_horizon_seconds{consumer=\"" + consumer + "\"} ";
    const size_t at = text.find(key);
    EXPECT_NE(at, std::string::npos) << text;
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + key.size()));
  };
  EXPECT_NE(metrics.Render().find("# TYPE idem_redelivery_horizon_seconds gauge"), std::string::npos);
  EXPECT_EQ(sample("payments"), 0) << "nothing to deliver";
  EXPECT_TRUE(std::isnan(sample("other"))) << "a source that cannot tell";
  EXPECT_NE(metrics.Render().find("idem_redelivery_horizon_seconds{consumer=\"other\"} NaN"), std::string::npos);
  for (int copy = 0; copy < 2; ++copy) ASSERT_OK(queue->Publish(Msg("m-1")));
  EXPECT_EQ(sample("payments"), 0) << "asked less than a refresh ago";
  env.Advance(10'000);
  EXPECT_EQ(sample("payments"), 10) << "asked again: the message is 10 s old";
  env.Advance(5'500);
  EXPECT_EQ(sample("payments"), 15.5) << "the last answer ages";
  auto got = queue->Receive(2, 0);
  ASSERT_OK(got);
  for (const Delivery& d : *got) ASSERT_OK(queue->Ack(d));
  env.Advance(4'500);
  EXPECT_EQ(sample("payments"), 0) << "asked again: everything acknowledged";
}

// The Wolverine scenario. A consumer applies 10 messages; the acks of 4 are
// lost (the broker never heard them), then it stops. It stays down for 8
// days, past the 7-day retention; on restart the purge runs before the
// source redelivers the 4. The markers that guard them must survive it.
class RestartAfterTheRetention : public ::testing::Test {
 protected:
  void SetUp() override {
    Open();
    ASSERT_OK(CreatePayments(*store_));
    // Older messages, all acknowledged: what the purge is for.
    for (int i = 0; i < 5; ++i)
      for (int copy = 0; copy < 2; ++copy) ASSERT_OK(queue_->Publish(Msg("old-" + std::to_string(i))));
    ASSERT_OK(Drain(*queue_));
    env_.Advance(kDayMs);
    for (int i = 0; i < 10; ++i)
      for (int copy = 0; copy < 2; ++copy) ASSERT_OK(queue_->Publish(Msg(Id(i))));
    LosingAcks losing(*queue_, {Id(0), Id(1), Id(2), Id(3)});
    ASSERT_OK(Drain(losing));
    for (int i = 0; i < 10; ++i) ASSERT_EQ(Charges(*store_, Id(i)), 1) << Id(i);
    // The consumer stops; 8 days later it starts again.
    Close();
    env_.Advance(8 * kDayMs);
    Open();
  }

  static std::string Id(int i) { return "m-" + std::to_string(i); }
  void Open() {
    store_ = OpenSqlite(dir_.File("payments.db"), &env_);
    queue_ = MustOpen<embedded::Queue>(embedded::Queue::Options{
        .path = dir_.File("queue.db"), .queue = "payments", .lease_ms = kLeaseMs, .durable = false, .env = &env_});
    inbox_ = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  }
  void Close() {
    inbox_.reset();
    queue_.reset();
    store_.reset();
  }
  // Runs a consumer until the source is idle.
  Status Drain(Source& source) {
    IDEM_ASSIGN_OR_RETURN(auto consumer, Consumer::Open(source, *inbox_, ChargeHandler(),
                                                        {.receive_wait_ms = 50, .stop_when_idle = true, .env = &env_}));
    return consumer->Run();
  }
  int64_t RetentionCut() { return env_.NowMs() - 7 * kDayMs; }

  TempDir dir_;
  FakeEnv env_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<embedded::Queue> queue_;
  std::unique_ptr<Inbox> inbox_;
};

TEST_F(RestartAfterTheRetention, ThePurgeIsRefusedBelowTheHorizonAndTheRedeliveriesApplyNothingTwice) {
  auto horizon = HorizonOf(*queue_);
  ASSERT_OK(horizon);
  ASSERT_EQ(horizon->horizon.kind, RedeliveryHorizon::Kind::kAt);
  EXPECT_EQ(horizon->from, "the embedded source");
  EXPECT_LT(horizon->horizon.at_ms, RetentionCut()) << "the unacknowledged messages are older than the retention";
  // The restart's purge by age alone: refused, nothing deleted.
  auto by_age = PurgeMarkers(*store_, {.consumer = "payments", .before_ms = RetentionCut()}, *horizon);
  EXPECT_EQ(by_age.status().code(), Code::kInvalidArgument) << by_age.status();
  EXPECT_NE(by_age.status().message().find("the embedded source"), std::string::npos) << by_age.status();
  EXPECT_EQ(*store_->CountMarkers("payments"), 15);
  // Up to the horizon: the older, acknowledged messages' markers go.
  auto to_horizon = PurgeMarkers(*store_, {.consumer = "payments", .before_ms = horizon->horizon.at_ms}, *horizon);
  ASSERT_OK(to_horizon);
  EXPECT_EQ(*to_horizon, 5);
  // The source redelivers both copies of the 4 whose acks were lost.
  ASSERT_OK(Drain(*queue_));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(Charges(*store_, Id(i)), 1) << Id(i);
  EXPECT_EQ(inbox_->counters().applied, 0u);
  EXPECT_EQ(inbox_->counters().duplicates, 8u);
  auto after = queue_->Horizon();
  ASSERT_OK(after);
  EXPECT_EQ(after->kind, RedeliveryHorizon::Kind::kNone) << "all acknowledged now";
  ASSERT_OK(PurgeMarkers(*store_, {.consumer = "payments", .before_ms = RetentionCut()}, *HorizonOf(*queue_)));
}

// What the refusal prevents: purged by age (forced), the markers of the 4
// are gone when they come again, and each applies a second time.
TEST_F(RestartAfterTheRetention, APurgeForcedPastTheHorizonLetsTheRedeliveriesApplyAgain) {
  auto horizon = HorizonOf(*queue_);
  ASSERT_OK(horizon);
  auto forced = PurgeMarkers(*store_, {.consumer = "payments", .before_ms = RetentionCut(), .force = true}, *horizon);
  ASSERT_OK(forced);
  EXPECT_EQ(*forced, 15);
  ASSERT_OK(Drain(*queue_));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(Charges(*store_, Id(i)), 2) << Id(i) << " applied again";
  for (int i = 4; i < 10; ++i) EXPECT_EQ(Charges(*store_, Id(i)), 1) << Id(i);
}

}  // namespace
}  // namespace idem::testing
