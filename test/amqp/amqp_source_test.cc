// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::amqp on a real rabbitmq-server (the CTest fixture "rabbitmq" starts a
// throwaway broker; util/test_servers.h finds it). Every test publishes every
// message at least twice (a producer retry), or has it redelivered. Each test
// uses queues of its own. No sleeps for timing: waits are bounded waits for a
// condition.
#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "idem/amqp/source.h"
#include "idem/consumer.h"
#include "idem/env.h"
#include "idem/inbox.h"
#include "idem/sqlite/store.h"
#include "idem/testing/fake_env.h"
#include "idem/testing/kill_points.h"
#include "util/relay_util.h"
#include "util/test_servers.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

using idem::amqp::Publisher;
using AmqpSource = idem::amqp::Source;

// The restart test points the helpers at its own broker.
std::string g_url_override;
std::string Url() {
  if (!g_url_override.empty()) return g_url_override;
  return FixtureServerUrl("rabbitmq", "");  // util/test_servers.h
}

#define REQUIRE_BROKER()                                                            \
  do {                                                                              \
    if (Url().empty()) GTEST_FAIL() << "no broker: run via ctest, which starts it"; \
  } while (0)

std::string UniqueQueue() { return UniqueServerName("idem-"); }

// A broker of the restart test's own (the shared fixture's broker may be in
// use by another test run): started and stopped with the fixture's script,
// one test process at a time (a file lock). Ctl("pause") stops it, data
// kept; Ctl("resume") starts it again.
class PrivateBroker {
 public:
  PrivateBroker() {
    lock_fd_ = ::open((state_ + ".test-lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (lock_fd_ >= 0) (void)::flock(lock_fd_, LOCK_EX);
    // The first free ports from IDEM_TEST_AMQP_RESTART_PORT on.
    started_ = Ctl("start ", std::to_string(IDEM_TEST_AMQP_RESTART_PORT)) == 0;
    if (started_) g_url_override = StartedServerUrl(state_);
  }
  ~PrivateBroker() {
    g_url_override.clear();
    (void)Ctl("stop ");
    if (lock_fd_ >= 0) ::close(lock_fd_);
  }
  bool started() const { return started_; }
  int Ctl(const std::string& verb, const std::string& extra = "") {
    std::string cmd =
        "'" + std::string(IDEM_TEST_AMQP_SCRIPT) + "' " + verb + " '" + state_ + "' " + extra + " >/dev/null";
    return std::system(cmd.c_str());
  }

 private:
  std::string state_ = IDEM_TEST_AMQP_RESTART_STATE;
  int lock_fd_ = -1;
  bool started_ = false;
};

// Ready messages and consumers of a queue (queue.declare passive), on a
// connection of its own, with rabbitmq-c directly.
struct QueueInfo {
  uint32_t ready = 0;
  uint32_t consumers = 0;
};
Result<QueueInfo> Inspect(const std::string& queue) {
  auto ep = idem::amqp::ParseUrl(Url());
  if (!ep.ok()) return ep.status();
  amqp_connection_state_t c = amqp_new_connection();
  amqp_socket_t* s = amqp_tcp_socket_new(c);
  timeval tv{5, 0};
  if (amqp_socket_open_noblock(s, ep->host.c_str(), ep->port, &tv) != AMQP_STATUS_OK) {
    amqp_destroy_connection(c);
    return Status::Unavailable("inspect: cannot connect");
  }
  amqp_set_rpc_timeout(c, &tv);
  Status st;
  QueueInfo info;
  if (amqp_login(c, ep->vhost.c_str(), 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, ep->user.c_str(), ep->password.c_str())
          .reply_type != AMQP_RESPONSE_NORMAL) {
    st = Status::Unavailable("inspect: login failed");
  } else {
    amqp_channel_open(c, 1);
    amqp_queue_declare_ok_t* ok =
        amqp_queue_declare(c, 1, amqp_cstring_bytes(queue.c_str()), /*passive=*/1, 0, 0, 0, amqp_empty_table);
    if (ok == nullptr) {
      st = Status::NotFound("inspect: no queue " + queue);
    } else {
      info = {ok->message_count, ok->consumer_count};
    }
    if (ok != nullptr) (void)amqp_connection_close(c, AMQP_REPLY_SUCCESS);
  }
  amqp_destroy_connection(c);
  if (!st.ok()) return st;
  return info;
}

std::unique_ptr<AmqpSource> OpenSource(const std::string& queue, int prefetch = 100, std::string id_header = "",
                                       Env* env = nullptr) {
  auto s = AmqpSource::Open(
      {.url = Url(), .queue = queue, .prefetch = prefetch, .id_header = std::move(id_header), .env = env});
  EXPECT_OK(s);
  return s.ok() ? std::move(*s) : nullptr;
}

std::unique_ptr<Publisher> OpenPublisher(const std::string& queue) {
  auto p = Publisher::Open({.url = Url(), .queue = queue, .declare_queue = true});
  EXPECT_OK(p);
  return p.ok() ? std::move(*p) : nullptr;
}

// Receives until `n` deliveries arrived (or 30 s passed).
std::vector<Delivery> ReceiveN(idem::Source& src, size_t n, int max = 100) {
  std::vector<Delivery> out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
    auto got = src.Receive(max, 500);
    EXPECT_OK(got);
    if (!got.ok()) break;
    for (Delivery& d : *got) out.push_back(std::move(d));
  }
  return out;
}

// A store with the payments table, in a temporary directory.
struct Db {
  TempDir dir;
  std::unique_ptr<Store> store;
  Db() {
    auto s = sqlite::Store::Open({.path = dir.File("inbox.db")});
    EXPECT_OK(s);
    store = std::move(*s);
    EXPECT_TRUE(CreatePayments(*store).ok());
  }
};

// A Consumer running in a thread of its own until destroyed.
class Running {
 public:
  Running(idem::Source& src, Inbox& inbox, Consumer::Options o) : Running(src, inbox, ChargeHandler(), o) {}
  Running(idem::Source& src, Inbox& inbox, Handler handler, Consumer::Options o)
      : owned_(MustOpen<Consumer>(src, inbox, std::move(handler), o)),
        consumer_(*owned_),
        thread_([this] { (void)consumer_.Run(); }) {}
  ~Running() {
    consumer_.Stop();
    thread_.join();
  }
  ConsumerStats stats() const { return consumer_.stats(); }

 private:
  std::unique_ptr<Consumer> owned_;
  Consumer& consumer_;
  std::thread thread_;
};

// Once every consumer of `queue` is gone, whatever it still holds can only be
// a copy of a message already applied: drains it through the inbox and
// checks that it applied nothing.
void DrainRest(const std::string& queue, Inbox& inbox) {
  for (int round = 0; round < 20; ++round) {
    Result<QueueInfo> info = Status::Unavailable("not yet");
    ASSERT_TRUE(WaitFor([&] {
      info = Inspect(queue);
      return info.ok() && info->consumers == 0;
    })) << "consumers still attached to "
        << queue;
    if (info->ready == 0) return;
    auto src = OpenSource(queue);
    ASSERT_NE(src, nullptr);
    const uint64_t applied_before = inbox.counters().applied;
    auto c_owned = MustOpen<Consumer>(*src, inbox, ChargeHandler(),
                                      Consumer::Options{.receive_wait_ms = 500, .stop_when_idle = true});
    Consumer& c = *c_owned;
    ASSERT_TRUE(c.Run().ok());
    EXPECT_EQ(inbox.counters().applied, applied_before) << "a leftover delivery was not a duplicate";
  }
  FAIL() << queue << " does not drain";
}

void ExpectExactlyOnce(Store& store, const std::vector<std::string>& ids) {
  EXPECT_EQ(Charges(store), static_cast<int64_t>(ids.size()));
  for (const std::string& id : ids) EXPECT_EQ(Charges(store, id), 1) << id;
}

// ---------------------------------------------------------------------------

TEST(AmqpSource, MessagePublishedTwiceIsDeliveredTwiceWithTheSameIdAndHeaders) {
  REQUIRE_BROKER();
  const std::string q = UniqueQueue();
  auto pub = OpenPublisher(q);
  ASSERT_NE(pub, nullptr);
  Message m = Msg("order-42", std::string("4000\0\xff binary", 12));
  m.headers = {{"tenant", "acme"}, {"trace", "t-1"}};
  m.producer_time_ms = 1'700'000'000'123;
  ASSERT_TRUE(pub->Publish(q, m).ok());
  ASSERT_TRUE(pub->Publish(q, m).ok());  // a producer retry
  auto src = OpenSource(q);
  ASSERT_NE(src, nullptr);
  std::vector<Delivery> got = ReceiveN(*src, 2);
  ASSERT_EQ(got.size(), 2u);
  for (const Delivery& d : got) {
    EXPECT_EQ(d.message.id, "order-42");
    EXPECT_EQ(d.message.payload, m.payload);
    EXPECT_EQ(d.message.attempt, 1);
    EXPECT_EQ(d.message.producer_time_ms, m.producer_time_ms);
    EXPECT_EQ(d.message.Header("tenant"), std::optional<std::string_view>("acme"));
    EXPECT_EQ(d.message.Header("trace"), std::optional<std::string_view>("t-1"));
  }
  EXPECT_NE(got[0].receipt, got[1].receipt);
  for (const Delivery& d : got) EXPECT_TRUE(src->Ack(d).ok());
  // An ack is not repeatable, and repeating it does not break the channel.
  EXPECT_EQ(src->Ack(got[0]).code(), Code::kLeaseLost);
  ASSERT_TRUE(pub->Publish(q, Msg("after")).ok());
  std::vector<Delivery> more = ReceiveN(*src, 1);
  ASSERT_EQ(more.size(), 1u);
  EXPECT_EQ(more[0].message.id, "after");
  EXPECT_TRUE(src->Ack(more[0]).ok());
}

// The delivery suite's header test without its empty header name (which
// rabbitmq-c cannot decode, so Publisher refuses it).
TEST(AmqpSource, HeadersProducerTimeAndBinaryIdsAndPayloadsRoundTripByteExact) {
  REQUIRE_BROKER();
  const std::string q = UniqueQueue();
  auto pub = OpenPublisher(q);
  ASSERT_NE(pub, nullptr);
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes += static_cast<char>(b);
  Message rich;
  rich.id = std::string("m\0\xff-1", 5);
  rich.payload = all_bytes + std::string(3, '\0') + all_bytes;
  rich.producer_time_ms = 1'712'345'678'901;
  rich.headers = {{"trace-id", "abc"},
                  {"binary", std::string("\0\x01\xfe\xff", 4)},
                  {"empty", ""},
                  {"trace-id", "second value, same name"}};
  Message plain;
  plain.id = "m-2";
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(pub->Publish(q, rich).ok());
    ASSERT_TRUE(pub->Publish(q, plain).ok());
  }
  Message empty_name = plain;
  empty_name.headers = {{"", "empty name"}};
  EXPECT_EQ(pub->Publish(q, empty_name).code(), Code::kInvalidArgument);
  auto src = OpenSource(q);
  ASSERT_NE(src, nullptr);
  std::vector<Delivery> got = ReceiveN(*src, 4);
  ASSERT_EQ(got.size(), 4u);
  int rich_seen = 0;
  for (const Delivery& d : got) {
    if (d.message.id == rich.id) {
      ++rich_seen;
      EXPECT_TRUE(d.message.payload == rich.payload);
      EXPECT_EQ(d.message.producer_time_ms, rich.producer_time_ms);
      EXPECT_EQ(d.message.headers, rich.headers);
    } else {
      EXPECT_EQ(d.message.id, "m-2");
      EXPECT_EQ(d.message.payload, "");
      EXPECT_FALSE(d.message.producer_time_ms.has_value());
      EXPECT_TRUE(d.message.headers.empty());
    }
    EXPECT_TRUE(src->Ack(d).ok());
  }
  EXPECT_EQ(rich_seen, 2);
}

TEST(AmqpSource, PublishToAMissingQueueIsNotFound) {
  REQUIRE_BROKER();
  auto pub = Publisher::Open({.url = Url()});
  ASSERT_OK(pub);
  Status s = (*pub)->Publish(UniqueQueue() + "-nobody", Msg("m"));
  EXPECT_EQ(s.code(), Code::kNotFound) << s;
  // The publisher goes on working.
  const std::string q = UniqueQueue();
  auto p2 = OpenPublisher(q);
  ASSERT_NE(p2, nullptr);
  EXPECT_TRUE((*pub)->Publish(q, Msg("m")).ok());
}

TEST(AmqpSource, WrongPasswordIsUnavailableWithoutThePassword) {
  REQUIRE_BROKER();
  auto ep = idem::amqp::ParseUrl(Url());
  ASSERT_TRUE(ep.ok());
  const std::string url = "amqp://idem:topsecret-wrong@" + ep->Where() + "/%2f";
  auto src = AmqpSource::Open({.url = url, .queue = UniqueQueue()});
  ASSERT_FALSE(src.ok());
  EXPECT_EQ(src.status().code(), Code::kUnavailable) << src.status();
  EXPECT_EQ(src.status().message().find("topsecret"), std::string::npos) << src.status();
  EXPECT_NE(src.status().message().find(ep->Where()), std::string::npos) << src.status();
}

TEST(AmqpSource, UnackedDeliveriesOfAClosedConsumerAreRedeliveredToAnotherWithRedelivered) {
  REQUIRE_BROKER();
  const std::string q = UniqueQueue();
  auto pub = OpenPublisher(q);
  ASSERT_NE(pub, nullptr);
  constexpr int kIds = 5;
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < kIds; ++i) ASSERT_TRUE(pub->Publish(q, Msg("m-" + std::to_string(i))).ok());
  auto a = OpenSource(q);
  ASSERT_NE(a, nullptr);
  std::vector<Delivery> first = ReceiveN(*a, 2 * kIds);
  ASSERT_EQ(first.size(), 2u * kIds);
  for (const Delivery& d : first) EXPECT_EQ(d.message.attempt, 1);
  auto b = OpenSource(q);
  ASSERT_NE(b, nullptr);
  a.reset();  // closes the connection without acking: the broker requeues
  std::vector<Delivery> second = ReceiveN(*b, 2 * kIds);
  ASSERT_EQ(second.size(), 2u * kIds);
  std::map<std::string, int> ids;
  for (const Delivery& d : second) {
    ++ids[d.message.id];
    EXPECT_EQ(d.message.attempt, 2) << "redelivered is set, reported as attempt 2";
    EXPECT_TRUE(b->Ack(d).ok());
  }
  ASSERT_EQ(ids.size(), static_cast<size_t>(kIds));
  for (auto& [id, n] : ids) EXPECT_EQ(n, 2) << id;
  b.reset();
  ASSERT_TRUE(WaitFor([&] {
    auto i = Inspect(q);
    return i.ok() && i->consumers == 0;
  }));
  EXPECT_EQ(Inspect(q)->ready, 0u);
}

TEST(AmqpSource, StaleReceiptAfterReconnectIsLeaseLostAndTheMessageComesAgain) {
  REQUIRE_BROKER();
  const std::string q = UniqueQueue();
  auto pub = OpenPublisher(q);
  ASSERT_NE(pub, nullptr);
  ASSERT_TRUE(pub->Publish(q, Msg("m-1")).ok());
  ASSERT_TRUE(pub->Publish(q, Msg("m-1")).ok());
  auto src = OpenSource(q);
  ASSERT_NE(src, nullptr);
  std::vector<Delivery> got = ReceiveN(*src, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(src->generation(), 1u);
  ASSERT_TRUE(src->Reconnect().ok());
  EXPECT_EQ(src->generation(), 2u);
  for (const Delivery& d : got) {
    Status s = src->Ack(d);
    EXPECT_EQ(s.code(), Code::kLeaseLost) << s;
    EXPECT_EQ(src->Nack(d, 0).code(), Code::kLeaseLost);
  }
  std::vector<Delivery> again = ReceiveN(*src, 2);
  ASSERT_EQ(again.size(), 2u);
  for (const Delivery& d : again) {
    EXPECT_EQ(d.message.id, "m-1");
    EXPECT_EQ(d.message.attempt, 2);
    EXPECT_TRUE(src->Ack(d).ok());
  }
  EXPECT_EQ(src->Ack(Delivery{Msg("x"), "not-a-receipt"}).code(), Code::kInvalidArgument);
}

TEST(AmqpSource, NackRequeuesAndHonoursTheDelayClientSide) {
  REQUIRE_BROKER();
  const std::string q = UniqueQueue();
  auto pub = OpenPublisher(q);
  ASSERT_NE(pub, nullptr);
  ASSERT_TRUE(pub->Publish(q, Msg("m-1")).ok());
  ASSERT_TRUE(pub->Publish(q, Msg("m-2")).ok());
  FakeEnv env(Env::Default()->NowMs());
  auto src = OpenSource(q, 100, "", &env);
  ASSERT_NE(src, nullptr);
  std::vector<Delivery> got = ReceiveN(*src, 2);
  ASSERT_EQ(got.size(), 2u);
  const Delivery& now = got[0].message.id == "m-1" ? got[0] : got[1];
  const Delivery& later = got[0].message.id == "m-1" ? got[1] : got[0];
  ASSERT_TRUE(src->Nack(now, 0).ok());
  ASSERT_TRUE(src->Nack(later, 10'000).ok());
  EXPECT_EQ(src->Ack(later).code(), Code::kLeaseLost) << "nacked: no longer ours";
  std::vector<Delivery> back = ReceiveN(*src, 1);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].message.id, "m-1");
  EXPECT_EQ(back[0].message.attempt, 2);
  ASSERT_TRUE(src->Ack(back[0]).ok());
  // m-2 is held until its delay runs out on the source's clock.
  auto none = src->Receive(10, 300);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty()) << "the delayed nack came back before its delay";
  env.Advance(10'001);
  std::vector<Delivery> delayed = ReceiveN(*src, 1);
  ASSERT_EQ(delayed.size(), 1u);
  EXPECT_EQ(delayed[0].message.id, "m-2");
  EXPECT_EQ(delayed[0].message.attempt, 2);
  EXPECT_TRUE(src->Ack(delayed[0]).ok());
}

TEST(AmqpSource, MessageWithoutAnyIdGoesToTheDeadLetterPathAndHeaderFallbackWorks) {
  REQUIRE_BROKER();
  const std::string q = UniqueQueue();
  auto pub = OpenPublisher(q);
  ASSERT_NE(pub, nullptr);
  Message poison = Msg("");
  poison.payload = "no id at all";
  Message by_header = Msg("");
  by_header.payload = "4100";
  by_header.headers = {{"x-idem-id", "hdr-1"}};
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(pub->Publish(q, poison).ok());
    ASSERT_TRUE(pub->Publish(q, by_header).ok());
    ASSERT_TRUE(pub->Publish(q, Msg("ok-1")).ok());
  }
  Db db;
  auto inbox_owned = MustOpen<Inbox>(*db.store, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  auto src = OpenSource(q, 100, "x-idem-id");
  ASSERT_NE(src, nullptr);
  {
    Running run(*src, inbox, {.workers = 2, .max_attempts = 3, .backoff_base_ms = 10, .backoff_max_ms = 100});
    ASSERT_TRUE(WaitFor([&] { return run.stats().dead_lettered >= 2 && run.stats().acked >= 6; }))
        << "dead-lettered " << run.stats().dead_lettered << ", acked " << run.stats().acked;
  }
  src.reset();
  DrainRest(q, inbox);
  ExpectExactlyOnce(*db.store, {"hdr-1", "ok-1"});
  auto dead = db.store->ListDeadLetters("payments", 100);
  ASSERT_OK(dead);
  ASSERT_EQ(dead->size(), 2u) << "each copy of the id-less message is dead-lettered";
  for (const auto& d : *dead) EXPECT_EQ(d.reason, "failed");
}

// A message whose handler always fails (a poison message), published twice:
// nacked with backoff, redelivered by the broker, and after max_attempts moved
// to the dead-letter table and acknowledged; the others apply once each.
TEST(AmqpSource, PoisonMessageReachesTheDeadLetterTableAndTheRestApplyOnce) {
  REQUIRE_BROKER();
  const std::string q = UniqueQueue();
  auto pub = OpenPublisher(q);
  ASSERT_NE(pub, nullptr);
  for (int round = 0; round < 2; ++round)
    for (const char* id : {"ok-1", "poison-1", "ok-2"}) ASSERT_TRUE(pub->Publish(q, Msg(id)).ok());
  Db db;
  auto inbox_owned = MustOpen<Inbox>(*db.store, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  auto src = OpenSource(q, 100, "");
  ASSERT_NE(src, nullptr);
  Handler poison = [](Transaction& tx, const Message& m) -> Status {
    if (m.id == "poison-1") return Status::HandlerFailed("cannot parse the order");
    return ChargeHandler()(tx, m);
  };
  {
    Running run(*src, inbox, poison, {.workers = 2, .max_attempts = 3, .backoff_base_ms = 10, .backoff_max_ms = 100});
    ASSERT_TRUE(WaitFor([&] { return run.stats().dead_lettered >= 1 && run.stats().acked >= 6; }))
        << "dead-lettered " << run.stats().dead_lettered << ", acked " << run.stats().acked;
  }
  src.reset();
  DrainRest(q, inbox);
  ExpectExactlyOnce(*db.store, {"ok-1", "ok-2"});
  EXPECT_EQ(Charges(*db.store, "poison-1"), 0);
  auto dead = db.store->ListDeadLetters("payments", 100);
  ASSERT_OK(dead);
  ASSERT_EQ(dead->size(), 1u);
  EXPECT_EQ((*dead)[0].id, "poison-1");
  EXPECT_EQ((*dead)[0].reason, "failed");
  EXPECT_GE((*dead)[0].attempts, 3);
  EXPECT_NE((*dead)[0].error.find("cannot parse the order"), std::string::npos) << (*dead)[0].error;
}

TEST(AmqpSource, CompetingConsumersApplyEveryMessageExactlyOnceAndLoseNothing) {
  REQUIRE_BROKER();
  const std::string q = UniqueQueue();
  auto pub = OpenPublisher(q);
  ASSERT_NE(pub, nullptr);
  constexpr int kIds = 200;
  std::vector<std::string> ids;
  for (int i = 0; i < kIds; ++i) ids.push_back("order-" + std::to_string(i));
  Db db;
  auto inbox_owned = MustOpen<Inbox>(*db.store, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  std::vector<std::unique_ptr<AmqpSource>> sources;
  for (int i = 0; i < 3; ++i) {
    sources.push_back(OpenSource(q, 10));
    ASSERT_NE(sources.back(), nullptr);
  }
  {
    std::vector<std::unique_ptr<Running>> runs;
    for (auto& s : sources)
      runs.push_back(std::make_unique<Running>(*s, inbox, Consumer::Options{.workers = 2, .batch = 4}));
    // Every message twice, the copies far apart and interleaved with others.
    for (int round = 0; round < 2; ++round)
      for (const std::string& id : ids) ASSERT_TRUE(pub->Publish(q, Msg(id)).ok());
    ASSERT_TRUE(WaitFor([&] {
      uint64_t acked = 0;
      for (auto& r : runs) acked += r->stats().acked;
      return acked >= 2u * kIds;
    })) << Charges(*db.store)
        << " charges";
    uint64_t received = 0;
    for (auto& r : runs) received += r->stats().received;
    EXPECT_GE(received, 2u * kIds);
  }
  sources.clear();
  DrainRest(q, inbox);
  ExpectExactlyOnce(*db.store, ids);
  EXPECT_EQ(inbox.counters().applied, static_cast<uint64_t>(kIds));
  EXPECT_GE(inbox.counters().duplicates, static_cast<uint64_t>(kIds));
}

// A consumer SIGKILLed after its commit and before its ack: the broker
// requeues what it held, another consumer gets it and the inbox absorbs the
// redelivery of the committed message.
TEST(AmqpSource, ConsumerKilledAfterCommitBeforeAckIsAbsorbedByAnother) {
  REQUIRE_BROKER();
  const std::string q = UniqueQueue();
  constexpr int kIds = 30;
  constexpr int kKillAtCommit = 3;
  std::vector<std::string> ids;
  for (int i = 0; i < kIds; ++i) ids.push_back("order-" + std::to_string(i));
  {
    auto pub = OpenPublisher(q);
    ASSERT_NE(pub, nullptr);
    for (int round = 0; round < 2; ++round)
      for (const std::string& id : ids) ASSERT_TRUE(pub->Publish(q, Msg(id)).ok());
  }  // no connection crosses the fork
  TempDir dir;
  int status = RunInChild([&] {
    auto store = sqlite::Store::Open({.path = dir.File("inbox.db")});
    if (!store.ok() || !CreatePayments(**store).ok()) return 2;
    auto inbox_owned = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "payments"});
    Inbox& inbox = *inbox_owned;
    auto src = AmqpSource::Open({.url = Url(), .queue = q, .prefetch = 50});
    if (!src.ok()) return 3;
    auto c_owned = MustOpen<Consumer>(**src, inbox, ChargeHandler(),
                                      Consumer::Options{.receive_wait_ms = 2000, .stop_when_idle = true});
    Consumer& c = *c_owned;
    ArmKillPoint("inbox.after_commit", kKillAtCommit);
    (void)c.Run();
    return 10;  // never reached the kill point
  });
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "wait status " << status;
  auto opened = sqlite::Store::Open({.path = dir.File("inbox.db")});
  ASSERT_OK(opened);
  struct {
    std::unique_ptr<Store> store;
  } db{std::move(*opened)};
  ASSERT_EQ(Charges(*db.store), kKillAtCommit) << "the child committed and died before its ack";

  auto inbox_owned = MustOpen<Inbox>(*db.store, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  auto src = OpenSource(q, 20);
  ASSERT_NE(src, nullptr);
  {
    Running run(*src, inbox, {.workers = 2});
    // The broker requeues the dead child's deliveries when it notices the
    // closed socket; then they come here.
    ASSERT_TRUE(WaitFor([&] { return Charges(*db.store) == kIds; })) << Charges(*db.store) << " charges";
  }
  src.reset();
  DrainRest(q, inbox);
  ExpectExactlyOnce(*db.store, ids);
  EXPECT_EQ(inbox.counters().applied, static_cast<uint64_t>(kIds - kKillAtCommit));
  EXPECT_GE(inbox.counters().duplicates, static_cast<uint64_t>(kIds)) << "the killed commit came back, absorbed";
}

// The broker stops and starts again in the middle of a run: the source
// reconnects, the publisher reconnects, nothing is lost or applied twice.
TEST(AmqpSource, BrokerRestartMidRunLosesNothingAndDoublesNothing) {
  REQUIRE_BROKER();
  PrivateBroker broker;
  ASSERT_TRUE(broker.started()) << "could not start a broker on port " << IDEM_TEST_AMQP_RESTART_PORT;
  const std::string q = UniqueQueue();
  auto pub = OpenPublisher(q);
  ASSERT_NE(pub, nullptr);
  constexpr int kBefore = 150, kAfter = 50;
  std::vector<std::string> ids;
  for (int i = 0; i < kBefore + kAfter; ++i) ids.push_back("order-" + std::to_string(i));
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < kBefore; ++i) ASSERT_TRUE(pub->Publish(q, Msg(ids[i])).ok());
  Db db;
  auto inbox_owned = MustOpen<Inbox>(*db.store, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  auto src = OpenSource(q, 5);
  ASSERT_NE(src, nullptr);
  {
    Running run(*src, inbox, {.workers = 2, .backoff_base_ms = 50, .backoff_max_ms = 500});
    ASSERT_TRUE(WaitFor([&] { return Charges(*db.store) >= 10; }));
    ASSERT_EQ(broker.Ctl("pause"), 0) << "could not stop the broker";
    const int64_t at_pause = Charges(*db.store);
    ASSERT_EQ(broker.Ctl("resume"), 0) << "could not start the broker again";
    // The publisher's connection died with the broker: it reconnects.
    for (int round = 0; round < 2; ++round)
      for (int i = kBefore; i < kBefore + kAfter; ++i) {
        Status s = pub->Publish(q, Msg(ids[i]));
        if (s.code() == Code::kInDoubt || s.code() == Code::kUnavailable) s = pub->Publish(q, Msg(ids[i]));
        ASSERT_TRUE(s.ok()) << s;
      }
    ASSERT_TRUE(WaitFor([&] { return Charges(*db.store) == kBefore + kAfter; })) << Charges(*db.store) << " charges";
    EXPECT_GE(run.stats().receive_errors, 1u) << "the consumer saw the broker go";
    // Not an assertion (timing): how far the run had got when the broker went.
    std::cout << "charges when the broker stopped: " << at_pause << " of " << kBefore + kAfter
              << "; ack errors (acks the restart lost): " << run.stats().ack_errors << "\n";
  }
  EXPECT_GE(src->generation(), 2u) << "the source reconnected";
  src.reset();
  DrainRest(q, inbox);
  ExpectExactlyOnce(*db.store, ids);
}

// The outbox relay across a broker restart: the broker stops after the
// relay's third batch and starts again while the relay's publishes fail; the
// relay backs off and finishes. Every row arrives (each message was added
// twice), as often as the broker confirmed it, each key's first copies in
// order.
TEST(AmqpSource, TheOutboxRelayBacksOffAcrossABrokerRestartAndLosesNothing) {
  REQUIRE_BROKER();
  PrivateBroker broker;
  ASSERT_TRUE(broker.started()) << "could not start a broker on port " << IDEM_TEST_AMQP_RESTART_PORT;
  const std::string q = UniqueQueue();
  auto pub = OpenPublisher(q);  // declares the queue
  ASSERT_NE(pub, nullptr);
  TempDir dir;
  RelayWorkload w(60, 6);
  auto store = OpenOutboxStore(dir.File("outbox.db"));
  ASSERT_OK(store);
  for (int add = 0; add < 2; ++add) ASSERT_TRUE(AddInTransactions(**store, w.messages, 10).ok());
  int resumed = -1;
  auto stats = DrainAcrossABrokerRestart(
      **store, *pub, dir.File("published.log"), 3, [&] { ASSERT_EQ(broker.Ctl("pause"), 0); },
      [&] { resumed = broker.Ctl("resume"); });
  ASSERT_EQ(resumed, 0) << "could not start the broker again";
  ASSERT_OK(stats);
  EXPECT_GE(stats->transient_errors, 1u) << "the relay saw the broker go";
  const std::map<RelayedRow, int> confirmed = ReadPublishLog(dir.File("published.log"));
  auto src = OpenSource(q, 1000);
  ASSERT_NE(src, nullptr);
  std::vector<Delivery> got = ReceiveN(*src, CountCopies(confirmed), 1000);
  ASSERT_EQ(got.size(), CountCopies(confirmed));
  ExpectCopiesAsConfirmed(ExpectRelayed(w, got, 2), confirmed);
  for (const Delivery& d : got) EXPECT_TRUE(src->Ack(d).ok()) << d.message.id;
}

}  // namespace
}  // namespace idem::testing
