// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The delivery suite (util/delivery_suite.h, delivery_suite_test.cc) for the
// embedded queue, then what only the embedded queue has: files, schemas, URLs.
//
// Every test delivers every message at least twice: it is published twice
// (a producer retry), or redelivered.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>
#include <limits>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "idem/embedded/queue.h"
#include "idem/env.h"
#include "idem/open.h"
#include "idem/source.h"
#include "idem/sqlite/store.h"
#include "idem/testing/fake_env.h"
#include "util/delivery_suite.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

// ---------------------------------------------------------------------------
// The delivery suite for the embedded queue.
// ---------------------------------------------------------------------------

Result<SourceHandle> OpenEmbedded(const TempDir& dir, const SourceConfig& c) {
  auto q = embedded::Queue::Open({.path = dir.File("queue.db"),
                                  .queue = c.other_channel ? "invoices" : "orders",
                                  .lease_ms = c.lease_ms,
                                  .durable = false,
                                  .poll_ms = 5,
                                  .env = c.env});
  if (!q.ok()) return q.status();
  embedded::Queue* raw = q->get();
  SourceHandle h;
  h.publish = [raw](const Message& m) { return raw->Publish(m); };
  h.publisher = std::shared_ptr<Publisher>(std::shared_ptr<void>(), raw);  // not owned: the source is the queue
  h.channel = c.other_channel ? "invoices" : "orders";
  h.source = std::move(*q);
  return h;
}

// Promises everything the suite knows (every case runs; doc/sources.md).
[[maybe_unused]] const bool kOnEmbedded =
    RegisterDeliverySuite({.name = "embedded", .promises = Capabilities::All(), .open = OpenEmbedded});

// ---------------------------------------------------------------------------
// The embedded queue only.
// ---------------------------------------------------------------------------

using embedded::Queue;

// Runs `sql` on the SQLite file at `path` behind any queue's back (a
// foreign, newer or damaged file).
void ExecOnFile(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  EXPECT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sql;
  sqlite3_close(db);
}

TEST(EmbeddedQueue, StoreFileIsRefusedAsSchemaMismatchAndLeftIntact) {
  TempDir dir;
  {
    auto store = sqlite::Store::Open({.path = dir.File("payments.db")});
    ASSERT_OK(store);
    ASSERT_TRUE(CreatePayments(**store).ok());
  }
  auto q = Queue::Open({.path = dir.File("payments.db")});
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), Code::kSchemaMismatch) << q.status();
  EXPECT_NE(q.status().message().find("idem store"), std::string::npos) << q.status();
  EXPECT_NE(q.status().message().find("own file"), std::string::npos) << q.status();
  // Nothing was added to the store file.
  auto store = sqlite::Store::Open({.path = dir.File("payments.db")});
  ASSERT_OK(store);
  auto tx = (*store)->Begin();
  ASSERT_TRUE(tx.ok());
  auto rows = (*tx)->Query("SELECT count(*) FROM sqlite_schema WHERE name LIKE 'idem_queue%'");
  ASSERT_OK(rows);
  EXPECT_EQ(rows->rows[0][0].AsInt(), 0);
}

TEST(EmbeddedQueue, FileWithAForeignTableIsRefusedAsSchemaMismatch) {
  TempDir dir;
  ExecOnFile(dir.File("app.db"), "CREATE TABLE orders(id INTEGER PRIMARY KEY)");
  auto q = Queue::Open({.path = dir.File("app.db")});
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), Code::kSchemaMismatch) << q.status();
  EXPECT_NE(q.status().message().find("orders"), std::string::npos) << q.status();
  EXPECT_NE(q.status().message().find("not an idem queue file"), std::string::npos) << q.status();
}

TEST(EmbeddedQueue, NewerQueueSchemaIsRefused) {
  TempDir dir;
  {
    auto q = Queue::Open({.path = dir.File("q.db")});
    ASSERT_OK(q);
  }
  ExecOnFile(dir.File("q.db"), "UPDATE idem_queue_meta SET value = '99' WHERE key = 'version'");
  auto q = Queue::Open({.path = dir.File("q.db")});
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), Code::kSchemaMismatch) << q.status();
  EXPECT_NE(q.status().message().find("99"), std::string::npos) << q.status();
}

TEST(EmbeddedQueue, CorruptFileIsCorruption) {
  TempDir dir;
  std::ofstream(dir.File("bad.db")) << std::string(8192, 'x');
  auto q = Queue::Open({.path = dir.File("bad.db")});
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), Code::kCorruption) << q.status();
  EXPECT_NE(q.status().message().find("bad.db"), std::string::npos) << q.status();
}

// "For ever" settings mean for ever: a lease of INT64_MAX ms once wrapped
// into the past, and the leased message was delivered again at once.
TEST(EmbeddedQueue, ForeverLeasesAndDelaysDoNotWrapIntoThePast) {
  TempDir dir;
  FakeEnv env;
  constexpr int64_t kForever = std::numeric_limits<int64_t>::max();
  auto q = Queue::Open({.path = dir.File("q.db"), .lease_ms = kForever, .durable = false, .env = &env});
  ASSERT_OK(q);
  Message m;
  m.id = "m-forever";
  m.payload = "p";
  for (int i = 0; i < 2; ++i) ASSERT_TRUE((*q)->Publish(m).ok());  // every message twice
  auto got = (*q)->Receive(2, 0);
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), 2u);
  env.Advance(1'000'000);
  auto again = (*q)->Receive(2, 0);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->empty()) << "a leased message came back while its lease runs";
  ASSERT_TRUE((*q)->Nack((*got)[0], kForever).ok());  // delayed for ever
  env.Advance(1'000'000);
  auto later = (*q)->Receive(2, 0);
  ASSERT_TRUE(later.ok());
  EXPECT_TRUE(later->empty()) << "a message nacked for ever came back";
}

// A delivery count at the end of int64_t's range (a damaged or foreign
// file; SQLite's `deliveries + 1` then overflows into a REAL) reads as the
// largest attempt, never as a wrapped one (found by fuzz/embedded_rows_fuzz.cc).
TEST(EmbeddedQueue, ADeliveryCountOutOfRangeIsTheLargestAttempt) {
  TempDir dir;
  FakeEnv env;
  auto q = Queue::Open({.path = dir.File("q.db"), .lease_ms = 1000, .durable = false, .env = &env});
  ASSERT_OK(q);
  Message m;
  m.id = "m-counted";
  m.payload = "p";
  ASSERT_TRUE((*q)->Publish(m).ok());
  ExecOnFile(dir.File("q.db"), "UPDATE idem_queue_messages SET deliveries = 9223372036854775807");
  for (int i = 0; i < 2; ++i) {  // the second reads the REAL the first one's + 1 wrote
    auto got = (*q)->Receive(1, 0);
    ASSERT_OK(got);
    ASSERT_EQ(got->size(), 1u);
    EXPECT_EQ((*got)[0].message.attempt, std::numeric_limits<int>::max()) << i;
    env.Advance(2000);  // past the lease: it comes again
  }
}

TEST(EmbeddedQueue, MissingDirectoryIsUnavailable) {
  auto q = Queue::Open({.path = "/nonexistent-idem-dir/sub/queue.db"});
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), Code::kUnavailable) << q.status();
  EXPECT_NE(q.status().message().find("/nonexistent-idem-dir/sub"), std::string::npos) << q.status();
}

TEST(EmbeddedQueue, InvalidOptionsAreRejected) {
  TempDir dir;
  EXPECT_EQ(Queue::Open({.path = ""}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Queue::Open({.path = dir.File("q.db"), .queue = ""}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Queue::Open({.path = dir.File("q.db"), .lease_ms = 0}).status().code(), Code::kInvalidArgument);
}

TEST(EmbeddedQueue, UrlParsing) {
  auto o = Queue::ParseUrl("embedded:/tmp/q.db?queue=x&lease_ms=5");
  ASSERT_OK(o);
  EXPECT_EQ(o->path, "/tmp/q.db");
  EXPECT_EQ(o->queue, "x");
  EXPECT_EQ(o->lease_ms, 5);
  auto plain = Queue::ParseUrl("embedded:q.db");
  ASSERT_OK(plain);
  EXPECT_EQ(plain->path, "q.db");
  EXPECT_EQ(plain->queue, "default");
  EXPECT_EQ(plain->lease_ms, Queue::Options{}.lease_ms);
  EXPECT_EQ(Queue::ParseUrl("embedded:///tmp/q.db")->path, "/tmp/q.db");
  EXPECT_FALSE(Queue::ParseUrl("embedded:q.db?durable=false")->durable);
  for (const char* bad : {"redis://localhost/orders", "q.db", "sqlite:q.db", "embedded:", "embedded:?queue=x",
                          "embedded:q.db?color=red", "embedded:q.db?lease_ms=abc", "embedded:q.db?lease_ms=5s",
                          "embedded:q.db?lease_ms=0", "embedded:q.db?lease_ms=-3",
                          "embedded:q.db?lease_ms=", "embedded:q.db?queue=", "embedded:q.db?durable=maybe"}) {
    auto r = Queue::ParseUrl(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
  }
}

TEST(EmbeddedQueue, ParsedUrlOpensAWorkingQueue) {
  TempDir dir;
  FakeEnv env;
  auto o = Queue::ParseUrl("embedded:" + dir.File("q.db") + "?queue=payments&lease_ms=5");
  ASSERT_OK(o);
  o->env = &env;
  auto q = Queue::Open(*o);
  ASSERT_OK(q);
  ASSERT_TRUE((*q)->Publish(Msg("m-1")).ok());
  ASSERT_TRUE((*q)->Publish(Msg("m-1")).ok());
  auto got = (*q)->Receive(10, 0);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 2u);
  env.Advance(5);  // the URL's 5 ms lease
  auto again = (*q)->Receive(10, 0);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->size(), 2u);
  for (const Delivery& d : *again) {
    EXPECT_EQ(d.message.attempt, 2);
    EXPECT_TRUE((*q)->Ack(d).ok());
  }
}

TEST(EmbeddedQueue, InvalidIdOnPublishIsRejectedAndNothingIsQueued) {
  TempDir dir;
  FakeEnv env;
  auto q = Queue::Open({.path = dir.File("q.db"), .env = &env});
  ASSERT_OK(q);
  for (const std::string& bad : {std::string(), std::string(kMaxIdBytes + 1, 'z')}) {
    for (int i = 0; i < 2; ++i) {
      Status s = (*q)->Publish(Msg(bad, "1"));
      EXPECT_EQ(s.code(), Code::kInvalidArgument) << s;
      EXPECT_NE(s.message().find("message id"), std::string::npos) << s;
    }
  }
  auto stats = (*q)->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->published, 0);
  EXPECT_EQ(stats->ready, 0);
  // The longest valid id is fine, byte-exact.
  std::string longest(kMaxIdBytes, '\0');
  ASSERT_TRUE((*q)->Publish(Msg(longest)).ok());
  ASSERT_TRUE((*q)->Publish(Msg(longest)).ok());
  auto got = (*q)->Receive(10, 0);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 2u);
  for (const Delivery& d : *got) {
    EXPECT_EQ(d.message.id, longest);
    EXPECT_TRUE((*q)->Ack(d).ok());
  }
}

TEST(EmbeddedQueue, ForeignReceiptIsInvalidArgument) {
  TempDir dir;
  auto q = Queue::Open({.path = dir.File("q.db")});
  ASSERT_TRUE(q.ok());
  Delivery d;
  d.message = Msg("m-1");
  d.receipt = "not-a-receipt";
  EXPECT_EQ((*q)->Ack(d).code(), Code::kInvalidArgument);
  EXPECT_EQ((*q)->Nack(d, 0).code(), Code::kInvalidArgument);
}

TEST(EmbeddedQueue, StatsCountReadyLeasedDelayedPublishedAcked) {
  TempDir dir;
  FakeEnv env;
  auto q = Queue::Open({.path = dir.File("q.db"), .lease_ms = 1000, .env = &env});
  ASSERT_TRUE(q.ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE((*q)->Publish(Msg("m-" + std::to_string(i))).ok());
    ASSERT_TRUE((*q)->Publish(Msg("m-" + std::to_string(i))).ok());
  }
  auto got = (*q)->Receive(3, 0);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 3u);
  ASSERT_TRUE((*q)->Ack((*got)[0]).ok());
  ASSERT_TRUE((*q)->Nack((*got)[1], 5000).ok());
  auto s = (*q)->Stats();
  ASSERT_OK(s);
  EXPECT_EQ(s->ready, 3);
  EXPECT_EQ(s->leased, 1);
  EXPECT_EQ(s->delayed, 1);
  EXPECT_EQ(s->published, 6);
  EXPECT_EQ(s->acked, 1);
  env.Advance(1001);  // the lease ran out: ready again
  s = (*q)->Stats();
  EXPECT_EQ(s->ready, 4);
  EXPECT_EQ(s->leased, 0);
  EXPECT_EQ(s->delayed, 1);
}

// The horizon is the enqueue time of the oldest message still in the queue:
// leased, redelivered after its lease ran out, nacked, or never received.
// Only an ack moves it.
TEST(EmbeddedQueue, HorizonIsTheEnqueueTimeOfTheOldestMessageNotAcknowledged) {
  TempDir dir;
  FakeEnv env;
  auto q = Queue::Open({.path = dir.File("q.db"), .lease_ms = 1000, .durable = false, .env = &env});
  ASSERT_OK(q);
  auto horizon = [&] {
    auto h = (*q)->Horizon();
    EXPECT_OK(h);
    return h.ok() ? *h : RedeliveryHorizon::Unknown();
  };
  EXPECT_EQ(horizon().kind, RedeliveryHorizon::Kind::kNone) << "nothing published";
  const int64_t t0 = env.NowMs();
  ASSERT_OK((*q)->Publish(Msg("m-1")));
  env.Advance(500);
  ASSERT_OK((*q)->Publish(Msg("m-1")));  // a producer retry
  env.Advance(500);
  const int64_t t1 = env.NowMs();
  ASSERT_OK((*q)->Publish(Msg("m-2")));
  EXPECT_EQ(horizon().kind, RedeliveryHorizon::Kind::kAt);
  EXPECT_EQ(horizon().at_ms, t0) << "not yet delivered";
  auto got = (*q)->Receive(3, 0);
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), 3u);
  EXPECT_EQ(horizon().at_ms, t0) << "leased";
  ASSERT_OK((*q)->Ack((*got)[0]));
  EXPECT_EQ(horizon().at_ms, t0 + 500) << "the retry's copy is still leased";
  env.Advance(1001);  // its lease runs out unacknowledged: it comes again
  EXPECT_EQ(horizon().at_ms, t0 + 500);
  auto again = (*q)->Receive(1, 0);
  ASSERT_OK(again);
  ASSERT_EQ(again->size(), 1u);
  EXPECT_EQ(again->front().message.attempt, 2);
  ASSERT_OK((*q)->Ack(again->front()));
  EXPECT_EQ(horizon().at_ms, t1);
  auto m2 = (*q)->Receive(1, 0);  // m-2's lease ran out too
  ASSERT_OK(m2);
  ASSERT_EQ(m2->size(), 1u);
  ASSERT_OK((*q)->Nack(m2->front(), 60'000));
  EXPECT_EQ(horizon().at_ms, t1) << "nacked: delayed, still to come";
  env.Advance(60'001);
  auto last = (*q)->Receive(1, 0);
  ASSERT_OK(last);
  ASSERT_EQ(last->size(), 1u);
  ASSERT_OK((*q)->Ack(last->front()));
  EXPECT_EQ(horizon().kind, RedeliveryHorizon::Kind::kNone) << "everything acknowledged";
}

TEST(EmbeddedQueue, TheHorizonIsThatOfItsOwnQueueInASharedFileAndSurvivesAReopen) {
  TempDir dir;
  FakeEnv env;
  auto a = Queue::Open({.path = dir.File("q.db"), .queue = "a", .durable = false, .env = &env});
  ASSERT_OK(a);
  for (int i = 0; i < 2; ++i) ASSERT_OK((*a)->Publish(Msg("old")));
  env.Advance(3'600'000);
  const int64_t t1 = env.NowMs();
  {
    auto b = Queue::Open({.path = dir.File("q.db"), .queue = "b", .durable = false, .env = &env});
    ASSERT_OK(b);
    for (int i = 0; i < 2; ++i) ASSERT_OK((*b)->Publish(Msg("new")));
  }
  auto b = Queue::Open({.path = dir.File("q.db"), .queue = "b", .durable = false, .env = &env});
  ASSERT_OK(b);
  auto h = (*b)->Horizon();
  ASSERT_OK(h);
  EXPECT_EQ(h->kind, RedeliveryHorizon::Kind::kAt);
  EXPECT_EQ(h->at_ms, t1) << "queue a's older messages are not b's";
}

TEST(EmbeddedQueue, QueuesSharingAFileAreSeparate) {
  TempDir dir;
  FakeEnv env;
  auto a = Queue::Open({.path = dir.File("q.db"), .queue = "a", .env = &env});
  auto b = Queue::Open({.path = dir.File("q.db"), .queue = "b", .env = &env});
  ASSERT_TRUE(a.ok() && b.ok());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE((*a)->Publish(Msg("for-a")).ok());
    ASSERT_TRUE((*b)->Publish(Msg("for-b")).ok());
  }
  auto ga = (*a)->Receive(10, 0);
  auto gb = (*b)->Receive(10, 0);
  ASSERT_TRUE(ga.ok() && gb.ok());
  ASSERT_EQ(ga->size(), 2u);
  ASSERT_EQ(gb->size(), 2u);
  for (const Delivery& d : *ga) EXPECT_EQ(d.message.id, "for-a");
  for (const Delivery& d : *gb) EXPECT_EQ(d.message.id, "for-b");
  // A receipt of queue a neither acks nor nacks in queue b.
  EXPECT_EQ((*b)->Ack((*ga)[0]).code(), Code::kLeaseLost);
  EXPECT_EQ((*b)->Nack((*ga)[1], 0).code(), Code::kLeaseLost);
  for (const Delivery& d : *ga) EXPECT_TRUE((*a)->Ack(d).ok());
  for (const Delivery& d : *gb) EXPECT_TRUE((*b)->Ack(d).ok());
  auto sa = (*a)->Stats();
  auto sb = (*b)->Stats();
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_EQ(sa->acked, 2);
  EXPECT_EQ(sb->acked, 2);
  EXPECT_EQ(sa->published, 2);
}

TEST(EmbeddedQueue, MessagesAndLeasesSurviveReopening) {
  TempDir dir;
  FakeEnv env;
  std::vector<Delivery> leased;
  {
    auto q = Queue::Open({.path = dir.File("q.db"), .lease_ms = 1000, .env = &env});
    ASSERT_TRUE(q.ok());
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE((*q)->Publish(Msg("m-1")).ok());
      ASSERT_TRUE((*q)->Publish(Msg("m-2")).ok());
    }
    auto got = (*q)->Receive(2, 0);
    ASSERT_TRUE(got.ok());
    ASSERT_EQ(got->size(), 2u);
    leased = *got;
  }
  auto q = Queue::Open({.path = dir.File("q.db"), .lease_ms = 1000, .env = &env});
  ASSERT_TRUE(q.ok());
  auto rest = (*q)->Receive(10, 0);
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(rest->size(), 2u) << "the two leased copies stay invisible after a reopen";
  for (const Delivery& d : *rest) EXPECT_TRUE((*q)->Ack(d).ok());
  // The receipts of the old handle are still valid in the new one.
  EXPECT_TRUE((*q)->Ack(leased[0]).ok());
  env.Advance(1001);
  auto back = (*q)->Receive(10, 0);
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ(back->front().message.id, leased[1].message.id);
  EXPECT_EQ(back->front().message.attempt, 2);
  EXPECT_TRUE((*q)->Ack(back->front()).ok());
}

// The lease belongs to the receipt until someone else receives the message:
// a late extension (the lease ran out, nobody took the message) still holds,
// as a late Ack does, and the new lease runs lease_ms from the extension.
TEST(EmbeddedQueue, ExtendLeaseHoldsWhileTheReceiptHoldsTheLeaseEvenAfterItRanOut) {
  TempDir dir;
  FakeEnv env;
  auto q = Queue::Open({.path = dir.File("q.db"), .lease_ms = 1000, .durable = false, .env = &env});
  ASSERT_OK(q);
  EXPECT_EQ((*q)->lease_ms(), 1000);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE((*q)->Publish(Msg("m-1")).ok());
  auto got = (*q)->Receive(2, 0);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 2u);
  env.Advance(1500);  // both leases ran out; nobody received the messages
  for (const Delivery& d : *got) {
    Status s = (*q)->ExtendLease(d);
    EXPECT_TRUE(s.ok()) << s;
  }
  auto st = (*q)->Stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->leased, 2);
  EXPECT_EQ(st->ready, 0);
  env.Advance(999);
  auto none = (*q)->Receive(2, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty()) << "visible before the extended lease ran out";
  env.Advance(1);
  auto back = (*q)->Receive(2, 0);
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->size(), 2u);
  for (const Delivery& d : *back) {
    EXPECT_EQ(d.message.attempt, 2);
    EXPECT_EQ((*q)->ExtendLease((*got)[0]).code(), Code::kLeaseLost) << "the old receipt after the redelivery";
    EXPECT_TRUE((*q)->Ack(d).ok());
  }
}

// ExtendLease checks the receipt as Ack and Nack do: a nacked delivery, a
// receipt of another queue in the same file and a foreign receipt renew
// nothing, and the message stays where it was.
TEST(EmbeddedQueue, ExtendLeaseOfANackedOrAnotherQueuesReceiptChangesNothing) {
  TempDir dir;
  FakeEnv env;
  auto a = Queue::Open({.path = dir.File("q.db"), .queue = "a", .lease_ms = 1000, .env = &env});
  auto b = Queue::Open({.path = dir.File("q.db"), .queue = "b", .lease_ms = 1000, .env = &env});
  ASSERT_TRUE(a.ok() && b.ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE((*a)->Publish(Msg("for-a")).ok());
  auto ga = (*a)->Receive(2, 0);
  ASSERT_TRUE(ga.ok());
  ASSERT_EQ(ga->size(), 2u);
  EXPECT_EQ((*b)->ExtendLease((*ga)[0]).code(), Code::kLeaseLost);
  Delivery foreign = (*ga)[0];
  foreign.receipt = "not-a-receipt";
  EXPECT_EQ((*a)->ExtendLease(foreign).code(), Code::kInvalidArgument);
  ASSERT_TRUE((*a)->Nack((*ga)[1], 0).ok());
  EXPECT_EQ((*a)->ExtendLease((*ga)[1]).code(), Code::kLeaseLost);
  auto st = (*a)->Stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->ready, 1) << "the nacked copy stays visible";
  EXPECT_EQ(st->leased, 1);
  auto again = (*a)->Receive(2, 0);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->size(), 1u);
  EXPECT_EQ(again->front().message.attempt, 2);
  EXPECT_TRUE((*a)->Ack(again->front()).ok());
  EXPECT_TRUE((*a)->Ack((*ga)[0]).ok());
  EXPECT_EQ((*a)->ExtendLease((*ga)[0]).code(), Code::kLeaseLost) << "after the ack";
}

// Two handles whose random numbers repeat (two FakeEnvs with one seed, as two
// processes forked from one parent share an RNG state): the receipt of an
// expired delivery must still not ack the redelivery the other handle holds.
TEST(EmbeddedQueue, StaleReceiptNeverMatchesARedeliveryEvenWhenRandomNumbersRepeat) {
  TempDir dir;
  FakeEnv env_a(1'000'000, 7), env_b(1'000'000, 7);
  auto a = Queue::Open({.path = dir.File("q.db"), .lease_ms = 1000, .env = &env_a});
  auto b = Queue::Open({.path = dir.File("q.db"), .lease_ms = 1000, .env = &env_b});
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Publish(Msg("m-1")).ok());
  ASSERT_TRUE((*a)->Publish(Msg("m-1")).ok());
  auto ga = (*a)->Receive(2, 0);
  ASSERT_TRUE(ga.ok());
  ASSERT_EQ(ga->size(), 2u);
  env_a.Advance(1001);
  env_b.Advance(1001);
  // b takes both expired copies, in the same order, drawing the numbers a drew.
  auto gb = (*b)->Receive(2, 0);
  ASSERT_TRUE(gb.ok());
  ASSERT_EQ(gb->size(), 2u);
  for (const Delivery& stale : *ga) {
    Status s = (*a)->Ack(stale);
    EXPECT_EQ(s.code(), Code::kLeaseLost) << s << " (stale receipt " << stale.receipt << ")";
  }
  for (const Delivery& d : *gb) EXPECT_TRUE((*b)->Ack(d).ok()) << d.receipt;
  auto st = (*b)->Stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->acked, 2);
}

// ---------------------------------------------------------------------------
// Opening by URL (idem/open.h) on the embedded queue, and URLs it refuses.
// ---------------------------------------------------------------------------

TEST(OpenSourceByUrl, EmbeddedSourceAndPublisherShareTheQueue) {
  TempDir dir;
  const std::string url = "embedded:" + dir.File("q.db") + "?queue=orders";
  auto pub = OpenPublisher(url);
  ASSERT_OK(pub);
  EXPECT_EQ((*pub)->Kind(), "embedded");
  Message m = Msg("m-1");
  m.producer_time_ms = 1'700'000'000'000;
  ASSERT_TRUE((*pub)->Publish(m).ok());
  auto src = OpenSource(url, {.lease_ms = 1'234});
  ASSERT_OK(src);
  EXPECT_EQ((*src)->Kind(), "embedded");
  EXPECT_EQ((*src)->lease_ms(), 1'234);  // the settings' lease where the URL names none
  auto got = (*src)->Receive(10, 0);
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].message.id, "m-1");
  EXPECT_EQ((*got)[0].message.producer_time_ms, m.producer_time_ms);
  EXPECT_TRUE((*src)->Ack((*got)[0]).ok());
  // The URL's lease_ms wins over the settings'.
  auto own = OpenSource(url + "&lease_ms=777", {.lease_ms = 1'234});
  ASSERT_OK(own);
  EXPECT_EQ((*own)->lease_ms(), 777);
  // Another queue of the same file sees nothing.
  auto other = OpenSource("embedded:" + dir.File("q.db") + "?queue=other");
  ASSERT_OK(other);
  EXPECT_TRUE((*other)->Receive(10, 0)->empty());
  EXPECT_EQ(SourceSchemes().front(), "embedded");
}

TEST(OpenSourceByUrl, BadUrlsAreInvalidArgumentNamingTheProblemWithThePasswordHidden) {
  TempDir dir;
  const std::string q = "embedded:" + dir.File("q.db");
  struct Case {
    std::string url;
    std::string says;
  };
  const std::vector<Case> cases = {
      {q + "?queue=a&colour=red", "unknown parameter 'colour'"},
      {q + "?lease_ms=5s", "lease_ms must be an integer"},
      {q + "?lease_ms=1&lease_ms=2", "given twice"},
      {"nats://u:topsecret@127.0.0.1:4222", "unknown source"},
      {"frobnicate:whatever", "unknown source"},
      {"no-scheme-at-all", "unknown source"},
      {"redis://u:topsecret@127.0.0.1:1?stream=s&colour=red", ""},
      {"amqp://u:topsecret@127.0.0.1:1/%2f?queue=q&prefetch=lots", ""},
      {"kafka://u:topsecret@127.0.0.1:1?topic=t", ""},
      {"redis://u:topsecret@127.0.0.1:0?stream=s", ""},
  };
  for (const Case& c : cases) {
    auto src = OpenSource(c.url);
    ASSERT_FALSE(src.ok()) << c.url;
    EXPECT_EQ(src.status().code(), Code::kInvalidArgument) << c.url << ": " << src.status();
    if (!c.says.empty()) {
      EXPECT_NE(src.status().message().find(c.says), std::string::npos) << src.status();
    }
    EXPECT_EQ(src.status().message().find("topsecret"), std::string::npos) << src.status();
    auto pub = OpenPublisher(c.url);
    ASSERT_FALSE(pub.ok()) << c.url;
    EXPECT_EQ(pub.status().code(), Code::kInvalidArgument) << c.url << ": " << pub.status();
    EXPECT_EQ(pub.status().message().find("topsecret"), std::string::npos) << pub.status();
  }
}

}  // namespace
}  // namespace idem::testing
