// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Late members on Kafka (librdkafka's mock cluster), on SQLite and
// PostgreSQL:
//   - OffsetInbox: a member held inside its handler past
//     max.poll.interval.ms (its source's keep_alive off, so it becomes a
//     zombie) while another member of the group takes its partition over
//     and handles the same and later records. Exactly one effect per record,
//     and the stored offset never moves back, whether the zombie wrote its
//     effect before the hold or after it.
//   - kafka::Source::Options::keep_alive: a handler held past
//     max.poll.interval.ms does not cost the member its partitions.
//   - kafka::Source::Horizon: the oldest record the group may still be
//     handed, from its committed offsets (the purge's guard, retention.h).
// Each test has its own topic and group. Every record is delivered at least
// twice: to the zombie and its successor, and again to a member of another
// group that replays the log from its start.
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "idem/env.h"
#include "idem/kafka/offset_inbox.h"
#include "idem/kafka/source.h"
#include "idem/postgres/store.h"
#include "idem/sqlite/store.h"
#include "mock_kafka.h"
#include "postgres/pg_test_util.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

constexpr int kRecords = 10;
constexpr int kHeldOffset = 5;  // the record the zombie is held in

int64_t NowSteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A gate a handler waits at until the test opens it.
class Gate {
 public:
  void Wait() {
    std::unique_lock<std::mutex> l(mu_);
    entered_ = true;
    cv_.notify_all();
    cv_.wait(l, [&] { return open_; });
  }
  void Open() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool entered() {
    std::lock_guard<std::mutex> l(mu_);
    return entered_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool entered_ = false;
  bool open_ = false;
};

// A non-idempotent effect: one ledger balance bumped, one row per run.
Status CreateLedger(Store& store) {
  IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
  IDEM_RETURN_IF_ERROR(tx->Exec("CREATE TABLE IF NOT EXISTS ledger(name TEXT PRIMARY KEY, balance BIGINT)").status());
  IDEM_RETURN_IF_ERROR(tx->Exec("CREATE TABLE IF NOT EXISTS ledger_runs(message_id TEXT NOT NULL)").status());
  IDEM_RETURN_IF_ERROR(tx->Exec("INSERT INTO ledger(name, balance) VALUES ('acct', 0)").status());
  return tx->Commit();
}
Status Bump(Transaction& tx, const Message& m) {
  IDEM_RETURN_IF_ERROR(tx.Exec("UPDATE ledger SET balance = balance + 1 WHERE name = 'acct'").status());
  return tx.Exec("INSERT INTO ledger_runs(message_id) VALUES ($1)", {m.id}).status();
}
int64_t One(Store& store, const std::string& sql) {
  auto tx = store.Begin();
  if (!tx.ok()) return -1;
  auto rows = (*tx)->Query(sql);
  if (!rows.ok() || rows->rows.empty()) return -1;
  return rows->rows[0][0].AsInt();
}

enum class Hold { kBeforeWrites, kAfterWrites };

struct Param {
  const char* store;
  Hold hold;
};

std::string Name(const ::testing::TestParamInfo<Param>& p) {
  return std::string(p.param.store) +
         (p.param.hold == Hold::kBeforeWrites ? "_HeldBeforeItsWrites" : "_HeldAfterItsWrites");
}

class KafkaLateMemberTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    static std::atomic<int> n{0};
    topic_ = "ledger-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
    group_ = topic_ + "-group";
    kafka_ = std::make_unique<MockKafka>(topic_, 1, group_);
    ASSERT_TRUE(kafka_->ok()) << kafka_->error();
    if (std::string(GetParam().store) == "postgres") url_ = FreshSchemaUrl();
    setup_ = OpenStore();
    ASSERT_NE(setup_, nullptr);
    ASSERT_OK(CreateLedger(*setup_));
  }

  // Each member has a store object of its own, as separate processes would.
  std::unique_ptr<Store> OpenStore() {
    Result<std::unique_ptr<Store>> s = Status::Internal("no store");
    if (url_.empty()) {
      // A short busy timeout: a member waiting for the zombie's write lock
      // gives its record back soon (kBusy), as a PostgreSQL member does after
      // lock_wait_ms.
      s = sqlite::Store::Open({.path = dir_.File("store.db"), .busy_timeout_ms = 500});
    } else {
      s = postgres::Store::Open({.url = url_});
    }
    EXPECT_OK(s);
    return s.ok() ? std::move(*s) : nullptr;
  }

  kafka::Source::Options SourceOptions(bool keep_alive, std::string group = "") {
    return {.brokers = kafka_->brokers(),
            .topic = topic_,
            .group = group.empty() ? group_ : group,
            .session_timeout_ms = 3'000,
            .heartbeat_interval_ms = 200,
            .max_poll_interval_ms = 3'000,
            .keep_alive = keep_alive,
            .revoke_wait_ms = 0,
            .config = {{"fetch.wait.max.ms", "20"},
                       {"fetch.error.backoff.ms", "20"},
                       {"reconnect.backoff.ms", "20"},
                       {"retry.backoff.ms", "20"},
                       {"topic.metadata.refresh.interval.ms", "500"}}};
  }

  void Publish() {
    auto p = kafka::Publisher::Open({.brokers = kafka_->brokers(), .topic = topic_});
    ASSERT_OK(p);
    for (int i = 0; i < kRecords; ++i) ASSERT_OK((*p)->Produce(Msg("r-" + std::to_string(i))));
    ASSERT_OK((*p)->Flush());
  }

  TempDir dir_;
  std::string topic_, group_, url_;
  std::unique_ptr<MockKafka> kafka_;
  std::unique_ptr<Store> setup_;
};

TEST_P(KafkaLateMemberTest, AZombieAndTheNewOwnerApplyEachRecordOnceAndTheOffsetNeverMovesBack) {
  Publish();
  auto store_a = OpenStore();
  auto store_b = OpenStore();
  auto oi_a = kafka::OffsetInbox::Open(*store_a, {.consumer = "ledger"});
  auto oi_b = kafka::OffsetInbox::Open(*store_b, {.consumer = "ledger", .lock_wait_ms = 300});
  ASSERT_OK(oi_a);
  ASSERT_OK(oi_b);

  // Member A: its source does not keep the membership alive, so a handler
  // held past max.poll.interval.ms makes it leave the group: a zombie.
  kafka::Source::Options ao = SourceOptions(/*keep_alive=*/false);
  ao.start_offset = (*oi_a)->StartOffsets();
  auto a = kafka::Source::Open(ao);
  ASSERT_OK(a);
  int handled_by_a = 0;
  ASSERT_TRUE(WaitFor([&] {
    auto got = (*a)->Receive(1, 100);
    EXPECT_OK(got);
    for (const Delivery& d : got.ok() ? *got : std::vector<Delivery>{}) {
      Outcome o = (*oi_a)->Handle(d, Bump);
      EXPECT_TRUE(o.applied()) << o.ToString();
      EXPECT_OK((*a)->Ack(d));
      ++handled_by_a;
    }
    return handled_by_a == kHeldOffset;
  }));

  // A takes the next record and is held inside its handler.
  auto held = (*a)->Receive(1, 5'000);
  ASSERT_OK(held);
  ASSERT_EQ(held->size(), 1u);
  ASSERT_EQ(kafka::DecodeReceipt((*held)[0].receipt)->offset, kHeldOffset);
  const Hold hold = GetParam().hold;
  Gate gate;
  Outcome zombie;
  std::thread zombie_thread([&] {
    zombie = (*oi_a)->Handle((*held)[0], [&](Transaction& tx, const Message& m) -> Status {
      if (hold == Hold::kAfterWrites) IDEM_RETURN_IF_ERROR(Bump(tx, m));
      gate.Wait();
      return hold == Hold::kBeforeWrites ? Bump(tx, m) : Status::OK();
    });
  });
  ASSERT_TRUE(WaitFor([&] { return gate.entered(); }));

  // Member B joins; once A's max.poll.interval.ms ran out the group gives B
  // the partition, and B handles from the stored offset on, giving a record
  // back (nack) whenever A's open transaction keeps it waiting.
  kafka::Source::Options bo = SourceOptions(/*keep_alive=*/true);
  bo.start_offset = (*oi_b)->StartOffsets();
  auto b = kafka::Source::Open(bo);
  ASSERT_OK(b);
  std::atomic<bool> stop_b{false};
  std::atomic<int> busy{0}, b_applied{0}, b_duplicates{0};
  std::atomic<int64_t> b_last{-1};
  std::atomic<int64_t> b_assigned_at{0};
  std::thread member_b([&] {
    while (!stop_b) {
      auto got = (*b)->Receive(1, 100);
      if (b_assigned_at == 0 && !(*b)->Assignment().empty()) b_assigned_at = NowSteadyMs();
      if (!got.ok()) continue;
      for (const Delivery& d : *got) {
        Outcome o = (*oi_b)->Handle(d, Bump);
        if (o.ShouldAck()) {
          (o.applied() ? b_applied : b_duplicates)++;
          b_last = kafka::DecodeReceipt(d.receipt)->offset;
          (void)(*b)->Ack(d);
        } else {
          if (o.status.code() == Code::kBusy) busy++;
          (void)(*b)->Nack(d, 50);
        }
      }
    }
  });

  // A is let go once B owns the partition and has either been kept waiting
  // by A's transaction (a record given back) or gone past A's record; or,
  // should neither happen, a while after B got the partition.
  EXPECT_TRUE(WaitFor([&] {
    const int64_t since = b_assigned_at.load();
    return since != 0 && (busy > 0 || b_last >= kRecords - 1 || NowSteadyMs() - since > 4'000);
  }));
  gate.Open();
  zombie_thread.join();
  // Whatever A's late commit said, its ack commits nothing in Kafka now.
  (void)(*a)->Ack((*held)[0]);
  a->reset();

  // B ends at the last record.
  EXPECT_TRUE(WaitFor([&] {
    auto last = (*oi_b)->LastApplied(topic_, 0);
    return last.ok() && last->has_value() && **last == kRecords - 1 && b_last == kRecords - 1;
  }));
  stop_b = true;
  member_b.join();
  b->reset();

  // One effect per record, ten in all, and the offset at the end.
  EXPECT_EQ(One(*setup_, "SELECT balance FROM ledger WHERE name = 'acct'"), kRecords)
      << "zombie: " << zombie.ToString() << "; B applied " << b_applied << ", duplicates " << b_duplicates
      << ", given back " << busy;
  for (int i = 0; i < kRecords; ++i)
    EXPECT_EQ(One(*setup_, "SELECT count(*) FROM ledger_runs WHERE message_id = 'r-" + std::to_string(i) + "'"), 1)
        << "r-" << i;
  EXPECT_EQ(One(*setup_, "SELECT last_offset FROM idem_kafka_offsets WHERE consumer = 'ledger'"), kRecords - 1);

  // Every record again, to a member of another group from the log's start:
  // each a duplicate, nothing applied.
  kafka::Source::Options ro = SourceOptions(/*keep_alive=*/true, topic_ + "-replay");
  auto r = kafka::Source::Open(ro);
  ASSERT_OK(r);
  int replayed = 0, replay_applied = 0;
  EXPECT_TRUE(WaitFor([&] {
    auto got = (*r)->Receive(1, 100);
    for (const Delivery& d : got.ok() ? *got : std::vector<Delivery>{}) {
      Outcome o = (*oi_b)->Handle(d, Bump);
      EXPECT_TRUE(o.ShouldAck()) << o.ToString();
      if (o.applied()) ++replay_applied;
      ++replayed;
      (void)(*r)->Ack(d);
    }
    return replayed == kRecords;
  }));
  EXPECT_EQ(replay_applied, 0);
  EXPECT_EQ(One(*setup_, "SELECT balance FROM ledger WHERE name = 'acct'"), kRecords);
}

INSTANTIATE_TEST_SUITE_P(Stores, KafkaLateMemberTest,
                         ::testing::Values(Param{"sqlite", Hold::kBeforeWrites}, Param{"sqlite", Hold::kAfterWrites},
                                           Param{"postgres", Hold::kBeforeWrites},
                                           Param{"postgres", Hold::kAfterWrites}),
                         Name);

// A handler held past max.poll.interval.ms keeps its member's partition when
// the source keeps the membership alive: no revocation, the ack commits, and
// the member goes on with the rest of the partition.
TEST(KafkaKeepAlive, AHandlerLongerThanMaxPollIntervalKeepsThePartition) {
  const std::string topic = "keep-" + std::to_string(::getpid());
  MockKafka kafka(topic, 2, topic + "-group");
  ASSERT_TRUE(kafka.ok()) << kafka.error();
  {
    auto p = kafka::Publisher::Open({.brokers = kafka.brokers(), .topic = topic});
    ASSERT_OK(p);
    for (int i = 0; i < kRecords; ++i) ASSERT_OK((*p)->Produce(Msg("k-" + std::to_string(i))));
    ASSERT_OK((*p)->Flush());
  }
  auto src = kafka::Source::Open({.brokers = kafka.brokers(),
                                  .topic = topic,
                                  .group = topic + "-group",
                                  .session_timeout_ms = 3'000,
                                  .heartbeat_interval_ms = 100,
                                  .max_poll_interval_ms = 3'000,
                                  .config = {{"fetch.wait.max.ms", "20"}}});
  ASSERT_OK(src);
  auto first = (*src)->Receive(1, 10'000);
  ASSERT_OK(first);
  ASSERT_EQ(first->size(), 1u);
  const uint64_t assignments = (*src)->stats().assignments;

  // "Handling" it for twice max.poll.interval.ms, and until the source
  // kept the membership at least twice.
  const int64_t until = NowSteadyMs() + 6'000;
  ASSERT_TRUE(WaitFor([&] { return NowSteadyMs() >= until && (*src)->stats().keep_alive_polls >= 2; }));
  EXPECT_OK((*src)->Ack((*first)[0]));

  // The rest comes to this member, the first record not again.
  std::vector<std::string> ids;
  EXPECT_TRUE(WaitFor([&] {
    auto got = (*src)->Receive(4, 100);
    EXPECT_OK(got);
    for (const Delivery& d : got.ok() ? *got : std::vector<Delivery>{}) {
      ids.push_back(d.message.id);
      EXPECT_OK((*src)->Ack(d));
    }
    return ids.size() >= kRecords - 1;
  }));
  EXPECT_EQ(ids.size(), static_cast<size_t>(kRecords - 1));
  for (const std::string& id : ids) EXPECT_NE(id, (*first)[0].message.id);
  EXPECT_EQ((*src)->stats().revocations, 0u);
  EXPECT_EQ((*src)->stats().assignments, assignments);
  EXPECT_OK((*src)->CommitSync());
}

// The horizon follows the group's commits: before any, the first record of
// the log; after the first batch is acknowledged and committed, a record of
// the second batch; once everything is committed, none.
TEST(KafkaHorizon, IsTheOldestRecordAfterTheGroupsCommittedOffsets) {
  const std::string topic = "horizon-" + std::to_string(::getpid());
  MockKafka kafka(topic, 2, topic + "-group");
  ASSERT_TRUE(kafka.ok()) << kafka.error();
  auto pub = kafka::Publisher::Open({.brokers = kafka.brokers(), .topic = topic});
  ASSERT_OK(pub);
  auto publish = [&](const std::string& prefix) {
    for (int i = 0; i < 4; ++i) ASSERT_OK((*pub)->Produce(Msg(prefix + std::to_string(i))));
    ASSERT_OK((*pub)->Flush());
  };
  const int64_t before_first = Env::Default()->NowMs();
  publish("first-");
  const int64_t after_first = Env::Default()->NowMs();
  // The second batch a clock tick later than everything in the first.
  ASSERT_TRUE(WaitFor([&] { return Env::Default()->NowMs() > after_first + 5; }));
  const int64_t before_second = Env::Default()->NowMs();
  publish("second-");

  auto src = kafka::Source::Open({.brokers = kafka.brokers(),
                                  .topic = topic,
                                  .group = topic + "-group",
                                  .session_timeout_ms = 6'000,
                                  .heartbeat_interval_ms = 200,
                                  .config = {{"fetch.wait.max.ms", "20"}}});
  ASSERT_OK(src);
  auto h = (*src)->Horizon();
  ASSERT_OK(h);
  ASSERT_EQ(h->kind, RedeliveryHorizon::Kind::kAt);
  EXPECT_GE(h->at_ms, before_first);
  EXPECT_LE(h->at_ms, after_first);

  // The first batch handled and committed: what is left is the second.
  std::vector<Delivery> second;
  int first_acked = 0;
  ASSERT_TRUE(WaitFor([&] {
    auto got = (*src)->Receive(8, 100);
    for (const Delivery& d : got.ok() ? *got : std::vector<Delivery>{}) {
      if (d.message.id.rfind("first-", 0) == 0) {
        EXPECT_OK((*src)->Ack(d));
        ++first_acked;
      } else {
        second.push_back(d);
      }
    }
    return first_acked == 4 && second.size() == 4;
  }));
  ASSERT_OK((*src)->CommitSync());
  h = (*src)->Horizon();
  ASSERT_OK(h);
  ASSERT_EQ(h->kind, RedeliveryHorizon::Kind::kAt);
  EXPECT_GE(h->at_ms, before_second);

  for (const Delivery& d : second) EXPECT_OK((*src)->Ack(d));
  ASSERT_OK((*src)->CommitSync());
  h = (*src)->Horizon();
  ASSERT_OK(h);
  EXPECT_EQ(h->kind, RedeliveryHorizon::Kind::kNone);
}

}  // namespace
}  // namespace idem::testing
