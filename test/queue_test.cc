// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The delivery suite: what every at-least-once Source must do, written
// against idem::Source plus a publish hook, so that other sources (Redis,
// RabbitMQ, Kafka) can be instantiated into it unchanged. Then what only the
// embedded queue has: files, schemas, URLs.
//
// Every test delivers every message at least twice: it is published twice
// (a producer retry), or redelivered.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

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
#include "idem/source.h"
#include "idem/sqlite/store.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

// ---------------------------------------------------------------------------
// The parameter: how to open a source under test.
// ---------------------------------------------------------------------------

struct SourceConfig {
  // The visibility timeout (lease) the source must use.
  int64_t lease_ms = 30'000;
  // The clock the source must read. The suite passes a FakeEnv, except in a
  // forked child, which passes Env::Default().
  Env* env = nullptr;
};

// One open handle on the suite's queue.
struct SourceHandle {
  std::unique_ptr<Source> source;
  // Appends a message, as a producer would.
  std::function<Status(const Message&)> publish;
};

struct SourceParam {
  std::string name;
  // Opens a handle on the queue that belongs to `dir`: the same dir gives the
  // same queue, also from another process (a forked child).
  std::function<Result<SourceHandle>(const TempDir& dir, const SourceConfig& config)> open;
  // Moves the source's clock forward by `ms` (lease expiry, nack delays).
  // Empty: the source reads the FakeEnv, which is advanced. A broker that
  // keeps its own clock supplies a hook that waits instead.
  std::function<void(FakeEnv& env, int64_t ms)> advance;
};

void PrintTo(const SourceParam& p, std::ostream* os) { *os << p.name; }

Result<SourceHandle> OpenEmbedded(const TempDir& dir, const SourceConfig& c) {
  auto q = embedded::Queue::Open({.path = dir.File("queue.db"), .queue = "orders", .lease_ms = c.lease_ms,
                                  .durable = false, .poll_ms = 5, .env = c.env});
  if (!q.ok()) return q.status();
  embedded::Queue* raw = q->get();
  SourceHandle h;
  h.publish = [raw](const Message& m) { return raw->Publish(m); };
  h.source = std::move(*q);
  return h;
}

constexpr int64_t kLeaseMs = 10'000;

class DeliverySuite : public ::testing::TestWithParam<SourceParam> {
 protected:
  void SetUp() override {
    auto h = GetParam().open(dir_, {.lease_ms = kLeaseMs, .env = &env_});
    ASSERT_TRUE(h.ok()) << h.status();
    handle_ = std::move(*h);
  }
  Source& source() { return *handle_.source; }
  void Publish(const Message& m) { ASSERT_TRUE(handle_.publish(m).ok()) << m.id; }
  void PublishTwice(const Message& m) {
    Publish(m);
    Publish(m);
  }
  void Advance(int64_t ms) {
    if (GetParam().advance) GetParam().advance(env_, ms);
    else env_.Advance(ms);
  }
  // Everything visible now, without waiting.
  std::vector<Delivery> ReceiveAll(int max = 1000) {
    auto got = source().Receive(max, 0);
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? std::move(*got) : std::vector<Delivery>{};
  }
  // Nothing is left: not now, and not once every lease and delay ran out.
  void ExpectDrained() {
    EXPECT_TRUE(ReceiveAll().empty());
    Advance(kLeaseMs * 10);
    std::vector<Delivery> left = ReceiveAll();
    EXPECT_TRUE(left.empty()) << left.size() << " deliveries left, first " << left.front().message.id;
  }
  static std::map<std::string, int> CountIds(const std::vector<Delivery>& ds) {
    std::map<std::string, int> n;
    for (const Delivery& d : ds) ++n[d.message.id];
    return n;
  }

  TempDir dir_;
  // Starts at the real time, so that leases a forked child takes with the
  // real clock compare sensibly with this one.
  FakeEnv env_{Env::Default()->NowMs()};
  SourceHandle handle_;
};

TEST_P(DeliverySuite, PublishReceiveAckRemoves) {
  for (int i = 0; i < 3; ++i) PublishTwice(Msg("m-" + std::to_string(i)));
  std::vector<Delivery> got = ReceiveAll();
  ASSERT_EQ(got.size(), 6u);
  EXPECT_EQ(CountIds(got), (std::map<std::string, int>{{"m-0", 2}, {"m-1", 2}, {"m-2", 2}}));
  std::set<std::string> receipts;
  for (const Delivery& d : got) {
    EXPECT_EQ(d.message.attempt, 1) << d.message.id;
    EXPECT_EQ(d.message.payload, "payload-of-" + d.message.id);
    EXPECT_FALSE(d.receipt.empty());
    receipts.insert(d.receipt);
  }
  EXPECT_EQ(receipts.size(), 6u) << "every delivery has its own receipt";
  for (const Delivery& d : got) EXPECT_TRUE(source().Ack(d).ok()) << d.message.id;
  ExpectDrained();
  // An ack is not repeatable: the message is gone.
  EXPECT_EQ(source().Ack(got[0]).code(), Code::kLeaseLost);
}

TEST_P(DeliverySuite, MessagePublishedTwiceIsDeliveredTwiceWithTheSameId) {
  Message m = Msg("order-42", "4000");
  PublishTwice(m);
  std::vector<Delivery> got = ReceiveAll();
  ASSERT_EQ(got.size(), 2u);
  for (const Delivery& d : got) {
    EXPECT_EQ(d.message.id, "order-42");
    EXPECT_EQ(d.message.payload, "4000");
    EXPECT_EQ(d.message.attempt, 1);
  }
  EXPECT_NE(got[0].receipt, got[1].receipt);
  // The copies are independent: acking one leaves the other leased.
  ASSERT_TRUE(source().Ack(got[0]).ok());
  Advance(kLeaseMs + 1);
  std::vector<Delivery> again = ReceiveAll();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].message.id, "order-42");
  EXPECT_EQ(again[0].message.attempt, 2);
  ASSERT_TRUE(source().Ack(again[0]).ok());
  ExpectDrained();
}

TEST_P(DeliverySuite, LeasedMessageIsInvisibleUntilTheLeaseExpiresThenRedelivered) {
  PublishTwice(Msg("m-1"));
  auto first = source().Receive(1, 0);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->size(), 1u);
  EXPECT_EQ((*first)[0].message.attempt, 1);
  // The second receiver sees only the other copy, never the leased one.
  std::vector<Delivery> second = ReceiveAll();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].message.attempt, 1);
  EXPECT_NE(second[0].receipt, (*first)[0].receipt);
  EXPECT_TRUE(ReceiveAll().empty());
  // A Receive that waits less than the lease still sees nothing.
  auto waited = source().Receive(10, kLeaseMs / 2);
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_TRUE(waited->empty());
  Advance(kLeaseMs);  // now past both leases
  std::vector<Delivery> redelivered = ReceiveAll();
  ASSERT_EQ(redelivered.size(), 2u);
  for (const Delivery& d : redelivered) {
    EXPECT_EQ(d.message.id, "m-1");
    EXPECT_EQ(d.message.attempt, 2);
  }
  for (const Delivery& d : redelivered) EXPECT_TRUE(source().Ack(d).ok());
  ExpectDrained();
}

TEST_P(DeliverySuite, AWaitingReceiveSeesALeaseExpire) {
  PublishTwice(Msg("m-1"));
  ASSERT_EQ(ReceiveAll().size(), 2u);
  // Receive waits longer than the lease: the messages come back within it.
  auto got = source().Receive(10, kLeaseMs * 2);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  for (const Delivery& d : *got) {
    EXPECT_EQ(d.message.attempt, 2);
    EXPECT_TRUE(source().Ack(d).ok());
  }
  ExpectDrained();
}

TEST_P(DeliverySuite, StaleReceiptAfterRedeliveryIsLeaseLostAndDeletesNothing) {
  PublishTwice(Msg("m-1"));
  std::vector<Delivery> stale = ReceiveAll();
  ASSERT_EQ(stale.size(), 2u);
  Advance(kLeaseMs + 1);
  std::vector<Delivery> fresh = ReceiveAll();
  ASSERT_EQ(fresh.size(), 2u);
  for (const Delivery& d : stale) {
    Status s = source().Ack(d);
    EXPECT_EQ(s.code(), Code::kLeaseLost) << s;
    EXPECT_EQ(source().Nack(d, 0).code(), Code::kLeaseLost);
  }
  // The new deliveries are intact: still leased (invisible), ackable.
  EXPECT_TRUE(ReceiveAll().empty());
  for (const Delivery& d : fresh) {
    EXPECT_EQ(d.message.attempt, 2);
    EXPECT_TRUE(source().Ack(d).ok()) << d.message.id;
  }
  ExpectDrained();
}

TEST_P(DeliverySuite, StaleReceiptAfterNackAndRedeliveryIsLeaseLost) {
  PublishTwice(Msg("m-1"));
  std::vector<Delivery> first = ReceiveAll();
  ASSERT_EQ(first.size(), 2u);
  for (const Delivery& d : first) ASSERT_TRUE(source().Nack(d, 0).ok());
  std::vector<Delivery> second = ReceiveAll();
  ASSERT_EQ(second.size(), 2u);
  for (const Delivery& d : first) EXPECT_EQ(source().Ack(d).code(), Code::kLeaseLost);
  for (const Delivery& d : second) {
    EXPECT_EQ(d.message.attempt, 2);
    EXPECT_TRUE(source().Ack(d).ok());
  }
  ExpectDrained();
}

TEST_P(DeliverySuite, NackWithDelayHidesTheMessageUntilTheDelayPasses) {
  PublishTwice(Msg("m-1"));
  std::vector<Delivery> got = ReceiveAll();
  ASSERT_EQ(got.size(), 2u);
  // The delay is longer than the lease: the delay decides, not the lease.
  const int64_t delay = kLeaseMs * 3;
  for (const Delivery& d : got) ASSERT_TRUE(source().Nack(d, delay).ok());
  EXPECT_TRUE(ReceiveAll().empty());
  Advance(kLeaseMs + 1);
  EXPECT_TRUE(ReceiveAll().empty()) << "visible when the lease ran out, before the nack delay";
  Advance(delay - kLeaseMs - 2);
  EXPECT_TRUE(ReceiveAll().empty());
  Advance(2);
  std::vector<Delivery> back = ReceiveAll();
  ASSERT_EQ(back.size(), 2u);
  for (const Delivery& d : back) {
    EXPECT_EQ(d.message.id, "m-1");
    EXPECT_EQ(d.message.attempt, 2);
  }
  // Nack without delay: visible again at once.
  for (const Delivery& d : back) ASSERT_TRUE(source().Nack(d, 0).ok());
  std::vector<Delivery> third = ReceiveAll();
  ASSERT_EQ(third.size(), 2u);
  for (const Delivery& d : third) {
    EXPECT_EQ(d.message.attempt, 3);
    EXPECT_TRUE(source().Ack(d).ok());
  }
  ExpectDrained();
}

TEST_P(DeliverySuite, HeadersProducerTimeAndBinaryPayloadsRoundTripByteExact) {
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes += static_cast<char>(b);
  Message rich;
  rich.id = std::string("m\0\xff-1", 5);
  rich.payload = all_bytes + std::string(3, '\0') + all_bytes;
  rich.producer_time_ms = 1'712'345'678'901;
  rich.headers = {{"trace-id", "abc"},
                  {"binary", std::string("\0\x01\xfe\xff", 4)},
                  {"empty", ""},
                  {"", "empty name"},
                  {"trace-id", "second value, same name"}};
  Message plain;
  plain.id = "m-2";
  plain.payload = "";  // an empty payload is a payload
  PublishTwice(rich);
  PublishTwice(plain);
  std::vector<Delivery> got = ReceiveAll();
  ASSERT_EQ(got.size(), 4u);
  int rich_seen = 0, plain_seen = 0;
  for (const Delivery& d : got) {
    const Message& m = d.message;
    if (m.id == rich.id) {
      ++rich_seen;
      EXPECT_EQ(m.payload.size(), rich.payload.size());
      EXPECT_TRUE(m.payload == rich.payload);
      ASSERT_TRUE(m.producer_time_ms.has_value());
      EXPECT_EQ(*m.producer_time_ms, *rich.producer_time_ms);
      EXPECT_EQ(m.headers, rich.headers);
      EXPECT_EQ(m.Header("trace-id"), std::optional<std::string_view>("abc"));
    } else {
      ++plain_seen;
      EXPECT_EQ(m.id, "m-2");
      EXPECT_EQ(m.payload, "");
      EXPECT_FALSE(m.producer_time_ms.has_value());
      EXPECT_TRUE(m.headers.empty());
    }
    EXPECT_TRUE(source().Ack(d).ok());
  }
  EXPECT_EQ(rich_seen, 2);
  EXPECT_EQ(plain_seen, 2);
  ExpectDrained();
}

TEST_P(DeliverySuite, ReceiveReturnsAtMostMax) {
  for (int i = 0; i < 5; ++i) PublishTwice(Msg("m-" + std::to_string(i)));
  std::vector<Delivery> all;
  for (int round = 0; round < 20 && all.size() < 10; ++round) {
    auto got = source().Receive(3, 0);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_LE(got->size(), 3u);
    for (auto& d : *got) all.push_back(std::move(d));
  }
  ASSERT_EQ(all.size(), 10u);
  auto one = source().Receive(1, 0);
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(one->empty());
  for (auto& c : CountIds(all)) EXPECT_EQ(c.second, 2) << c.first;
  for (const Delivery& d : all) EXPECT_TRUE(source().Ack(d).ok());
  EXPECT_EQ(source().Receive(0, 0).status().code(), Code::kInvalidArgument);
  ExpectDrained();
}

TEST_P(DeliverySuite, ConcurrentReceiversGetEachDeliveryExactlyOnceAndLoseNothing) {
  constexpr int kIds = 150, kThreads = 4;
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < kIds; ++i) Publish(Msg("m-" + std::to_string(i)));
  std::mutex mu;
  std::map<std::string, int> received;
  std::atomic<int> acked{0}, ack_errors{0}, receive_errors{0};
  auto worker = [&] {
    int empty_in_a_row = 0;
    while (acked.load() < 2 * kIds && empty_in_a_row < 2000) {
      auto got = source().Receive(1 + static_cast<int>(acked.load() % 4), 0);
      if (!got.ok()) {
        ++receive_errors;
        continue;
      }
      if (got->empty()) {
        ++empty_in_a_row;
        std::this_thread::yield();
        continue;
      }
      empty_in_a_row = 0;
      {
        std::lock_guard<std::mutex> l(mu);
        for (const Delivery& d : *got) ++received[d.message.id];
      }
      for (const Delivery& d : *got) {
        if (d.message.attempt != 1) ++ack_errors;  // a second lease while the first was valid
        if (source().Ack(d).ok()) ++acked;
        else ++ack_errors;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  EXPECT_EQ(receive_errors.load(), 0);
  EXPECT_EQ(ack_errors.load(), 0);
  EXPECT_EQ(acked.load(), 2 * kIds);
  ASSERT_EQ(received.size(), static_cast<size_t>(kIds));
  for (auto& [id, n] : received) EXPECT_EQ(n, 2) << id;
  ExpectDrained();
}

TEST_P(DeliverySuite, TwoProcessesConsumingOneQueueAckEveryDeliveryExactlyOnce) {
  constexpr int kIds = 120;
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < kIds; ++i) Publish(Msg("m-" + std::to_string(i)));
  handle_ = {};  // no connection crosses the fork
  auto child = [&](int n) -> int {
    // The real clock and a lease far longer than the test: a second delivery
    // here would be a double lease, not an expiry.
    auto h = GetParam().open(dir_, {.lease_ms = 600'000, .env = Env::Default()});
    if (!h.ok()) return 2;
    std::string log = dir_.File("acked-" + std::to_string(n));
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) return 3;
    int empty_in_a_row = 0;
    while (empty_in_a_row < 3) {
      auto got = h->source->Receive(4, 20);
      if (!got.ok()) return 4;
      if (got->empty()) {
        ++empty_in_a_row;
        continue;
      }
      empty_in_a_row = 0;
      for (const Delivery& d : *got) {
        if (d.message.attempt != 1) return 5;
        if (!h->source->Ack(d).ok()) return 6;
        std::string line = d.message.id + "\n";
        if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return 7;
      }
    }
    ::close(fd);
    return 0;
  };
  pid_t a = ::fork();
  if (a == 0) ::_exit(child(0));
  pid_t b = ::fork();
  if (b == 0) ::_exit(child(1));
  int sa = 0, sb = 0;
  ASSERT_EQ(::waitpid(a, &sa, 0), a);
  ASSERT_EQ(::waitpid(b, &sb, 0), b);
  EXPECT_TRUE(WIFEXITED(sa) && WEXITSTATUS(sa) == 0) << "child a status " << sa;
  EXPECT_TRUE(WIFEXITED(sb) && WEXITSTATUS(sb) == 0) << "child b status " << sb;
  std::map<std::string, int> acked;
  int total = 0;
  for (int n = 0; n < 2; ++n) {
    std::ifstream in(dir_.File("acked-" + std::to_string(n)));
    for (std::string id; std::getline(in, id);) {
      ++acked[id];
      ++total;
    }
  }
  EXPECT_EQ(total, 2 * kIds);
  ASSERT_EQ(acked.size(), static_cast<size_t>(kIds));
  for (auto& [id, n] : acked) EXPECT_EQ(n, 2) << id;
  auto h = GetParam().open(dir_, {.lease_ms = kLeaseMs, .env = &env_});
  ASSERT_TRUE(h.ok()) << h.status();
  handle_ = std::move(*h);
  ExpectDrained();
}

INSTANTIATE_TEST_SUITE_P(Sources, DeliverySuite,
                         ::testing::Values(SourceParam{"embedded", OpenEmbedded, {}}),
                         [](const ::testing::TestParamInfo<SourceParam>& p) { return p.param.name; });

// ---------------------------------------------------------------------------
// The embedded queue only.
// ---------------------------------------------------------------------------

using embedded::Queue;
using embedded::QueueOptions;

TEST(EmbeddedQueue, StoreFileIsRefusedAsSchemaMismatchAndLeftIntact) {
  TempDir dir;
  {
    auto store = sqlite::Open({.path = dir.File("payments.db")});
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE(CreatePayments(**store).ok());
  }
  auto q = Queue::Open({.path = dir.File("payments.db")});
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), Code::kSchemaMismatch) << q.status();
  EXPECT_NE(q.status().message().find("idem store"), std::string::npos) << q.status();
  EXPECT_NE(q.status().message().find("own file"), std::string::npos) << q.status();
  // Nothing was added to the store file.
  auto store = sqlite::Open({.path = dir.File("payments.db")});
  ASSERT_TRUE(store.ok()) << store.status();
  auto tx = (*store)->Begin();
  ASSERT_TRUE(tx.ok());
  auto rows = (*tx)->Query("SELECT count(*) FROM sqlite_schema WHERE name LIKE 'idem_queue%'");
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->rows[0][0].AsInt(), 0);
}

TEST(EmbeddedQueue, FileWithAForeignTableIsRefusedAsSchemaMismatch) {
  TempDir dir;
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(dir.File("app.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE orders(id INTEGER PRIMARY KEY)", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
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
    ASSERT_TRUE(q.ok()) << q.status();
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(dir.File("q.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE idem_queue_meta SET value = '99' WHERE key = 'version'", nullptr, nullptr,
                         nullptr),
            SQLITE_OK);
  sqlite3_close(db);
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
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->path, "/tmp/q.db");
  EXPECT_EQ(o->queue, "x");
  EXPECT_EQ(o->lease_ms, 5);
  auto plain = Queue::ParseUrl("embedded:q.db");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->path, "q.db");
  EXPECT_EQ(plain->queue, "default");
  EXPECT_EQ(plain->lease_ms, QueueOptions{}.lease_ms);
  EXPECT_EQ(Queue::ParseUrl("embedded:///tmp/q.db")->path, "/tmp/q.db");
  EXPECT_FALSE(Queue::ParseUrl("embedded:q.db?durable=false")->durable);
  for (const char* bad : {"redis://localhost/orders", "q.db", "sqlite:q.db", "embedded:", "embedded:?queue=x",
                          "embedded:q.db?color=red", "embedded:q.db?lease_ms=abc", "embedded:q.db?lease_ms=5s",
                          "embedded:q.db?lease_ms=0", "embedded:q.db?lease_ms=-3", "embedded:q.db?lease_ms=",
                          "embedded:q.db?queue=", "embedded:q.db?durable=maybe"}) {
    auto r = Queue::ParseUrl(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
  }
}

TEST(EmbeddedQueue, ParsedUrlOpensAWorkingQueue) {
  TempDir dir;
  FakeEnv env;
  auto o = Queue::ParseUrl("embedded:" + dir.File("q.db") + "?queue=payments&lease_ms=5");
  ASSERT_TRUE(o.ok()) << o.status();
  o->env = &env;
  auto q = Queue::Open(*o);
  ASSERT_TRUE(q.ok()) << q.status();
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
  ASSERT_TRUE(q.ok()) << q.status();
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
  ASSERT_TRUE(s.ok()) << s.status();
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

}  // namespace
}  // namespace idem::testing
