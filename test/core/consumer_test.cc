// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The Consumer runner over the embedded queue and the SQLite store. The queue
// and the consumer read one FakeEnv: a Receive that waits, and a backoff, move
// the clock instead of sleeping, so leases expire and nack delays pass at once.
//
// Every message is published twice (a producer retry), and many are
// delivered more often than that (lost acks, failures, expired leases).
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "idem/call_first.h"
#include "idem/claims.h"
#include "idem/consumer.h"
#include "idem/embedded/queue.h"
#include "idem/env.h"
#include "idem/inbox.h"
#include "idem/source.h"
#include "idem/sqlite/store.h"
#include "idem/testing/fake_env.h"
#include "util/recording_observer.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

// Long next to the 50 ms poll: with several workers, idle ones move the
// shared fake clock while another one is busy; a lease must not run out
// under a worker that is merely slow on a loaded machine.
constexpr int64_t kLeaseMs = 60'000;

// A Source that forwards to another and lets a test interfere: drop acks
// (report OK without acking, as a broker that loses the ack would), fail
// receives, rewrite deliveries, and watch nacks.
class TestSource final : public Source {
 public:
  explicit TestSource(Source& inner) : inner_(inner) {}

  // Returns true to drop this ack.
  std::function<bool(const Delivery&)> drop_ack;
  // Returns a non-OK status to fail this Receive (n counts from 1).
  std::function<Status(int n)> fail_receive;
  // Sees (and may change) every delivery handed out.
  std::function<void(std::vector<Delivery>&)> on_receive;
  // Called after each ack that the queue took.
  std::function<void(const Delivery&)> on_ack;

  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override {
    int n = ++receives_;
    if (fail_receive) {
      if (Status s = fail_receive(n); !s.ok()) return s;
    }
    auto got = inner_.Receive(max, wait_ms);
    if (got.ok() && !got->empty()) {
      std::lock_guard<std::mutex> l(mu_);
      for (const Delivery& d : *got) delivered_.push_back({d.message.id, d.message.attempt});
    }
    if (got.ok() && on_receive) on_receive(*got);
    return got;
  }
  Status Ack(const Delivery& d) override {
    if (drop_ack && drop_ack(d)) {
      ++dropped_;
      return Status::OK();
    }
    Status s = inner_.Ack(d);
    if (s.ok()) {
      ++acked_;
      if (on_ack) on_ack(d);
    }
    return s;
  }
  Status Nack(const Delivery& d, int64_t delay_ms) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      nacks_.push_back({d.message.id, delay_ms});
    }
    return inner_.Nack(d, delay_ms);
  }
  std::string_view Kind() const override { return inner_.Kind(); }

  int dropped() const { return dropped_.load(); }
  int acked() const { return acked_.load(); }
  std::vector<std::pair<std::string, int64_t>> nacks() {
    std::lock_guard<std::mutex> l(mu_);
    return nacks_;
  }
  std::vector<std::pair<std::string, int>> delivered() {
    std::lock_guard<std::mutex> l(mu_);
    return delivered_;
  }

 private:
  Source& inner_;
  std::atomic<int> receives_{0}, dropped_{0}, acked_{0};
  std::mutex mu_;
  std::vector<std::pair<std::string, int64_t>> nacks_;
  std::vector<std::pair<std::string, int>> delivered_;
};

// Counts the calls of a handler per message id, thread-safely.
class CallCounter {
 public:
  int Next(const std::string& id) {
    std::lock_guard<std::mutex> l(mu_);
    return ++calls_[id];
  }
  int Of(const std::string& id) {
    std::lock_guard<std::mutex> l(mu_);
    return calls_[id];
  }
  int Total() {
    std::lock_guard<std::mutex> l(mu_);
    int n = 0;
    for (auto& [id, c] : calls_) n += c;
    return n;
  }

 private:
  std::mutex mu_;
  std::map<std::string, int> calls_;
};

std::string Id(int i) { return "m-" + std::to_string(i); }
int IndexOf(const std::string& id) { return std::atoi(id.c_str() + 2); }

class ConsumerTestBase {
 protected:
  void Open() {
    auto q = embedded::Queue::Open(
        {.path = dir_.File("queue.db"), .lease_ms = kLeaseMs, .durable = false, .poll_ms = 50, .env = &env_});
    ASSERT_OK(q);
    queue_ = std::move(*q);
    auto s =
        sqlite::Store::Open({.path = dir_.File("store.db"), .synchronous = sqlite::Synchronous::kNormal, .env = &env_});
    ASSERT_OK(s);
    store_ = std::move(*s);
    ASSERT_TRUE(CreatePayments(*store_).ok());
    inbox_ = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  }

  // Publishes m-0..m-(n-1), then all of them again (a producer retry).
  void PublishTwice(int n) {
    for (int round = 0; round < 2; ++round)
      for (int i = 0; i < n; ++i) ASSERT_TRUE(queue_->Publish(Msg(Id(i))).ok());
  }

  // Drain mode; a Receive waits longer than a lease, so a delivery whose ack
  // was lost comes back before the consumer calls the queue idle.
  Consumer::Options Drain() {
    return {.max_attempts = 5, .receive_wait_ms = 2 * kLeaseMs, .stop_when_idle = true, .env = &env_};
  }

  void ExpectQueueEmpty() {
    auto s = queue_->Stats();
    ASSERT_OK(s);
    EXPECT_EQ(s->ready, 0);
    EXPECT_EQ(s->leased, 0);
    EXPECT_EQ(s->delayed, 0);
    EXPECT_EQ(s->acked, s->published);
  }

  // One payments row and one marker per message m-0..m-(n-1), nothing else.
  void ExpectExactlyOnce(int n) {
    for (int i = 0; i < n; ++i) EXPECT_EQ(Charges(*store_, Id(i)), 1) << Id(i);
    EXPECT_EQ(Charges(*store_), n);
    auto markers = store_->CountMarkers("payments");
    ASSERT_TRUE(markers.ok());
    EXPECT_EQ(*markers, n);
  }

  int64_t FailureRows() {
    auto tx = store_->Begin();
    EXPECT_TRUE(tx.ok());
    if (!tx.ok()) return -1;
    auto rows = (*tx)->Query("SELECT count(*) FROM idem_failures");
    EXPECT_OK(rows);
    return rows.ok() ? rows->rows[0][0].AsInt() : -1;
  }

  std::vector<DeadLetter> DeadLetters() {
    auto d = store_->ListDeadLetters("payments", 100);
    EXPECT_OK(d);
    return d.ok() ? *d : std::vector<DeadLetter>{};
  }

  TempDir dir_;
  FakeEnv env_;
  std::unique_ptr<embedded::Queue> queue_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Inbox> inbox_;
};

class ConsumerTest : public ConsumerTestBase, public ::testing::Test {
 protected:
  void SetUp() override { Open(); }
};

// ---------------------------------------------------------------------------
// Exactly once under duplicates, lost acks and transient failures, for every
// shape of runner: one or several workers, single messages or batches.
// ---------------------------------------------------------------------------

struct Shape {
  int workers;
  int batch;
};

void PrintTo(const Shape& s, std::ostream* os) { *os << s.workers << " workers, batch " << s.batch; }

class ConsumerShapes : public ConsumerTestBase, public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override { Open(); }
};

TEST_P(ConsumerShapes, DuplicatesAndLostAcksEndWithOneEffectPerMessageAndAnEmptyQueue) {
  constexpr int kN = 40;
  PublishTwice(kN);
  TestSource src(*queue_);
  std::mutex mu;
  std::set<std::string> dropped_once;
  // The first ack of every third message is lost: its lease expires and the
  // message comes back, to find the marker.
  src.drop_ack = [&](const Delivery& d) {
    std::lock_guard<std::mutex> l(mu);
    return IndexOf(d.message.id) % 3 == 0 && dropped_once.insert(d.message.id).second;
  };
  CallCounter calls;
  Handler h = [&](Transaction& tx, const Message& m) {
    calls.Next(m.id);
    return ChargeHandler()(tx, m);
  };
  Consumer::Options o = Drain();
  o.workers = GetParam().workers;
  o.batch = GetParam().batch;
  auto consumer_owned = MustOpen<Consumer>(src, *inbox_, h, o);
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());

  ExpectExactlyOnce(kN);
  ExpectQueueEmpty();
  const int dropped = src.dropped();
  EXPECT_EQ(dropped, (kN + 2) / 3);
  EXPECT_TRUE(DeadLetters().empty());
  InboxCounters c = inbox_->counters();
  EXPECT_EQ(c.applied, static_cast<uint64_t>(kN));
  EXPECT_EQ(c.failures, 0u);
  for (int i = 0; i < kN; ++i) EXPECT_EQ(calls.Of(Id(i)), 1) << Id(i);
  ConsumerStats s = consumer.stats();
  if (GetParam().workers == 1) {
    // Deterministic with one worker: every lost ack costs one redelivery,
    // absorbed by the marker.
    EXPECT_EQ(c.duplicates, static_cast<uint64_t>(kN + dropped));
    EXPECT_EQ(s.received, static_cast<uint64_t>(2 * kN + dropped));
    EXPECT_EQ(s.acked, s.received);
  } else {
    EXPECT_GE(c.duplicates, static_cast<uint64_t>(kN + dropped));
    EXPECT_EQ(s.received, c.applied + c.duplicates);
  }
  EXPECT_EQ(s.nacked, 0u);
  EXPECT_EQ(s.dead_lettered, 0u);
}

TEST_P(ConsumerShapes, HandlerFailingTheFirstKTimesIsRetriedWithBackoffAndAppliedOnce) {
  constexpr int kN = 12, kFailures = 3;
  PublishTwice(kN);
  TestSource src(*queue_);
  CallCounter calls;
  // Every third message fails its first kFailures calls, after a write that
  // the rollback must undo.
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    int call = calls.Next(m.id);
    IDEM_RETURN_IF_ERROR(ChargeHandler()(tx, m));
    if (IndexOf(m.id) % 3 == 0 && call <= kFailures)
      return Status::Unavailable("provider down, call " + std::to_string(call));
    return Status::OK();
  };
  // The default Receive wait (200 ms) is shorter than the later backoffs
  // (400 ms and more): drain mode must still wait for the retries it owes.
  Consumer::Options o{.workers = GetParam().workers,
                      .batch = GetParam().batch,
                      .max_attempts = 5,
                      .stop_when_idle = true,
                      .env = &env_};
  auto consumer_owned = MustOpen<Consumer>(src, *inbox_, h, o);
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());

  ExpectExactlyOnce(kN);
  ExpectQueueEmpty();
  EXPECT_TRUE(DeadLetters().empty());
  EXPECT_EQ(FailureRows(), 0) << "the failure count of an applied message is forgotten";
  for (int i = 0; i < kN; ++i) {
    if (GetParam().batch == 1) {
      EXPECT_EQ(calls.Of(Id(i)), i % 3 == 0 ? kFailures + 1 : 1) << Id(i);
    } else {
      // In a batch, a failing neighbour rolls the transaction back and the
      // batch runs again without it: a handler may run more than once, its
      // effect still commits once (ExpectExactlyOnce above).
      EXPECT_GE(calls.Of(Id(i)), i % 3 == 0 ? kFailures + 1 : 1) << Id(i);
    }
  }
  InboxCounters c = inbox_->counters();
  EXPECT_EQ(c.applied, static_cast<uint64_t>(kN));
  EXPECT_EQ(c.failures, static_cast<uint64_t>(4 * kFailures));
  ConsumerStats s = consumer.stats();
  if (GetParam().workers == 1) {
    EXPECT_EQ(s.nacked, static_cast<uint64_t>(4 * kFailures));
  } else {
    // A copy whose failure is recorded after the other copy applied the
    // message is acknowledged instead of given back (the store reports it
    // as already applied).
    EXPECT_LE(s.nacked, static_cast<uint64_t>(4 * kFailures));
  }
  EXPECT_EQ(s.dead_lettered, 0u);
}

INSTANTIATE_TEST_SUITE_P(Runner, ConsumerShapes, ::testing::Values(Shape{1, 1}, Shape{1, 8}, Shape{3, 1}, Shape{3, 4}),
                         [](const ::testing::TestParamInfo<Shape>& p) {
                           return "workers" + std::to_string(p.param.workers) + "_batch" +
                                  std::to_string(p.param.batch);
                         });

// ---------------------------------------------------------------------------
// Retries, dead letters, conflicts.
// ---------------------------------------------------------------------------

TEST_F(ConsumerTest, BackoffDoublesPerFailureWithAtMostAQuarterOfJitter) {
  PublishTwice(2);
  TestSource src(*queue_);
  CallCounter calls;
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    if (m.id == "m-0" && calls.Next(m.id) <= 4) return Status::Unavailable("down");
    return ChargeHandler()(tx, m);
  };
  Consumer::Options o = Drain();
  o.backoff_base_ms = 100;
  o.backoff_max_ms = 500;
  auto consumer_owned = MustOpen<Consumer>(src, *inbox_, h, o);
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  ExpectExactlyOnce(2);
  ExpectQueueEmpty();
  auto nacks = src.nacks();
  ASSERT_EQ(nacks.size(), 4u);
  // The failure count is per message id (both copies add to it): 1, 2, 3, 4.
  const int64_t want[] = {100, 200, 400, 500};
  for (size_t i = 0; i < nacks.size(); ++i) {
    EXPECT_EQ(nacks[i].first, "m-0");
    EXPECT_GE(nacks[i].second, want[i]) << "failure " << i + 1;
    EXPECT_LE(nacks[i].second, want[i] + want[i] / 4) << "failure " << i + 1;
  }
}

// An empty handler is refused before anything is received: no message is
// taken, failed or dead-lettered for the caller's mistake.
TEST_F(ConsumerTest, AnEmptyHandlerIsRefusedBeforeAnythingIsReceived) {
  PublishTwice(2);
  TestSource src(*queue_);
  // At Open...
  auto opened = Consumer::Open(src, *inbox_, Handler{}, Consumer::Options{.stop_when_idle = true, .env = &env_});
  EXPECT_EQ(opened.status().code(), Code::kInvalidArgument) << opened.status();
  Claims claims(*store_->claim_store());
  auto call_first = Consumer::Open(src, *inbox_, CallFirst(claims, CallFirst::CallsFn{}, CallFirst::ApplyFn{}),
                                   Consumer::Options{.stop_when_idle = true, .env = &env_});
  EXPECT_EQ(call_first.status().code(), Code::kInvalidArgument) << call_first.status();
  // ...and at Run for a consumer made with the default options.
  Consumer consumer(src, *inbox_, Handler{});
  Status s = consumer.Run();
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s;
  EXPECT_EQ(consumer.stats().received, 0u);
  auto st = queue_->Stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->ready, 4);  // all still there
}

// Options that cannot work are refused before anything is received, not
// clamped or read as "never".
TEST_F(ConsumerTest, OptionsThatCannotWorkAreRefusedBeforeAnythingIsReceived) {
  PublishTwice(1);
  TestSource src(*queue_);
  const Consumer::Options kBad[] = {{.workers = 0},         {.batch = -1},           {.max_attempts = -1},
                                    {.max_deliveries = -2}, {.backoff_base_ms = -1}, {.backoff_max_ms = -5},
                                    {.receive_wait_ms = -1}};
  for (Consumer::Options o : kBad) {
    o.stop_when_idle = true;
    o.env = &env_;
    auto consumer = Consumer::Open(src, *inbox_, ChargeHandler(), o);
    EXPECT_EQ(consumer.status().code(), Code::kInvalidArgument) << consumer.status();
  }
  // The consumer's name is checked when the Inbox is opened, not per message.
  for (const std::string& bad : {std::string(), std::string(256, 'c')}) {
    auto inbox = Inbox::Open(*store_, Inbox::Options{.consumer = bad});
    EXPECT_EQ(inbox.status().code(), Code::kInvalidArgument) << inbox.status();
    EXPECT_NE(inbox.status().message().find("consumer"), std::string::npos) << inbox.status();
  }
  auto st = queue_->Stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->ready, 2);
}

TEST_F(ConsumerTest, HugeBackoffSettingsDoNotOverflow) {
  PublishTwice(1);
  TestSource src(*queue_);
  Consumer* running = nullptr;
  CallCounter calls;
  Handler h = [&](Transaction&, const Message& m) -> Status {
    if (calls.Next(m.id) == 2) running->Stop();  // the retries are due in 10^8 years
    return Status::Unavailable("down");
  };
  Consumer::Options o = Drain();
  o.backoff_base_ms = int64_t{1} << 62;
  o.backoff_max_ms = int64_t{1} << 62;
  auto consumer_owned = MustOpen<Consumer>(src, *inbox_, h, o);
  Consumer& consumer = *consumer_owned;
  running = &consumer;
  ASSERT_TRUE(consumer.Run().ok());
  auto nacks = src.nacks();
  ASSERT_EQ(nacks.size(), 2u);
  for (auto& [id, delay] : nacks) {
    EXPECT_GE(delay, int64_t{1} << 62) << "failure count doubling must saturate at the maximum";
    EXPECT_LE(delay, (int64_t{1} << 62) + (int64_t{1} << 60));
  }
  EXPECT_EQ(Charges(*store_), 0);
  auto st = queue_->Stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->delayed, 2);
}

// A message that crashes the consumer each time records no failure; only the
// source's delivery count shows the loop. Past max_deliveries it is
// dead-lettered without running the handler again; a message past it whose
// marker exists (applied, its acks lost) is simply acknowledged.
TEST_F(ConsumerTest, DeliveriesPastMaxDeliveriesAreDeadLetteredWithoutTheHandlerUnlessApplied) {
  constexpr int kN = 4;
  PublishTwice(kN);
  // m-1 is applied before, by another consumer.
  ASSERT_TRUE(inbox_->Handle(Msg(Id(1)), ChargeHandler()).applied());
  TestSource src(*queue_);
  // As if the broker had delivered m-0 and m-1 25 times already.
  src.on_receive = [](std::vector<Delivery>& ds) {
    for (Delivery& d : ds)
      if (d.message.id == Id(0) || d.message.id == Id(1)) d.message.attempt = 25;
  };
  CallCounter calls;
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    calls.Next(m.id);
    return ChargeHandler()(tx, m);
  };
  auto consumer_owned = MustOpen<Consumer>(
      src, *inbox_, h,
      Consumer::Options{.max_attempts = 5, .max_deliveries = 20, .stop_when_idle = true, .env = &env_});
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  ExpectQueueEmpty();
  EXPECT_EQ(calls.Of(Id(0)), 0) << "never handled again";
  EXPECT_EQ(calls.Of(Id(1)), 0);
  EXPECT_EQ(Charges(*store_, Id(0)), 0);
  EXPECT_EQ(Charges(*store_, Id(1)), 1) << "applied before: acknowledged, not dead-lettered";
  for (int i = 2; i < kN; ++i) EXPECT_EQ(Charges(*store_, Id(i)), 1);
  std::vector<DeadLetter> dead = DeadLetters();
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].id, Id(0));
  EXPECT_NE(dead[0].error.find("delivered 25 times without an outcome"), std::string::npos) << dead[0].error;
  EXPECT_EQ(consumer.stats().dead_lettered, 2u) << "both copies of m-0";
}

TEST_F(ConsumerTest, MaxDeliveriesZeroHandlesEveryDelivery) {
  PublishTwice(1);
  TestSource src(*queue_);
  src.on_receive = [](std::vector<Delivery>& ds) {
    for (Delivery& d : ds) d.message.attempt = 1000;
  };
  auto consumer_owned = MustOpen<Consumer>(
      src, *inbox_, ChargeHandler(), Consumer::Options{.max_deliveries = 0, .stop_when_idle = true, .env = &env_});
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  EXPECT_EQ(Charges(*store_, Id(0)), 1);
  EXPECT_TRUE(DeadLetters().empty());
}

TEST_F(ConsumerTest, PoisonMessageIsDeadLetteredAfterMaxAttemptsWithItsLastErrorAndAcked) {
  constexpr int kN = 4;  // m-0 is poison, the others are fine
  PublishTwice(kN);
  TestSource src(*queue_);
  CallCounter calls;
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    int call = calls.Next(m.id);
    IDEM_RETURN_IF_ERROR(ChargeHandler()(tx, m));
    if (m.id == "m-0") return Status::HandlerFailed("card declined, call " + std::to_string(call));
    return Status::OK();
  };
  Consumer::Options o{.max_attempts = 3, .stop_when_idle = true, .env = &env_};
  auto consumer_owned = MustOpen<Consumer>(src, *inbox_, h, o);
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());

  ExpectQueueEmpty();
  EXPECT_EQ(Charges(*store_, "m-0"), 0);
  for (int i = 1; i < kN; ++i) EXPECT_EQ(Charges(*store_, Id(i)), 1);
  auto marker = store_->FindMarker("payments", "m-0");
  ASSERT_TRUE(marker.ok());
  EXPECT_FALSE(marker->has_value());
  std::vector<DeadLetter> dead = DeadLetters();
  ASSERT_EQ(dead.size(), 1u);
  const DeadLetter& d = dead[0];
  EXPECT_EQ(d.id, "m-0");
  EXPECT_EQ(d.reason, "failed");
  EXPECT_EQ(d.payload, "payload-of-m-0");
  // Both copies share the id's failure count: the first copy is dead-lettered
  // at the third failure, the second copy at its first after that.
  const int poison_calls = calls.Of("m-0");
  EXPECT_EQ(poison_calls, 4);
  EXPECT_GE(d.attempts, 3);
  // Every failure was counted, although each one rolled back its transaction.
  EXPECT_EQ(d.attempts, poison_calls);
  EXPECT_NE(d.error.find("card declined, call " + std::to_string(poison_calls)), std::string::npos) << d.error;
  ConsumerStats s = consumer.stats();
  EXPECT_EQ(s.dead_lettered, 2u);
  EXPECT_EQ(s.nacked, 2u);
  EXPECT_EQ(inbox_->counters().dead_lettered, 2u);
  EXPECT_EQ(FailureRows(), 1) << "the dead letter keeps the count";
}

TEST_F(ConsumerTest, MaxAttemptsZeroNeverDeadLetters) {
  PublishTwice(1);
  TestSource src(*queue_);
  CallCounter calls;
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    if (calls.Next(m.id) <= 7) return Status::Unavailable("down");
    return ChargeHandler()(tx, m);
  };
  Consumer::Options o = Drain();
  o.max_attempts = 0;
  o.backoff_max_ms = 1000;
  auto consumer_owned = MustOpen<Consumer>(src, *inbox_, h, o);
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  EXPECT_TRUE(DeadLetters().empty());
  EXPECT_EQ(calls.Of("m-0"), 8);
  ExpectExactlyOnce(1);
  ExpectQueueEmpty();
}

TEST_F(ConsumerTest, ConflictIsAckedAndDeadLetteredAsConflict) {
  for (int round = 0; round < 2; ++round) ASSERT_TRUE(queue_->Publish(Msg("m-0", "4000")).ok());
  for (int round = 0; round < 2; ++round) ASSERT_TRUE(queue_->Publish(Msg("m-0", "9900")).ok());
  PublishTwice(3);  // m-0 again (payload-of-m-0: a third payload), m-1, m-2
  TestSource src(*queue_);
  auto consumer_owned = MustOpen<Consumer>(src, *inbox_, ChargeHandler(), Drain());
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  ExpectQueueEmpty();
  EXPECT_EQ(Charges(*store_, "m-0"), 1);
  auto tx = store_->Begin();
  ASSERT_TRUE(tx.ok());
  auto cents = (*tx)->Query("SELECT cents FROM payments WHERE message_id = 'm-0'");
  ASSERT_TRUE(cents.ok());
  EXPECT_EQ(cents->rows[0][0].AsInt(), 4000) << "the first payload wins";
  tx->reset();
  std::vector<DeadLetter> dead = DeadLetters();
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].id, "m-0");
  EXPECT_EQ(dead[0].reason, "conflict");
  EXPECT_NE(dead[0].error.find(ToHex(FingerprintOf("4000"))), std::string::npos) << dead[0].error;
  InboxCounters c = inbox_->counters();
  EXPECT_EQ(c.applied, 3u);
  EXPECT_EQ(c.conflicts, 4u);  // two copies of 9900, two of the third payload
  EXPECT_EQ(c.duplicates, 3u);
  ConsumerStats s = consumer.stats();
  EXPECT_EQ(s.acked, 10u);
  EXPECT_EQ(s.nacked, 0u);
  EXPECT_EQ(s.dead_lettered, 0u) << "a conflict is counted by the inbox, not as a failure";
}

TEST_F(ConsumerTest, InvalidIdIsDeadLetteredAtOnceAndAcked) {
  PublishTwice(3);
  TestSource src(*queue_);
  // Some source hands out m-1 with an empty id (a broken producer).
  src.on_receive = [](std::vector<Delivery>& ds) {
    for (Delivery& d : ds)
      if (d.message.id == "m-1") d.message.id.clear();
  };
  CallCounter calls;
  Handler h = [&](Transaction& tx, const Message& m) {
    calls.Next(m.id);
    return ChargeHandler()(tx, m);
  };
  auto consumer_owned = MustOpen<Consumer>(src, *inbox_, h, Drain());
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  ExpectQueueEmpty();
  EXPECT_EQ(calls.Of(""), 0) << "the handler never sees an invalid id";
  EXPECT_EQ(Charges(*store_), 2);
  std::vector<DeadLetter> dead = DeadLetters();
  ASSERT_EQ(dead.size(), 2u);  // one per delivery: they are told apart by receipt
  for (const DeadLetter& d : dead) {
    EXPECT_EQ(d.reason, "failed");
    EXPECT_NE(d.id.find("invalid id"), std::string::npos) << d.id;
    EXPECT_NE(d.error.find("message id is empty"), std::string::npos) << d.error;
    EXPECT_EQ(d.payload, "payload-of-m-1");
  }
  EXPECT_EQ(consumer.stats().dead_lettered, 2u);
  EXPECT_EQ(FailureRows(), 0) << "a count keyed by a receipt is useless once dead-lettered";
}

// Two copies of one message in one batch, and the handler fails: one failure,
// not two. Counted twice, a message with max_attempts 2 would be dead-lettered
// after one real failure (and then applied by its retry).
TEST_F(ConsumerTest, CopiesInOneBatchCountOneFailure) {
  for (int i = 0; i < 2; ++i)
    for (int copy = 0; copy < 2; ++copy) ASSERT_TRUE(queue_->Publish(Msg(Id(i))).ok());
  TestSource src(*queue_);
  CallCounter calls;
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    IDEM_RETURN_IF_ERROR(ChargeHandler()(tx, m));
    if (m.id == "m-0" && calls.Next(m.id) == 1) return Status::Unavailable("down once");
    return Status::OK();
  };
  Consumer::Options o = Drain();
  o.batch = 4;
  o.max_attempts = 2;
  auto consumer_owned = MustOpen<Consumer>(src, *inbox_, h, o);
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  EXPECT_TRUE(DeadLetters().empty()) << DeadLetters().front().error;
  EXPECT_EQ(consumer.stats().dead_lettered, 0u);
  EXPECT_EQ(calls.Of("m-0"), 2);
  ExpectExactlyOnce(2);
  ExpectQueueEmpty();
  EXPECT_EQ(FailureRows(), 0);
}

TEST_F(ConsumerTest, PoisonCopiesInOneBatchAreDeadLetteredOnceAndBothAcked) {
  for (int i = 0; i < 2; ++i)
    for (int copy = 0; copy < 2; ++copy) ASSERT_TRUE(queue_->Publish(Msg(Id(i))).ok());
  TestSource src(*queue_);
  CallCounter calls;
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    IDEM_RETURN_IF_ERROR(ChargeHandler()(tx, m));
    if (m.id == "m-0") return Status::HandlerFailed("always, call " + std::to_string(calls.Next(m.id)));
    return Status::OK();
  };
  Consumer::Options o = Drain();
  o.batch = 4;
  o.max_attempts = 2;
  auto consumer_owned = MustOpen<Consumer>(src, *inbox_, h, o);
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  ExpectQueueEmpty();
  EXPECT_EQ(Charges(*store_, "m-0"), 0);
  EXPECT_EQ(Charges(*store_, "m-1"), 1);
  std::vector<DeadLetter> dead = DeadLetters();
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].id, "m-0");
  EXPECT_EQ(dead[0].attempts, calls.Of("m-0")) << "one failure per handler run";
  EXPECT_GE(dead[0].attempts, 2);
}

// A message applied by one copy after another copy failed: its failure count
// is forgotten even though the applying delivery was a first delivery.
TEST_F(ConsumerTest, FailureCountIsClearedWhenAnotherCopyApplies) {
  PublishTwice(1);
  TestSource src(*queue_);
  CallCounter calls;
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    if (calls.Next(m.id) == 1) return Status::Unavailable("down once");
    return ChargeHandler()(tx, m);
  };
  auto consumer_owned = MustOpen<Consumer>(src, *inbox_, h, Drain());
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  ExpectExactlyOnce(1);
  ExpectQueueEmpty();
  // The second copy (attempt 1) applied; the first came back as a duplicate.
  auto delivered = src.delivered();
  ASSERT_EQ(delivered.size(), 3u);
  EXPECT_EQ(delivered[1].second, 1);
  EXPECT_EQ(FailureRows(), 0);
}

// A Store that forwards to another and runs a hook before RecordFailure:
// the moment between a failed handler's rollback and its failure count.
class HookedStore final : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  std::function<void()> before_record_failure;
  Result<FailureCount> RecordFailure(const FailureRecord& f) override {
    if (before_record_failure) before_record_failure();
    return inner_.RecordFailure(f);
  }
};

// The lease runs out while the handler fails; before the failure is counted,
// another consumer takes the redelivery (and the other copy), applies the
// message and forgets its failures. The slow consumer's late count must not
// stay behind: nothing would ever clear it.
TEST_F(ConsumerTest, FailureCountedAfterTheLeaseWasLostAndTheMessageAppliedIsNotLeftBehind) {
  PublishTwice(1);
  HookedStore hooked(*store_);
  auto slow_owned = MustOpen<Inbox>(hooked, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& slow = *slow_owned;
  auto other_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  Inbox& other = *other_owned;
  bool raced = false;
  hooked.before_record_failure = [&] {
    if (raced) return;
    raced = true;
    env_.Advance(kLeaseMs + 1);
    auto got = queue_->Receive(10, 0);
    ASSERT_TRUE(got.ok());
    ASSERT_EQ(got->size(), 2u);
    for (const Delivery& r : *got) {
      ASSERT_TRUE(other.Handle(r.message, ChargeHandler()).ShouldAck());
      ASSERT_TRUE(store_->ClearFailures("payments", r.message.id).ok());
      ASSERT_TRUE(queue_->Ack(r).ok());
    }
  };
  TestSource src(*queue_);
  CallCounter calls;
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    if (calls.Next(m.id) == 1) return Status::Unavailable("slow and failing");
    return ChargeHandler()(tx, m);
  };
  auto consumer_owned = MustOpen<Consumer>(src, slow, h, Drain());
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  EXPECT_TRUE(raced);
  EXPECT_EQ(calls.Of("m-0"), 1);
  ExpectExactlyOnce(1);
  ExpectQueueEmpty();
  EXPECT_EQ(FailureRows(), 0);
}

TEST_F(ConsumerTest, ReceiveErrorsBackOffFromTheStartAfterASuccess) {
  PublishTwice(2);
  TestSource src(*queue_);
  // Receives 1-3 fail, then they work, then receive 6 fails once more.
  src.fail_receive = [](int n) { return (n <= 3 || n == 6) ? Status::Unavailable("broker restarting") : Status::OK(); };
  // The consumer's own clock records its sleeps (only receive errors sleep).
  class RecordingEnv final : public Env {
   public:
    explicit RecordingEnv(FakeEnv& inner) : inner_(inner) {}
    int64_t NowMs() override { return inner_.NowMs(); }
    void SleepMs(int64_t ms) override {
      std::lock_guard<std::mutex> l(mu);
      sleeps.push_back(ms);
      inner_.SleepMs(ms);
    }
    uint64_t Random() override { return inner_.Random(); }
    std::mutex mu;
    std::vector<int64_t> sleeps;

   private:
    FakeEnv& inner_;
  } env(env_);
  Consumer::Options o = Drain();
  o.receive_wait_ms = 0;  // receives 4 and 5 take everything; 6 fails; 7 is idle
  o.batch = 2;
  o.env = &env;
  auto consumer_owned = MustOpen<Consumer>(src, *inbox_, ChargeHandler(), o);
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  ExpectExactlyOnce(2);
  ExpectQueueEmpty();
  EXPECT_EQ(consumer.stats().receive_errors, 4u);
  ASSERT_EQ(env.sleeps.size(), 4u);
  const int64_t want[] = {100, 200, 400, 100};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_GE(env.sleeps[i], want[i]) << "error " << i + 1;
    EXPECT_LE(env.sleeps[i], want[i] + want[i] / 4) << "error " << i + 1;
  }
}

// ---------------------------------------------------------------------------
// Stopping.
// ---------------------------------------------------------------------------

TEST_F(ConsumerTest, StopBetweenReceiveAndStartGivesTheDeliveriesBackUnacked) {
  constexpr int kN = 6;
  PublishTwice(kN);
  TestSource src(*queue_);
  Consumer* running = nullptr;
  int received = 0;
  // Stop arrives while the first batch is on its way to the worker.
  src.on_receive = [&](std::vector<Delivery>& ds) {
    received += static_cast<int>(ds.size());
    if (!ds.empty()) running->Stop();
  };
  CallCounter calls;
  Handler h = [&](Transaction& tx, const Message& m) {
    calls.Next(m.id);
    return ChargeHandler()(tx, m);
  };
  Consumer::Options o{.batch = 4, .env = &env_};  // runs until Stop()
  auto consumer_owned = MustOpen<Consumer>(src, *inbox_, h, o);
  Consumer& consumer = *consumer_owned;
  running = &consumer;
  ASSERT_TRUE(consumer.Run().ok());
  EXPECT_TRUE(consumer.stopping());
  EXPECT_EQ(received, 4);
  EXPECT_EQ(calls.Total(), 0);
  EXPECT_EQ(Charges(*store_), 0);
  EXPECT_EQ(src.acked(), 0);
  ConsumerStats s = consumer.stats();
  EXPECT_EQ(s.acked, 0u);
  EXPECT_EQ(s.nacked, 4u);
  // Given back at once, not left to a lease that runs 10 s.
  auto st = queue_->Stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->ready, 2 * kN);
  EXPECT_EQ(st->leased, 0);

  // A new run takes everything: the given-back copies are their second delivery.
  TestSource src2(*queue_);
  auto again_owned = MustOpen<Consumer>(src2, *inbox_, h, Drain());
  Consumer& again = *again_owned;
  ASSERT_TRUE(again.Run().ok());
  ExpectExactlyOnce(kN);
  ExpectQueueEmpty();
  int redelivered = 0;
  for (auto& [id, attempt] : src2.delivered()) redelivered += attempt == 2;
  EXPECT_EQ(redelivered, 4);
}

TEST_F(ConsumerTest, StopFromAHandlerFinishesTheInFlightDeliveryAndReturns) {
  constexpr int kN = 5;
  PublishTwice(kN);
  TestSource src(*queue_);
  Consumer* running = nullptr;
  CallCounter calls;
  Handler h = [&](Transaction& tx, const Message& m) {
    if (calls.Next("all") == 3) running->Stop();
    return ChargeHandler()(tx, m);
  };
  auto consumer_owned = MustOpen<Consumer>(src, *inbox_, h, Consumer::Options{.env = &env_});
  Consumer& consumer = *consumer_owned;
  running = &consumer;
  ASSERT_TRUE(consumer.Run().ok());
  EXPECT_EQ(Charges(*store_), 3) << "the in-flight message committed";
  EXPECT_EQ(src.acked(), 3) << "and was acknowledged";
  auto st = queue_->Stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->ready, 2 * kN - 3);
  EXPECT_EQ(st->leased, 0);

  auto again_owned = MustOpen<Consumer>(src, *inbox_, ChargeHandler(), Drain());
  Consumer& again = *again_owned;
  ASSERT_TRUE(again.Run().ok());
  ExpectExactlyOnce(kN);
  ExpectQueueEmpty();
}

TEST_F(ConsumerTest, StopFromAnotherThreadEndsARunThatWaitsForMessages) {
  constexpr int kN = 10;
  PublishTwice(kN);
  TestSource src(*queue_);
  std::promise<void> all_acked;
  std::atomic<int> acks{0};
  src.on_ack = [&](const Delivery&) {
    if (++acks == 2 * kN) all_acked.set_value();
  };
  Consumer::Options o{.workers = 2, .env = &env_};  // runs until Stop()
  auto consumer_owned = MustOpen<Consumer>(src, *inbox_, ChargeHandler(), o);
  Consumer& consumer = *consumer_owned;
  auto run = std::async(std::launch::async, [&] { return consumer.Run(); });
  // Bounded waits that end a broken test instead of hanging it; not timing.
  ASSERT_EQ(all_acked.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  consumer.Stop();
  ASSERT_EQ(run.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_TRUE(run.get().ok());
  ExpectExactlyOnce(kN);
  ExpectQueueEmpty();
}

TEST_F(ConsumerTest, SigtermStopsARunWhenStopOnSignalsIsSet) {
  constexpr int kN = 4;
  PublishTwice(kN);
  TestSource src(*queue_);
  CallCounter calls;
  Handler h = [&](Transaction& tx, const Message& m) {
    if (calls.Next("all") == 2) ::raise(SIGTERM);
    return ChargeHandler()(tx, m);
  };
  auto consumer_owned = MustOpen<Consumer>(src, *inbox_, h, Consumer::Options{.env = &env_});
  Consumer& consumer = *consumer_owned;
  StopOnSignals(&consumer);
  Status s = consumer.Run();
  StopOnSignals(nullptr);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(consumer.stopping());
  EXPECT_EQ(Charges(*store_), 2);

  auto again_owned = MustOpen<Consumer>(src, *inbox_, ChargeHandler(), Drain());
  Consumer& again = *again_owned;
  ASSERT_TRUE(again.Run().ok());
  ExpectExactlyOnce(kN);
  ExpectQueueEmpty();
}

// Deliveries abandoned at SIGTERM (a handler that gives up because its
// consumer is stopping, as idem::http::Client does, and the rest of its
// batch) are given back as aborted: no failed event, no failure counted,
// no attempt recorded toward dead-lettering, and no handler run again.
TEST_F(ConsumerTest, DeliveriesAbandonedAtSigtermAreGivenBackWithoutCountingAFailure) {
  constexpr int kN = 4;
  for (int i = 0; i < kN; ++i) ASSERT_TRUE(queue_->Publish(Msg(Id(i))).ok());
  Recorder rec;
  auto inbox = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_, .observer = &rec});
  TestSource src(*queue_);
  CallCounter calls;
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    if (calls.Next("all") == 1) ::raise(SIGTERM);
    if (StopRequested()) return Status::Aborted("the consumer is stopping");
    return ChargeHandler()(tx, m);
  };
  // max_attempts 1: an abandoned delivery counted as a failure would be dead-lettered.
  auto consumer = MustOpen<Consumer>(src, *inbox, h, Consumer::Options{.batch = kN, .max_attempts = 1, .env = &env_});
  StopOnSignals(consumer.get());
  ASSERT_TRUE(consumer->Run().ok());
  StopOnSignals(nullptr);
  EXPECT_EQ(calls.Total(), 1) << "the rest of the batch is given back unrun";
  EXPECT_EQ(Charges(*store_), 0);
  EXPECT_EQ(rec.Of(EventKind::kFailed).size(), 0u);
  EXPECT_EQ(rec.Of(EventKind::kAborted).size(), static_cast<size_t>(kN));
  EXPECT_EQ(inbox->counters().failures, 0u);
  EXPECT_EQ(consumer->stats().dead_lettered, 0u);
  EXPECT_EQ(consumer->stats().nacked, static_cast<uint64_t>(kN));
  EXPECT_EQ(FailureRows(), 0) << "no attempt recorded";
  EXPECT_TRUE(DeadLetters().empty());

  auto again = MustOpen<Consumer>(src, *inbox, ChargeHandler(), Drain());
  ASSERT_TRUE(again->Run().ok());
  ExpectExactlyOnce(kN);
  ExpectQueueEmpty();
}

TEST_F(ConsumerTest, DrainModeReturnsOnAnEmptyQueue) {
  PublishTwice(2);
  TestSource src(*queue_);
  Consumer::Options o = Drain();
  o.workers = 4;
  auto consumer_owned = MustOpen<Consumer>(src, *inbox_, ChargeHandler(), o);
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  ExpectExactlyOnce(2);
  ExpectQueueEmpty();
  // Run again on the empty queue: returns at once, does nothing.
  auto idle_owned = MustOpen<Consumer>(src, *inbox_, ChargeHandler(), o);
  Consumer& idle = *idle_owned;
  ASSERT_TRUE(idle.Run().ok());
  EXPECT_EQ(idle.stats().received, 0u);
}

}  // namespace
}  // namespace idem::testing

namespace idem::testing {
namespace {

// Counts how the Consumer hands acks to its source.
class AckCounting final : public Source {
 public:
  explicit AckCounting(Source& inner) : inner_(inner) {}
  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override { return inner_.Receive(max, wait_ms); }
  Status Ack(const Delivery& d) override {
    if (!in_batch_) ++single_acks_;
    return inner_.Ack(d);
  }
  std::vector<Status> AckBatch(std::span<const Delivery> deliveries) override {
    batch_sizes_.push_back(deliveries.size());
    in_batch_ = true;
    std::vector<Status> out = Source::AckBatch(deliveries);  // Ack each, through this class
    in_batch_ = false;
    return out;
  }
  Status Nack(const Delivery& d, int64_t delay_ms) override { return inner_.Nack(d, delay_ms); }
  std::string_view Kind() const override { return inner_.Kind(); }
  int64_t lease_ms() const override { return inner_.lease_ms(); }

  Source& inner_;
  bool in_batch_ = false;  // one worker: no lock needed
  int single_acks_ = 0;
  std::vector<size_t> batch_sizes_;
};

// With batches, the acks of a batch's settled deliveries go to the source
// together, in one Source::AckBatch after the batch's transaction (SQS sends
// them as one DeleteMessageBatch); each is still counted and told as an ack.
TEST_F(ConsumerTest, TheAcksOfABatchGoToTheSourceInOneAckBatch) {
  PublishTwice(5);
  AckCounting src(*queue_);
  Consumer::Options o = Drain();
  o.batch = 10;
  auto consumer = MustOpen<Consumer>(src, *inbox_, ChargeHandler(), o);
  ASSERT_TRUE(consumer->Run().ok());
  EXPECT_EQ(src.single_acks_, 0) << "every ack of a batch went through AckBatch";
  size_t total = 0, largest = 0;
  for (size_t n : src.batch_sizes_) {
    total += n;
    largest = std::max(largest, n);
  }
  EXPECT_EQ(total, 10u);
  EXPECT_GT(largest, 1u);
  EXPECT_EQ(consumer->stats().acked, 10u);
  ExpectExactlyOnce(5);
  ExpectQueueEmpty();
}

}  // namespace
}  // namespace idem::testing
