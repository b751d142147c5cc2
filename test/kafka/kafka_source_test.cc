// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::kafka::Source on librdkafka's mock cluster (3 brokers, a topic of 4
// partitions, a fresh cluster per test), with the Consumer and an Inbox on
// SQLite. Every message is published twice (a producer retry: two records,
// one id), so every test sees each id delivered at least twice.
//
// Nothing waits for time to pass: a test waits for a condition (effects
// counted in the store, offsets committed in Kafka) in a bounded loop.
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "idem/consumer.h"
#include "idem/inbox.h"
#include "idem/kafka/offset_inbox.h"
#include "idem/kafka/source.h"
#include "idem/sqlite/store.h"
#include "mock_kafka.h"
#include "util/relay_util.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

constexpr char kTopic[] = "payments";
constexpr int kPartitions = 4;
// Kafka protocol API keys (rdkafka_protocol.h is not public).
constexpr int16_t kApiFetch = 1;
constexpr int16_t kApiOffsetCommit = 8;

std::string Id(int i) { return "m-" + std::to_string(i); }

// Runs a Consumer on its own thread until the test stops it.
class Runner {
 public:
  Runner(Source& source, Inbox& inbox, Handler handler, Consumer::Options options)
      : owned_(MustOpen<Consumer>(source, inbox, std::move(handler), options)),
        consumer_(*owned_),
        thread_([this] { status_ = consumer_.Run(); }) {}
  ~Runner() { Stop(); }
  void Stop() {
    consumer_.Stop();
    if (thread_.joinable()) thread_.join();
  }
  Consumer& consumer() { return consumer_; }

 private:
  std::unique_ptr<Consumer> owned_;
  Consumer& consumer_;
  Status status_;
  std::thread thread_;
};

// Forwards to a source; runs `before_ack` first (a test holds an ack there).
class GatedSource final : public Source {
 public:
  GatedSource(Source& inner, std::function<void(const Delivery&)> before_ack)
      : inner_(inner), before_ack_(std::move(before_ack)) {}
  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override { return inner_.Receive(max, wait_ms); }
  Status Ack(const Delivery& d) override {
    before_ack_(d);
    return inner_.Ack(d);
  }
  Status Nack(const Delivery& d, int64_t delay_ms) override { return inner_.Nack(d, delay_ms); }
  std::string_view Kind() const override { return inner_.Kind(); }

 private:
  Source& inner_;
  std::function<void(const Delivery&)> before_ack_;
};

class KafkaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kafka_ = std::make_unique<MockKafka>(kTopic, kPartitions, "payments");
    ASSERT_TRUE(kafka_->ok()) << kafka_->error();
    mock_ = kafka_->cluster();
    brokers_ = kafka_->brokers();

    auto s = sqlite::Store::Open({.path = dir_.File("store.db"), .synchronous = sqlite::Synchronous::kNormal});
    ASSERT_OK(s);
    store_ = std::move(*s);
    ASSERT_TRUE(CreatePayments(*store_).ok());
    inbox_ = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments"});
  }

  void TearDown() override { kafka_.reset(); }

  // Short timers and backoffs: the mock cluster answers at once.
  kafka::Source::Options SourceOptions(int64_t revoke_wait_ms = 5'000) {
    return {.brokers = brokers_,
            .topic = kTopic,
            .group = "payments",
            .session_timeout_ms = 6'000,
            .heartbeat_interval_ms = 200,
            .revoke_wait_ms = revoke_wait_ms,
            .config = {{"fetch.wait.max.ms", "20"},
                       {"fetch.error.backoff.ms", "20"},
                       {"reconnect.backoff.ms", "20"},
                       {"retry.backoff.ms", "20"},
                       {"topic.metadata.refresh.interval.ms", "500"}}};
  }

  std::unique_ptr<kafka::Source> OpenSource(int64_t revoke_wait_ms = 5'000) {
    auto s = kafka::Source::Open(SourceOptions(revoke_wait_ms));
    EXPECT_OK(s);
    return s.ok() ? std::move(*s) : nullptr;
  }

  // Publishes m-first..m-(first+n-1), then all of them again (a producer
  // retry: same id header, a second record).
  void PublishTwice(int n, int first = 0, const std::function<std::string(int)>& payload = {}) {
    auto p = kafka::Publisher::Open({.brokers = brokers_, .topic = kTopic, .config = {{"linger.ms", "5"}}});
    ASSERT_OK(p);
    for (int round = 0; round < 2; ++round)
      for (int i = first; i < first + n; ++i) {
        Message m = Msg(Id(i), payload ? payload(i) : "");
        ASSERT_TRUE((*p)->Produce(m).ok());
      }
    Status f = (*p)->Flush();
    ASSERT_TRUE(f.ok()) << f;
  }

  Consumer::Options Options(int workers = 2) {
    return {.workers = workers,
            .batch = 1,
            .max_attempts = 5,
            .backoff_base_ms = 5,
            .backoff_max_ms = 50,
            .receive_wait_ms = 100};
  }

  rd_kafka_t* Admin() { return kafka_->Admin(); }

  bool AllCommitted() { return kafka_->AllCommitted(); }

  // Waits until `n` effects exist and every offset is committed; commits
  // what the sources acknowledged once the effects are all there (an async
  // commit may have failed on an injected error).
  bool WaitDrained(int n, std::vector<kafka::Source*> sources) {
    return WaitFor([&] {
      if (Charges(*store_) < n) return false;
      for (kafka::Source* s : sources) (void)s->CommitSync();
      return AllCommitted();
    });
  }

  // One payments row and one marker per message m-0..m-(n-1), nothing else.
  void ExpectExactlyOnce(int n) {
    for (int i = 0; i < n; ++i) EXPECT_EQ(Charges(*store_, Id(i)), 1) << Id(i);
    EXPECT_EQ(Charges(*store_), n);
    auto markers = store_->CountMarkers("payments");
    ASSERT_TRUE(markers.ok());
    EXPECT_EQ(*markers, n);
  }

  // One payments row per message and no marker at all (offset mode).
  void ExpectExactlyOnceWithoutMarkers(int n) {
    for (int i = 0; i < n; ++i) EXPECT_EQ(Charges(*store_, Id(i)), 1) << Id(i);
    EXPECT_EQ(Charges(*store_), n);
    auto markers = store_->CountMarkers("payments");
    ASSERT_TRUE(markers.ok());
    EXPECT_EQ(*markers, 0);
  }

  TempDir dir_;
  std::unique_ptr<MockKafka> kafka_;
  rd_kafka_mock_cluster_t* mock_ = nullptr;  // kafka_'s
  std::string brokers_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Inbox> inbox_;
};

// Receives until `n` deliveries arrived (bounded).
std::vector<Delivery> ReceiveN(kafka::Source& src, size_t n) {
  std::vector<Delivery> out;
  WaitFor([&] {
    auto got = src.Receive(static_cast<int>(n - out.size()), 100);
    EXPECT_OK(got);
    if (got.ok()) out.insert(out.end(), got->begin(), got->end());
    return out.size() >= n;
  });
  return out;
}

TEST_F(KafkaTest, AProducerRetryGivesTwoDeliveriesWithOneId) {
  constexpr int kN = 10;
  PublishTwice(kN, 0, [](int i) { return std::to_string(100 + i); });
  auto src = OpenSource();
  ASSERT_TRUE(src);
  std::vector<Delivery> got = ReceiveN(*src, 2 * kN);
  ASSERT_EQ(got.size(), 2u * kN);
  std::map<std::string, int> per_id;
  std::set<std::string> receipts;
  for (const Delivery& d : got) {
    ++per_id[d.message.id];
    receipts.insert(d.receipt);
    EXPECT_EQ(d.message.attempt, 0);  // Kafka keeps no delivery count
    EXPECT_EQ(d.message.payload, std::to_string(100 + std::atoi(d.message.id.c_str() + 2)));
    EXPECT_EQ(d.message.Header("id"), d.message.id);
    auto r = kafka::DecodeReceipt(d.receipt);
    ASSERT_OK(r);
    EXPECT_EQ(r->topic, kTopic);
  }
  EXPECT_EQ(receipts.size(), 2u * kN);  // two records, two receipts
  ASSERT_EQ(per_id.size(), static_cast<size_t>(kN));
  for (auto& [id, n] : per_id) EXPECT_EQ(n, 2) << id;
  for (const Delivery& d : got) EXPECT_TRUE(src->Ack(d).ok());
  EXPECT_TRUE(src->CommitSync().ok());
  EXPECT_TRUE(WaitFor([&] { return AllCommitted(); }));
}

TEST_F(KafkaTest, AcksCommitOnlyTheAcknowledgedPrefixOfAPartition) {
  // All in partition 0, in order.
  {
    auto p = kafka::Publisher::Open({.brokers = brokers_, .topic = kTopic});
    ASSERT_TRUE(p.ok());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE((*p)->Produce(Msg(Id(i)), {.partition = 0}).ok());
    ASSERT_OK((*p)->Flush());
  }
  auto src = OpenSource();
  std::vector<Delivery> got = ReceiveN(*src, 3);
  ASSERT_EQ(got.size(), 3u);
  auto committed = [&]() -> int64_t {
    rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(list, kTopic, 0);
    int64_t off = rd_kafka_committed(Admin(), list, 5'000) == RD_KAFKA_RESP_ERR_NO_ERROR ? list->elems[0].offset : -99;
    rd_kafka_topic_partition_list_destroy(list);
    return off;
  };
  // Offsets 1 and 2 acknowledged, 0 not: nothing may be committed past 0.
  ASSERT_TRUE(src->Ack(got[2]).ok());
  ASSERT_TRUE(src->Ack(got[1]).ok());
  ASSERT_TRUE(src->CommitSync().ok());
  EXPECT_LE(committed(), 0);
  // Offset 0 acknowledged: the whole prefix, 3.
  ASSERT_TRUE(src->Ack(got[0]).ok());
  ASSERT_TRUE(src->CommitSync().ok());
  EXPECT_EQ(committed(), 3);
}

TEST_F(KafkaTest, ConsumerAppliesEachMessageOnceAndCommitsEveryOffset) {
  constexpr int kN = 100;
  PublishTwice(kN);
  auto src = OpenSource();
  Runner run(*src, *inbox_, ChargeHandler(), Options());
  ASSERT_TRUE(WaitDrained(kN, {src.get()}));
  run.Stop();
  ExpectExactlyOnce(kN);
  InboxCounters c = inbox_->counters();
  EXPECT_EQ(c.applied, static_cast<uint64_t>(kN));
  EXPECT_GE(c.duplicates, static_cast<uint64_t>(kN));
  EXPECT_EQ(run.consumer().stats().dead_lettered, 0u);
}

TEST_F(KafkaTest, AConsumerThatCommittedButNeverAckedIsAbsorbedByTheNextMember) {
  constexpr int kN = 40;
  PublishTwice(kN);
  int applied_by_first = 0;
  {
    // Applies (commits in the store) what it receives, then goes away
    // without a single ack: a crash between commit and ack.
    auto first = OpenSource();
    std::vector<Delivery> got = ReceiveN(*first, 30);
    ASSERT_GE(got.size(), 30u);
    for (const Delivery& d : got) {
      Outcome o = inbox_->Handle(d.message, ChargeHandler());
      ASSERT_TRUE(o.ShouldAck()) << o.ToString();
      applied_by_first += o.applied() ? 1 : 0;
    }
    EXPECT_GT(applied_by_first, 0);
  }
  EXPECT_TRUE(WaitFor([&] { return !AllCommitted(); }));  // nothing was acknowledged

  auto second_inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments"});
  Inbox& second_inbox = *second_inbox_owned;
  auto second = OpenSource();
  Runner run(*second, second_inbox, ChargeHandler(), Options());
  ASSERT_TRUE(WaitDrained(kN, {second.get()}));
  run.Stop();
  ExpectExactlyOnce(kN);
  // The second member got every record again, the first member's included.
  InboxCounters c = second_inbox.counters();
  EXPECT_EQ(c.applied, static_cast<uint64_t>(kN - applied_by_first));
  EXPECT_GE(c.duplicates, static_cast<uint64_t>(kN + applied_by_first));
}

TEST_F(KafkaTest, AMemberJoiningMidRunRebalancesWithoutLossOrDoubles) {
  constexpr int kN = 200;
  constexpr int kMore = 100;
  PublishTwice(kN);
  auto a = OpenSource();
  std::atomic<int> calls{0};
  Handler h = [&](Transaction& tx, const Message& m) {
    calls.fetch_add(1);
    return ChargeHandler()(tx, m);
  };
  // One delivery of the first member is still being worked on (committed,
  // not yet acknowledged) when the rebalance starts: it must be allowed to
  // finish before its partition is given up. (Held at the ack, not in the
  // handler: a handler holds SQLite's write lock.)
  std::atomic<int> acks{0};
  std::atomic<bool> gated{false};
  GatedSource gate(*a, [&](const Delivery&) {
    if (acks.fetch_add(1) >= kN / 4 && !gated.exchange(true)) {
      EXPECT_TRUE(WaitFor([&] { return a->stats().revocations >= 1; }));
    }
  });
  Runner run_a(gate, *inbox_, h, Options());
  ASSERT_TRUE(WaitFor([&] { return gated.load(); }));
  auto b = OpenSource();
  Runner run_b(*b, *inbox_, h, Options());
  // More records once the group is two: both members have work.
  ASSERT_TRUE(WaitFor([&] { return !b->Assignment().empty(); }));
  PublishTwice(kMore, kN);
  ASSERT_TRUE(WaitDrained(kN + kMore, {a.get(), b.get()}));
  run_a.Stop();
  run_b.Stop();
  ExpectExactlyOnce(kN + kMore);
  EXPECT_EQ(calls.load(), kN + kMore);    // no handler ran twice for one message
  EXPECT_GE(a->stats().revocations, 1u);  // a gave partitions up
  EXPECT_GE(a->stats().assignments, 2u);
  EXPECT_GE(b->stats().assignments, 1u);
  EXPECT_GT(b->stats().delivered, 0u);
  // The work in progress finished before its partition was given up.
  EXPECT_EQ(a->stats().abandoned, 0u);
  EXPECT_EQ(run_a.consumer().stats().ack_errors, 0u);
}

TEST_F(KafkaTest, CompetingMembersShareTheTopicAndApplyEachMessageOnce) {
  constexpr int kN = 150;
  auto a = OpenSource();
  auto b = OpenSource();
  auto c = OpenSource();
  Runner run_a(*a, *inbox_, ChargeHandler(), Options(1));
  Runner run_b(*b, *inbox_, ChargeHandler(), Options(2));
  Runner run_c(*c, *inbox_, ChargeHandler(), Options(1));
  PublishTwice(kN);
  ASSERT_TRUE(WaitDrained(kN, {a.get(), b.get(), c.get()}));
  run_a.Stop();
  run_b.Stop();
  run_c.Stop();
  ExpectExactlyOnce(kN);
  const uint64_t total = a->stats().delivered + b->stats().delivered + c->stats().delivered;
  EXPECT_GE(total, 2u * kN);
}

TEST_F(KafkaTest, InjectedBrokerErrorsMidRunLoseNothingAndDoubleNothing) {
  constexpr int kHalf = 100;
  auto src = OpenSource();
  Runner run(*src, *inbox_, ChargeHandler(), Options());
  PublishTwice(kHalf);
  ASSERT_TRUE(WaitDrained(kHalf, {src.get()}));
  // The consumer is running; the second half meets the faults.
  rd_kafka_mock_push_request_errors(mock_, kApiFetch, 6, RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
                                    RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION,
                                    RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE, RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
                                    RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT);
  rd_kafka_mock_push_request_errors(mock_, kApiOffsetCommit, 6, RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
                                    RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE,
                                    RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS,
                                    RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS, RD_KAFKA_RESP_ERR_NOT_COORDINATOR);
  PublishTwice(kHalf, kHalf);
  // And a broker down for a while: its partitions stall, the others go on.
  ASSERT_EQ(rd_kafka_mock_broker_set_down(mock_, 2), RD_KAFKA_RESP_ERR_NO_ERROR);
  const int64_t before = Charges(*store_);
  (void)WaitFor([&] { return Charges(*store_) >= before + kHalf / 4; }, 5'000);
  ASSERT_EQ(rd_kafka_mock_broker_set_up(mock_, 2), RD_KAFKA_RESP_ERR_NO_ERROR);
  ASSERT_TRUE(WaitDrained(2 * kHalf, {src.get()}));
  run.Stop();
  ExpectExactlyOnce(2 * kHalf);
  EXPECT_EQ(inbox_->counters().applied, static_cast<uint64_t>(2 * kHalf));
}

// The outbox relay across a cluster restart: after the relay's third batch
// every broker goes down, and comes back 500 ms later while the relay's
// batch waits for its delivery reports (the idempotent producer retries
// inside librdkafka, within publish_timeout_ms). Every row arrives (each
// message was added twice), as often as the cluster confirmed it, each
// key's first copies in order.
TEST_F(KafkaTest, TheOutboxRelayRidesOutABrokerRestartAndLosesNothing) {
  RelayWorkload w(60, 6);
  auto outbox_store = OpenOutboxStore(dir_.File("outbox.db"));
  ASSERT_OK(outbox_store);
  for (int add = 0; add < 2; ++add) ASSERT_TRUE(AddInTransactions(**outbox_store, w.messages, 10).ok());
  auto p = kafka::Publisher::Open({.brokers = brokers_, .topic = kTopic});
  ASSERT_OK(p);
  auto set_all = [&](bool up) {
    for (int32_t b = 1; b <= 3; ++b)
      ASSERT_EQ(up ? rd_kafka_mock_broker_set_up(mock_, b) : rd_kafka_mock_broker_set_down(mock_, b),
                RD_KAFKA_RESP_ERR_NO_ERROR);
  };
  auto stats = DrainAcrossABrokerRestart(
      **outbox_store, **p, dir_.File("published.log"), 3, [&] { set_all(false); },
      [&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        set_all(true);
      });
  ASSERT_OK(stats);
  EXPECT_EQ(stats->dead_lettered, 0u);
  const std::map<RelayedRow, int> confirmed = ReadPublishLog(dir_.File("published.log"));
  EXPECT_EQ(confirmed.size(), 2 * w.messages.size()) << "every row confirmed";
  auto src = OpenSource();
  ASSERT_TRUE(src);
  std::vector<Delivery> got = ReceiveN(*src, CountCopies(confirmed));
  ASSERT_EQ(got.size(), CountCopies(confirmed));
  ExpectCopiesAsConfirmed(ExpectRelayed(w, got, 2), confirmed);
  for (const Delivery& d : got) EXPECT_TRUE(src->Ack(d).ok()) << d.message.id;
  auto left = src->Receive(1000, 500);
  ASSERT_OK(left);
  EXPECT_TRUE(left->empty()) << left->size() << " copies left";
}

TEST_F(KafkaTest, APoisonMessageIsDeadLetteredAndTheRestApplyOnce) {
  constexpr int kN = 30;
  constexpr int kPoison = 7;
  PublishTwice(kN, 0, [](int i) { return i == kPoison ? std::string("poison") : std::to_string(1000 + i); });
  std::atomic<int> poison_calls{0};
  Handler h = [&](Transaction& tx, const Message& m) -> Status {
    if (m.payload == "poison") {
      poison_calls.fetch_add(1);
      return Status::HandlerFailed("cannot charge a poison message");
    }
    return ChargeHandler()(tx, m);
  };
  auto src = OpenSource();
  Consumer::Options o = Options();
  o.max_attempts = 3;
  Runner run(*src, *inbox_, h, o);
  ASSERT_TRUE(WaitFor([&] {
    auto d = store_->ListDeadLetters("payments", 10);
    return d.ok() && !d->empty() && Charges(*store_) >= kN - 1;
  }));
  ASSERT_TRUE(WaitDrained(kN - 1, {src.get()}));
  run.Stop();
  for (int i = 0; i < kN; ++i) EXPECT_EQ(Charges(*store_, Id(i)), i == kPoison ? 0 : 1) << Id(i);
  auto dead = store_->ListDeadLetters("payments", 10);
  ASSERT_TRUE(dead.ok());
  ASSERT_EQ(dead->size(), 1u);
  EXPECT_EQ((*dead)[0].id, Id(kPoison));
  EXPECT_EQ((*dead)[0].reason, "failed");
  EXPECT_GE(poison_calls.load(), 3);
  EXPECT_GE(src->stats().seeks, 1u);  // the nacks went back in the log
}

TEST_F(KafkaTest, AckOfARevokedPartitionsReceiptIsLeaseLost) {
  constexpr int kN = 20;
  PublishTwice(kN);
  auto a = OpenSource(/*revoke_wait_ms=*/0);
  std::vector<Delivery> got = ReceiveN(*a, 1);
  ASSERT_EQ(got.size(), 1u);
  auto b = OpenSource();
  ASSERT_TRUE(WaitFor([&] {
    (void)a->Receive(1, 50);
    (void)b->Receive(1, 50);
    return a->stats().revocations >= 1 && !b->Assignment().empty() && !a->Assignment().empty();
  }));
  Status ack = a->Ack(got[0]);
  EXPECT_EQ(ack.code(), Code::kLeaseLost) << ack;
  EXPECT_EQ(a->Nack(got[0], 0).code(), Code::kLeaseLost);
  EXPECT_GE(a->stats().abandoned, 1u);
  // A receipt that is not Kafka's is refused, not lost.
  Delivery foreign = got[0];
  foreign.receipt = "not-a-receipt";
  EXPECT_EQ(a->Ack(foreign).code(), Code::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// Ordered-log offset mode: the last applied offset per partition, stored
// with the work; no per-message markers.
// ---------------------------------------------------------------------------

// Receives one record at a time, hands it to the OffsetInbox, acks unless
// `ack` says not to; until `n` deliveries were handled (bounded).
int HandleInOrder(kafka::Source& src, kafka::OffsetInbox& oi, int n, InboxCounters* counts, bool ack = true) {
  int handled = 0;
  WaitFor([&] {
    auto got = src.Receive(1, 100);
    EXPECT_OK(got);
    for (const Delivery& d : got.ok() ? *got : std::vector<Delivery>{}) {
      Outcome o = oi.Handle(d, ChargeHandler());
      EXPECT_TRUE(o.ShouldAck()) << o.ToString();
      (o.applied() ? counts->applied : counts->duplicates)++;
      ++handled;
      if (ack) {
        EXPECT_TRUE(src.Ack(d).ok());
      }
    }
    return handled >= n;
  });
  return handled;
}

TEST_F(KafkaTest, OffsetModeAppliesNothingTwiceAfterACrashAndWritesNoMarkers) {
  constexpr int kN = 60;
  constexpr int kFirst = 25;
  // Once each: this mode deduplicates redeliveries of a record, not
  // producer retries (another record, another offset).
  {
    auto p = kafka::Publisher::Open({.brokers = brokers_, .topic = kTopic});
    ASSERT_TRUE(p.ok());
    for (int i = 0; i < kN; ++i) ASSERT_TRUE((*p)->Produce(Msg(Id(i))).ok());
    ASSERT_OK((*p)->Flush());
  }
  auto oi = kafka::OffsetInbox::Open(*store_, {.consumer = "payments"});
  ASSERT_OK(oi);
  auto with_stored_offsets = [&](std::string group) {
    kafka::Source::Options o = SourceOptions();
    o.group = std::move(group);
    o.start_offset = (*oi)->StartOffsets();
    auto s = kafka::Source::Open(o);
    EXPECT_OK(s);
    return s.ok() ? std::move(*s) : nullptr;
  };

  // A member applies kFirst records and never acknowledges one: a crash
  // after each commit, before each ack. Kafka's committed offsets stay put.
  InboxCounters first;
  {
    auto a = with_stored_offsets("payments");
    EXPECT_EQ(HandleInOrder(*a, **oi, kFirst, &first, /*ack=*/false), kFirst);
  }
  EXPECT_EQ(first.applied, static_cast<uint64_t>(kFirst));
  EXPECT_EQ(Charges(*store_), kFirst);

  // The next consumer starts each partition after its stored offset: it is
  // handed only what was not applied, and applies all of it. It joins a
  // group of its own, which has no committed offsets at all (without
  // start_offset it would begin at the start of the log), so the offsets
  // stored with the work alone decide, and the handover does not wait on the
  // mock cluster's rebalance of the crashed member's group.
  InboxCounters second;
  {
    auto b = with_stored_offsets("payments-next");
    EXPECT_EQ(HandleInOrder(*b, **oi, kN - kFirst, &second), kN - kFirst)
        << "assignments " << b->stats().assignments << ", revocations " << b->stats().revocations;
    EXPECT_EQ(b->stats().delivered, static_cast<uint64_t>(kN - kFirst));
  }
  EXPECT_EQ(second.applied, static_cast<uint64_t>(kN - kFirst));
  EXPECT_EQ(second.duplicates, 0u);

  // A member that ignores the stored offsets (another group, from the
  // start of the log) gets every record again: each is skipped.
  InboxCounters replay;
  {
    kafka::Source::Options o = SourceOptions();
    o.group = "replay";
    auto c = kafka::Source::Open(o);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(HandleInOrder(**c, **oi, kN, &replay), kN);
  }
  EXPECT_EQ(replay.applied, 0u);
  EXPECT_EQ(replay.duplicates, static_cast<uint64_t>(kN));

  ExpectExactlyOnceWithoutMarkers(kN);
  // One offset row per partition, none per message.
  auto tx = store_->Begin();
  ASSERT_TRUE(tx.ok());
  auto rows = (*tx)->Query("SELECT count(*), sum(last_offset + 1) FROM idem_kafka_offsets WHERE consumer = 'payments'");
  ASSERT_OK(rows);
  EXPECT_LE(rows->rows[0][0].AsInt(), kPartitions);
  EXPECT_EQ(rows->rows[0][1].AsInt(), kN);  // each partition's end
}

}  // namespace
}  // namespace idem::testing
