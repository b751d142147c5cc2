// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The Redis pre-filter in front of an Inbox on a SQLite store: duplicates of
// committed messages are answered without a store transaction, and the
// store's marker still decides everything the filter does not know (a
// handler that failed, a flushed or unreachable Redis, a reused id).
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "idem/inbox.h"
#include "idem/redis/prefilter.h"
#include "idem/sqlite/store.h"
#include "redis/redis_test_util.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

using Kind = Outcome::Kind;

// Counts Begin() (each is a store transaction); delegates everything.
class CountingStore final : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  int begins() const { return begins_.load(); }
  Result<std::unique_ptr<StoreTransaction>> Begin() override {
    ++begins_;
    return inner_.Begin();
  }

 private:
  std::atomic<int> begins_{0};
};

Handler Failing() {
  return [](Transaction&, const Message&) { return Status::HandlerFailed("the provider said 503"); };
}

class RedisPrefilter : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = sqlite::Store::Open({.path = dir_.File("inbox.db")});
    ASSERT_OK(s);
    sqlite_ = std::move(*s);
    ASSERT_TRUE(CreatePayments(*sqlite_).ok());
    store_ = std::make_unique<CountingStore>(*sqlite_);
    UseFilter({.url = RedisUrl(), .prefix = UniquePrefix()});
  }
  void UseFilter(const redis::Prefilter::Options& o) {
    inbox_.reset();
    auto f = redis::Prefilter::Open(o);
    ASSERT_OK(f);
    filter_ = std::move(*f);
    inbox_ = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .prefilter = filter_.get()});
  }
  Outcome Deliver(const Message& m, const Handler& h = ChargeHandler()) { return inbox_->Handle(m, h); }
  bool Known(const Message& m) { return filter_->KnownApplied("payments", std::span<const Message>(&m, 1)).at(0); }

  TempDir dir_;
  std::unique_ptr<Store> sqlite_;
  std::unique_ptr<CountingStore> store_;
  std::unique_ptr<redis::Prefilter> filter_;
  std::unique_ptr<Inbox> inbox_;
};

TEST_F(RedisPrefilter, DuplicateOfACommittedMessageIsAnsweredWithoutTheStore) {
  const Message m = Msg("order-1");
  ASSERT_EQ(Deliver(m).kind, Kind::kApplied);
  ASSERT_EQ(store_->begins(), 1);
  for (int redelivery = 0; redelivery < 2; ++redelivery) {
    Outcome o = Deliver(m);
    EXPECT_EQ(o.kind, Kind::kDuplicate) << o.ToString();
    EXPECT_TRUE(o.ShouldAck());
  }
  EXPECT_EQ(store_->begins(), 1) << "the duplicates never opened a transaction";
  EXPECT_EQ(Charges(*sqlite_, "order-1"), 1);
  EXPECT_EQ(inbox_->counters().duplicates, 2u);

  // A batch: one MGET sheds the copies of what committed.
  const std::vector<Message> batch{Msg("order-2"), Msg("order-3")};
  for (const Outcome& o : inbox_->HandleBatch(batch, ChargeHandler())) EXPECT_EQ(o.kind, Kind::kApplied);
  const int begins = store_->begins();
  for (int redelivery = 0; redelivery < 2; ++redelivery)
    for (const Outcome& o : inbox_->HandleBatch(batch, ChargeHandler())) EXPECT_EQ(o.kind, Kind::kDuplicate);
  EXPECT_EQ(store_->begins(), begins);
  EXPECT_EQ(Charges(*sqlite_), 3);
}

TEST_F(RedisPrefilter, MessageWhoseHandlerFailedIsNotRemembered) {
  const Message m = Msg("order-1");
  for (int attempt = 0; attempt < 2; ++attempt) {
    Outcome o = Deliver(m, Failing());
    EXPECT_EQ(o.kind, Kind::kFailed) << o.ToString();
    EXPECT_FALSE(Known(m));
  }
  Outcome applied = Deliver(m);  // the redelivery applies it
  EXPECT_EQ(applied.kind, Kind::kApplied) << applied.ToString();
  EXPECT_EQ(Charges(*sqlite_, "order-1"), 1);
  EXPECT_TRUE(Known(m));
  const int begins = store_->begins();
  EXPECT_EQ(Deliver(m).kind, Kind::kDuplicate);
  EXPECT_EQ(store_->begins(), begins);
}

TEST_F(RedisPrefilter, FlushedRedisStillGivesDuplicateFromTheMarker) {
  // A database of its own, so FLUSHDB touches no other test's keys.
  const std::string url = RedisUrl() + "/3";
  UseFilter({.url = url, .prefix = UniquePrefix()});
  const Message m = Msg("order-1");
  ASSERT_EQ(Deliver(m).kind, Kind::kApplied);
  ASSERT_TRUE(Known(m));
  ASSERT_EQ(RedisRaw({"FLUSHDB"}, url), "OK");
  EXPECT_FALSE(Known(m));
  const int begins = store_->begins();
  Outcome o = Deliver(m);
  EXPECT_EQ(o.kind, Kind::kDuplicate) << o.ToString();
  EXPECT_EQ(store_->begins(), begins + 1) << "the store's marker answered";
  EXPECT_EQ(Charges(*sqlite_, "order-1"), 1);
  EXPECT_TRUE(Known(m)) << "remembered again once the marker said it committed";
  EXPECT_EQ(Deliver(m).kind, Kind::kDuplicate);
  EXPECT_EQ(store_->begins(), begins + 1);
}

TEST_F(RedisPrefilter, UnreachablePrefilterStillGivesDuplicateFromTheMarker) {
  UseFilter({.url = "redis://127.0.0.1:1"});
  Status ping = filter_->Ping();
  EXPECT_EQ(ping.code(), Code::kUnavailable) << ping;
  EXPECT_NE(ping.message().find("127.0.0.1:1"), std::string::npos) << ping;
  const Message m = Msg("order-1");
  EXPECT_EQ(Deliver(m).kind, Kind::kApplied);
  for (int redelivery = 0; redelivery < 2; ++redelivery) EXPECT_EQ(Deliver(m).kind, Kind::kDuplicate);
  EXPECT_EQ(store_->begins(), 3);
  EXPECT_EQ(Charges(*sqlite_, "order-1"), 1);
}

TEST_F(RedisPrefilter, ReusedIdWithAnotherPayloadIsNotShed) {
  const Message original = Msg("order-1", "4000");
  const Message reused = Msg("order-1", "9999");
  ASSERT_EQ(Deliver(original).kind, Kind::kApplied);
  for (int redelivery = 0; redelivery < 2; ++redelivery) {
    const int begins = store_->begins();
    Outcome o = Deliver(reused);
    EXPECT_EQ(o.kind, Kind::kConflict) << o.ToString();
    EXPECT_EQ(o.stored_fingerprint, FingerprintOf("4000"));
    EXPECT_EQ(store_->begins(), begins + 1) << "the store reported the conflict";
  }
  EXPECT_EQ(Charges(*sqlite_, "order-1"), 1);
  EXPECT_TRUE(Known(original)) << "the conflict did not replace the remembered fingerprint";
  EXPECT_FALSE(Known(reused));
}

TEST_F(RedisPrefilter, ConsumersAreKeptApart) {
  const std::string prefix = UniquePrefix();
  auto f = redis::Prefilter::Open({.url = RedisUrl(), .prefix = prefix, .ttl_ms = 600'000});
  ASSERT_OK(f);
  ASSERT_OK((*f)->Ping());
  const Message m = Msg("b:c");
  for (int delivery = 0; delivery < 2; ++delivery) (*f)->Remember("a", std::span<const Message>(&m, 1));
  const Message other = Msg("c", m.payload);
  EXPECT_TRUE((*f)->KnownApplied("a", std::span<const Message>(&m, 1)).at(0));
  EXPECT_FALSE((*f)->KnownApplied("a:b", std::span<const Message>(&other, 1)).at(0));
  // The documented key: the fingerprint, with the TTL asked for.
  const std::string key = prefix + "seen:1:a:b:c";
  const Fingerprint fp = FingerprintOf(m.payload);
  EXPECT_EQ(RedisRaw({"GET", key}), std::string(reinterpret_cast<const char*>(fp.data()), fp.size()));
  const int64_t ttl = std::atoll(RedisRaw({"TTL", key}).c_str());
  EXPECT_GT(ttl, 0);
  EXPECT_LE(ttl, 600);
}

TEST(RedisPrefilterOptions, ParseUrlReadsTheFields) {
  auto o = redis::Prefilter::ParseUrl("redis://h:1/3?prefix=p:&ttl_ms=5000&retry_after_ms=0&pool_size=2");
  ASSERT_OK(o);
  EXPECT_EQ(o->url, "redis://h:1/3");
  EXPECT_EQ(o->prefix, "p:");
  EXPECT_EQ(o->ttl_ms, 5000);
  EXPECT_EQ(o->retry_after_ms, 0);
  EXPECT_EQ(o->pool_size, 2);
  EXPECT_EQ(redis::Prefilter::ParseUrl("redis://h?ttl_ms=0").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(redis::Prefilter::ParseUrl("redis://h?ttl_seconds=5").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(redis::Prefilter::Open({.url = "redis://h", .pool_size = 0}).status().code(), Code::kInvalidArgument);
}

TEST(RedisPrefilterOptions, BadOptionsAreRefusedAndPasswordsNeverShown) {
  EXPECT_EQ(redis::Prefilter::Open({.url = RedisUrl(), .ttl_ms = 0}).status().code(), Code::kInvalidArgument);
  auto bad = redis::Prefilter::Open({.url = "redis://:hunter2@h:notaport"});
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(bad.status().message().find("hunter2"), std::string::npos) << bad.status();
  std::string url = RedisUrl();
  auto wrong = redis::Prefilter::Open({.url = "redis://idem_pw:hunter2@" + url.substr(8)});
  ASSERT_OK(wrong);
  for (int attempt = 0; attempt < 2; ++attempt) {
    Status ping = (*wrong)->Ping();
    EXPECT_EQ(ping.code(), Code::kUnavailable) << ping;
    EXPECT_EQ(ping.message().find("hunter2"), std::string::npos) << ping;
  }
}

}  // namespace
}  // namespace idem::testing
