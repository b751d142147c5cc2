// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The outbox conformance suite: every store with an outbox runs these
// unchanged (SQLite in idem_unit_test, PostgreSQL in idem_postgres_test).
// Relays publish through a RecordingPublisher; every message is published at
// least twice somewhere in each test that can (a relay crash, a second
// relay, a transient refusal) and the copies are checked by id.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>

#include "idem/inbox.h"
#include "idem/testing/kill_points.h"
#include "util/outbox_conformance.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

using Relay = OutboxRelay;

// The value, or a failed test that stops here.
template <typename T>
T Must(Result<T> r) {
  if (!r.ok()) {
    ADD_FAILURE() << "failed: " << r.status();
    std::abort();
  }
  return std::move(*r);
}

OutgoingMessage Out(std::string key, std::string payload, std::string id = "") {
  return OutgoingMessage{
      .destination = "shipping", .id = std::move(id), .key = std::move(key), .payload = std::move(payload)};
}

// Adds `messages` in one committed transaction that also inserts a payments row.
std::vector<std::string> AddCommitted(Store& store, Outbox& outbox, const std::vector<OutgoingMessage>& messages) {
  auto tx = store.Begin();
  EXPECT_OK(tx);
  if (!tx.ok()) return {};
  EXPECT_TRUE((*tx)->Exec("INSERT INTO payments(message_id, cents) VALUES ('w', 1)").ok());
  auto ids = outbox.AddMany(**tx, messages);
  EXPECT_OK(ids);
  Status c = (*tx)->Commit();
  EXPECT_TRUE(c.ok()) << c;
  return ids.ok() ? *ids : std::vector<std::string>{};
}

Relay::Options Drain(Env* env) {
  Relay::Options o;
  o.stop_when_idle = true;
  o.env = env;
  o.batch = 64;
  return o;
}

TEST_P(OutboxConformance, AddCommitsWithTheWorkAndRollsBackWithIt) {
  auto outbox = Must(Outbox::Open(*store_, {.env = &env_}));
  {
    auto tx = store_->Begin();
    ASSERT_TRUE(tx.ok());
    ASSERT_TRUE((*tx)->Exec("INSERT INTO payments(message_id, cents) VALUES ('a', 1)").ok());
    ASSERT_TRUE(outbox->Add(**tx, Out("order-1", "rolled back")).ok());
    (*tx)->Rollback();
  }
  auto st = outbox->Stats();
  ASSERT_OK(st);
  EXPECT_EQ(st->backlog, 0) << "a rolled-back Add left a row";
  // A savepoint rolled back takes the Add made after it; the one before stays.
  std::string kept;
  {
    auto tx = store_->Begin();
    ASSERT_TRUE(tx.ok());
    auto a = outbox->Add(**tx, Out("order-1", "kept"));
    ASSERT_OK(a);
    kept = *a;
    ASSERT_TRUE((*tx)->Exec("SAVEPOINT s").ok());
    ASSERT_TRUE(outbox->Add(**tx, Out("order-1", "taken back")).ok());
    ASSERT_TRUE((*tx)->Exec("ROLLBACK TO SAVEPOINT s").ok());
    ASSERT_OK((*tx)->Commit());
  }
  st = outbox->Stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->backlog, 1);
  ASSERT_TRUE(st->oldest_unsent_ms.has_value());
  RecordingPublisher pub;
  auto relay = Must(Relay::Open(*store_, pub, Drain(&env_)));
  ASSERT_TRUE(relay->Run().ok());
  // Drained again by a second relay: nothing is published twice once settled.
  auto again = Must(Relay::Open(*store_, pub, Drain(&env_)));
  ASSERT_TRUE(again->Run().ok());
  auto copies = pub.copies();
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].id, kept);
  EXPECT_EQ(copies[0].payload, "kept");
  EXPECT_EQ(copies[0].destination, "shipping");
  EXPECT_EQ(copies[0].key, "order-1");
  EXPECT_EQ(copies[0].producer_time_ms, env_.NowMs());
  EXPECT_EQ(kept.size(), 36u) << "a UUIDv7 by default: " << kept;
  st = outbox->Stats();
  EXPECT_EQ(st->backlog, 0);
  EXPECT_EQ(st->sent_kept, 1);
  EXPECT_EQ(relay->stats().published, 1u);
  EXPECT_GT(relay->stats().store_us, 0u) << "the rounds' store time is counted";
}

TEST_P(OutboxConformance, BadFieldsAreRefusedAndWriteNothing) {
  auto outbox = Must(Outbox::Open(*store_, {.max_payload_bytes = 10, .env = &env_}));
  auto tx = store_->Begin();
  ASSERT_TRUE(tx.ok());
  std::vector<OutgoingMessage> bad = {Out(std::string(256, 'k'), "x"), Out("k", "more than ten bytes"),
                                      Out("k", "x", std::string(256, 'i'))};
  bad.push_back(Out("k", "x"));
  bad.back().headers = {{"idem-ordering-key", "forged"}};
  bad.push_back(Out("k", "x"));
  bad.back().destination = std::string(300, 'd');
  for (const auto& m : bad) {
    auto r = outbox->Add(**tx, m);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status();
  }
  // A good message with a bad one in the same AddMany: neither is added.
  std::vector<OutgoingMessage> mixed = {Out("k", "ok"), Out("k", "more than ten bytes")};
  EXPECT_FALSE(outbox->AddMany(**tx, mixed).ok());
  ASSERT_OK((*tx)->Commit());
  EXPECT_EQ(outbox->Stats()->backlog, 0);
  // A transaction of another store is refused.
  TempDir other_dir;
  auto other = Must(GetParam().open(other_dir, &env_));
  auto otx = other->Begin();
  ASSERT_TRUE(otx.ok());
  if (other->outbox_store() != store_->outbox_store()) {
    EXPECT_EQ(outbox->Add(**otx, Out("k", "x")).status().code(), Code::kInvalidArgument);
  }
  // A Transaction that is no store's (a user's own) is refused, nothing added.
  struct Plain final : Transaction {
    Result<int64_t> Exec(std::string_view, std::span<const Value>) override { return int64_t{0}; }
    Result<Rows> Query(std::string_view, std::span<const Value>) override { return Rows{}; }
    void* NativeHandle() override { return nullptr; }
  } plain;
  EXPECT_EQ(outbox->Add(plain, Out("k", "x")).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(outbox->AddMany(plain, std::vector<OutgoingMessage>{Out("k", "x")}).status().code(),
            Code::kInvalidArgument);
}

// A publisher that confirms out of order across keys still sees each key in
// commit order, and the relay never hands over a key's next message before
// the previous one is confirmed (the recording publisher keeps no order).
TEST_P(OutboxConformance, EachKeyIsPublishedInCommitOrder) {
  auto outbox = Must(Outbox::Open(*store_, {.env = &env_}));
  std::map<std::string, std::vector<std::string>> added;
  for (int t = 0; t < 12; ++t) {
    std::vector<OutgoingMessage> batch;
    for (int i = 0; i < 10; ++i) batch.push_back(Out("order-" + std::to_string((t + i) % 4), "p"));
    auto ids = AddCommitted(*store_, *outbox, batch);
    ASSERT_EQ(ids.size(), batch.size());
    for (size_t i = 0; i < ids.size(); ++i) added[batch[i].key].push_back(ids[i]);
  }
  // Unkeyed messages go out too, in no particular order.
  auto unkeyed = AddCommitted(*store_, *outbox, {Out("", "a"), Out("", "b")});
  RecordingPublisher pub;
  int n = 0;
  pub.answer = [&n](const Message&) {  // every third try fails once, transiently
    return ++n % 3 == 0 ? Status::Unavailable("broker busy") : Status::OK();
  };
  auto o = Drain(&env_);
  auto relay = Must(Relay::Open(*store_, pub, o));
  ASSERT_TRUE(relay->Run().ok());
  auto first = FirstCopiesByKey(pub.copies());
  for (const auto& [key, ids] : added) EXPECT_EQ(first[key], ids) << "key " << key;
  EXPECT_EQ(first[""].size(), 2u);
  EXPECT_EQ(pub.copies().size(), 122u) << "a transient failure is not a copy";
  EXPECT_GT(relay->stats().transient_errors, 0u);
  for (const auto& c : pub.copies()) {
    EXPECT_TRUE(c.headers.size() >= 1 && c.headers.back().first == kOutboxSeqHeader);
  }
  EXPECT_EQ(outbox->Stats()->backlog, 0);
}

// A relay killed after the broker confirmed and before it recorded the
// confirms: the next relay publishes the same messages again, same ids and
// bytes, and the republishes are counted.
TEST_P(OutboxConformance, ACrashAfterPublishRepublishesTheSameMessages) {
  auto outbox = Must(Outbox::Open(*store_, {.env = &env_}));
  std::vector<OutgoingMessage> batch;
  for (int i = 0; i < 20; ++i) batch.push_back(Out("k" + std::to_string(i % 3), "p" + std::to_string(i)));
  auto ids = AddCommitted(*store_, *outbox, batch);
  ASSERT_EQ(ids.size(), 20u);
  const std::string log = dir_.File("published.log");
  store_.reset();  // the child opens its own
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto store = GetParam().open(dir_, Env::Default());
    if (!store.ok()) ::_exit(3);
    RecordingPublisher pub;
    std::ofstream out(log);
    pub.answer = [&out](const Message& m) {
      out << m.id << "\n" << std::flush;
      return Status::OK();
    };
    ArmKillPoint("relay.before_settle");
    auto relay = OutboxRelay::Open(**store, pub, Drain(Env::Default()));
    (void)(*relay)->Run();
    ::_exit(4);  // not reached: the kill point fired
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  std::ifstream in(log);
  std::set<std::string> before;
  for (std::string line; std::getline(in, line);) before.insert(line);
  EXPECT_FALSE(before.empty()) << "the child published nothing before it was killed";
  store_ = Must(GetParam().open(dir_, &env_));
  outbox = Must(Outbox::Open(*store_, {.env = &env_}));
  RecordingPublisher pub;
  auto relay = Must(Relay::Open(*store_, pub, Drain(&env_)));
  ASSERT_TRUE(relay->Run().ok());
  std::set<std::string> after;
  for (const auto& c : pub.copies()) after.insert(c.id);
  EXPECT_EQ(after, std::set<std::string>(ids.begin(), ids.end())) << "every message, none lost";
  for (const auto& id : before) EXPECT_TRUE(after.count(id)) << id << " was published, not recorded, and not again";
  EXPECT_EQ(relay->stats().republished, before.size());
  auto first = FirstCopiesByKey(pub.copies());
  for (int k = 0; k < 3; ++k) {
    std::vector<std::string> want;
    for (int i = k; i < 20; i += 3) want.push_back(ids[i]);
    EXPECT_EQ(first["k" + std::to_string(k)], want);
  }
}

TEST_P(OutboxConformance, ARefusedMessageIsDeadLetteredAndItsKeyGoesOn) {
  auto outbox = Must(Outbox::Open(*store_, {.env = &env_}));
  auto ids = AddCommitted(
      *store_, *outbox, {Out("k", "1"), Out("k", "refuse me"), Out("k", "3"), Out("j", "always busy"), Out("j", "5")});
  ASSERT_EQ(ids.size(), 5u);
  RecordingPublisher pub;
  pub.answer = [](const Message& m) {
    if (m.payload == "refuse me") return Status::Rejected("no such queue");
    if (m.payload == "always busy") return Status::Unavailable("connection refused");
    return Status::OK();
  };
  auto o = Drain(&env_);
  o.max_attempts = 3;
  auto relay = Must(Relay::Open(*store_, pub, o));
  const int64_t start = env_.NowMs();
  ASSERT_TRUE(relay->Run().ok());
  EXPECT_GE(env_.NowMs() - start, o.backoff_base_ms * 2) << "transient failures back off";
  std::vector<std::string> got;
  for (const auto& c : pub.copies()) got.push_back(c.id);
  EXPECT_EQ(got, (std::vector<std::string>{ids[0], ids[2], ids[4]}));
  auto dead = outbox->ListDeadLetters(10);
  ASSERT_OK(dead);
  ASSERT_EQ(dead->size(), 2u);
  std::map<std::string, OutboxDeadLetter> by_id;
  for (auto& d : *dead) by_id[d.row.id] = d;
  EXPECT_EQ(by_id[ids[1]].reason, "refused");
  EXPECT_NE(by_id[ids[1]].error.find("no such queue"), std::string::npos);
  EXPECT_EQ(by_id[ids[1]].row.payload, "refuse me");
  EXPECT_EQ(by_id[ids[3]].reason, "failed");
  EXPECT_EQ(by_id[ids[3]].row.attempts, 3);
  auto st = outbox->Stats();
  EXPECT_EQ(st->backlog, 0);
  EXPECT_EQ(st->dead_letters, 2);
  EXPECT_EQ(relay->stats().dead_lettered, 2u);
}

TEST_P(OutboxConformance, SentMessagesAndDeadLettersArePurgedByAgeInBatches) {
  auto outbox = Must(Outbox::Open(*store_, {.env = &env_}));
  std::vector<OutgoingMessage> batch;
  for (int i = 0; i < 25; ++i) batch.push_back(Out("k", "p"));
  batch.push_back(Out("k", "refuse"));
  AddCommitted(*store_, *outbox, batch);
  RecordingPublisher pub;
  pub.answer = [](const Message& m) { return m.payload == "refuse" ? Status::Rejected("no") : Status::OK(); };
  ASSERT_TRUE(Must(Relay::Open(*store_, pub, Drain(&env_)))->Run().ok());
  const int64_t sent_at = env_.NowMs();
  env_.Advance(10'000);
  AddCommitted(*store_, *outbox, {Out("k", "later")});
  ASSERT_TRUE(Must(Relay::Open(*store_, pub, Drain(&env_)))->Run().ok());
  EXPECT_EQ(outbox->Stats()->sent_kept, 26);
  auto purged = outbox->Purge(sent_at + 1, 0, 10);
  ASSERT_OK(purged);
  EXPECT_EQ(*purged, 25);
  EXPECT_EQ(outbox->Stats()->sent_kept, 1) << "the later message is kept";
  EXPECT_EQ(outbox->Stats()->dead_letters, 1);
  EXPECT_EQ(*outbox->Purge(0, sent_at + 1, 10), 1);
  EXPECT_EQ(outbox->Stats()->dead_letters, 0);
  EXPECT_FALSE(outbox->Purge(1, 1, 0).ok()) << "batch size 0";
  // keep_sent = false deletes on confirm.
  AddCommitted(*store_, *outbox, {Out("k", "gone")});
  auto o = Drain(&env_);
  o.keep_sent = false;
  ASSERT_TRUE(Must(Relay::Open(*store_, pub, o))->Run().ok());
  EXPECT_EQ(outbox->Stats()->sent_kept, 1);
  EXPECT_EQ(outbox->Stats()->backlog, 0);
}

// Two relays at once on one store: every message published, each key in
// order, and no message ever in flight in both at the same time.
TEST_P(OutboxConformance, TwoRelaysShareTheWorkAndKeepEachKeyInOrder) {
  auto outbox = Must(Outbox::Open(*store_));
  RecordingPublisher pub;
  Relay::Options o;
  o.rebalance_ms = 20;
  o.poll_ms = 20;
  o.batch = 16;
  auto a = Must(Relay::Open(*store_, pub, o));
  auto b = Must(Relay::Open(*store_, pub, o));
  std::thread ta([&] { EXPECT_TRUE(a->Run().ok()); });
  std::thread tb([&] { EXPECT_TRUE(b->Run().ok()); });
  std::map<std::string, std::vector<std::string>> added;
  for (int t = 0; t < 30; ++t) {
    std::vector<OutgoingMessage> batch;
    for (int i = 0; i < 10; ++i) batch.push_back(Out("key-" + std::to_string((t * 7 + i) % 40), "p"));
    auto ids = AddCommitted(*store_, *outbox, batch);
    for (size_t i = 0; i < ids.size(); ++i) added[batch[i].key].push_back(ids[i]);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (FirstCopiesByKey(pub.copies()).size() < added.size() || outbox->Stats()->backlog > 0) {
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  a->Stop();
  b->Stop();
  ta.join();
  tb.join();
  auto first = FirstCopiesByKey(pub.copies());
  for (const auto& [key, ids] : added) EXPECT_EQ(first[key], ids) << "key " << key;
  EXPECT_FALSE(pub.twice_at_once());
  EXPECT_EQ(outbox->Stats()->backlog, 0);
  EXPECT_EQ(a->stats().published + b->stats().published, 300u);
}

// A relay asleep with an hour-long poll publishes a new message anyway: the
// commit that added it wakes the relay.
TEST_P(OutboxConformance, ACommitThatAddsWakesASleepingRelay) {
  auto outbox = Must(Outbox::Open(*store_));
  RecordingPublisher pub;
  Relay::Options o;
  o.poll_ms = 3'600'000;
  auto relay = Must(Relay::Open(*store_, pub, o));
  std::thread t([&] { EXPECT_TRUE(relay->Run().ok()); });
  for (int round = 0; round < 3; ++round) {
    // Let the relay find the outbox empty and go to sleep.
    const uint64_t rounds = relay->stats().rounds;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto ids = AddCommitted(*store_, *outbox, {Out("k", "wake " + std::to_string(round))});
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (relay->stats().published < static_cast<uint64_t>(round + 1) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(relay->stats().published, static_cast<uint64_t>(round + 1)) << "not woken in round " << round;
    EXPECT_GT(relay->stats().rounds, rounds);
  }
  relay->Stop();
  // Stop interrupts the sleep only at its end: wake it with one more commit.
  AddCommitted(*store_, *outbox, {Out("k", "last")});
  t.join();
}

}  // namespace
}  // namespace idem::testing
