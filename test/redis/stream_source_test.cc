// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::redis::StreamSource on a real redis-server: the delivery suite, then
// what only streams have (the id field, XAUTOCLAIM takeover between
// consumers, entries without an id, a Consumer draining a stream, SIGKILL
// after commit, a server restart mid-run).
//
// Every message is delivered at least twice: published twice (a producer
// retry), or redelivered.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "idem/consumer.h"
#include "idem/env.h"
#include "idem/inbox.h"
#include "idem/open.h"
#include "idem/redis/stream_publisher.h"
#include "idem/redis/stream_source.h"
#include "idem/sqlite/store.h"
#include "idem/testing/fake_env.h"
#include "idem/testing/kill_points.h"
#include "redis/redis_test_util.h"
#include "util/delivery_suite.h"
#include "util/relay_util.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

using redis::StreamSource;
using StreamOptions = redis::StreamSource::Options;

// The stream and group of `dir` (the same in a forked child).
StreamOptions OptionsFor(const TempDir& dir, int64_t lease_ms, Env* env, const std::string& url = RedisUrl()) {
  const std::string prefix = PrefixFor(dir);
  return {
      .url = url, .stream = prefix + "orders", .group = "payments", .lease_ms = lease_ms, .poll_ms = 20, .env = env};
}

Result<SourceHandle> OpenStreams(const TempDir& dir, const SourceConfig& c) {
  StreamOptions o = OptionsFor(dir, c.lease_ms, c.env);
  if (c.other_channel) o.stream += "-other";
  auto s = StreamSource::Open(o);
  if (!s.ok()) return s.status();
  auto p = redis::StreamPublisher::Open({.url = o.url, .stream = o.stream});
  if (!p.ok()) return p.status();
  StreamSource* raw = s->get();
  SourceHandle h;
  h.publish = [raw](const Message& m) { return raw->Publish(m).status(); };
  h.publisher = std::move(*p);
  h.channel = o.stream;
  h.source = std::move(*s);
  return h;
}

// Promises everything the suite knows (every case runs; doc/sources.md).
[[maybe_unused]] const bool kOnStreams =
    RegisterDeliverySuite({.name = "redis_streams", .promises = Capabilities::All(), .open = OpenStreams});

// ---------------------------------------------------------------------------
// Streams only.
// ---------------------------------------------------------------------------

constexpr int64_t kLease = 10'000;

std::string Id(int i) { return "m-" + std::to_string(i); }

// XPENDING's summary count of the group (-1 on error).
int64_t PendingCount(const StreamOptions& o, const std::string& url = RedisUrl()) {
  auto ep = redis_internal::ParseUrl(url);
  if (!ep.ok()) return -1;
  auto c = redis_internal::Conn::Connect(*ep, {});
  if (!c.ok()) return -1;
  auto r = (*c)->Command({"XPENDING", o.stream, o.group});
  if (!r.ok() || (*r)->type != REDIS_REPLY_ARRAY || (*r)->elements < 1) return -1;
  return (*r)->element[0]->integer;
}

// Whether the group has read every entry of the stream: its last-delivered-id
// is the stream's last-generated-id (both survive a restart, unlike a count).
bool GroupReadEverything(const StreamOptions& o, const std::string& url) {
  auto ep = redis_internal::ParseUrl(url);
  if (!ep.ok()) return false;
  auto c = redis_internal::Conn::Connect(*ep, {});
  if (!c.ok()) return false;
  auto field = [](const redisReply* r, std::string_view name) -> std::string {
    if (r == nullptr || r->type != REDIS_REPLY_ARRAY) return {};
    for (size_t i = 0; i + 1 < r->elements; i += 2)
      if (std::string_view(r->element[i]->str, r->element[i]->len) == name && r->element[i + 1]->str != nullptr)
        return std::string(r->element[i + 1]->str, r->element[i + 1]->len);
    return {};
  };
  auto stream = (*c)->Command({"XINFO", "STREAM", o.stream});
  auto groups = (*c)->Command({"XINFO", "GROUPS", o.stream});
  if (!stream.ok() || !groups.ok() || (*groups)->type != REDIS_REPLY_ARRAY) return false;
  const std::string last = field(stream->get(), "last-generated-id");
  for (size_t i = 0; i < (*groups)->elements; ++i)
    if (field((*groups)->element[i], "name") == o.group)
      return !last.empty() && field((*groups)->element[i], "last-delivered-id") == last;
  return false;
}

// The group's consumers (XINFO CONSUMERS): name -> entries pending under it.
// {"ERROR", -1} when the command failed.
std::map<std::string, int64_t> GroupConsumers(const StreamOptions& o) {
  std::map<std::string, int64_t> out;
  auto ep = redis_internal::ParseUrl(RedisUrl());
  if (!ep.ok()) return {{"ERROR", -1}};
  auto c = redis_internal::Conn::Connect(*ep, {});
  if (!c.ok()) return {{"ERROR", -1}};
  auto r = (*c)->Command({"XINFO", "CONSUMERS", o.stream, o.group});
  if (!r.ok() || (*r)->type != REDIS_REPLY_ARRAY) return {{"ERROR", -1}};
  for (size_t i = 0; i < (*r)->elements; ++i) {
    const redisReply* e = (*r)->element[i];
    std::string name;
    int64_t pending = -1;
    for (size_t k = 0; e->type == REDIS_REPLY_ARRAY && k + 1 < e->elements; k += 2) {
      const std::string_view f = redis_internal::ReplyString(e->element[k]);
      if (f == "name") name = std::string(redis_internal::ReplyString(e->element[k + 1]));
      if (f == "pending") pending = e->element[k + 1]->integer;
    }
    out[name] = pending;
  }
  return out;
}

class StreamsTest : public ::testing::Test {
 protected:
  std::unique_ptr<StreamSource> Open(Env* env = nullptr, int64_t lease = kLease, std::string consumer = "") {
    StreamOptions o = OptionsFor(dir_, lease, env ? env : &env_);
    o.consumer = std::move(consumer);
    auto s = StreamSource::Open(o);
    EXPECT_OK(s);
    return s.ok() ? std::move(*s) : nullptr;
  }
  StreamOptions Opts() { return OptionsFor(dir_, kLease, &env_); }
  std::vector<Delivery> ReceiveAll(Source& s) {
    auto got = s.Receive(1000, 0);
    EXPECT_OK(got);
    return got.ok() ? std::move(*got) : std::vector<Delivery>{};
  }
  void OpenStore() {
    auto s =
        sqlite::Store::Open({.path = dir_.File("store.db"), .synchronous = sqlite::Synchronous::kNormal, .env = &env_});
    ASSERT_OK(s);
    store_ = std::move(*s);
    ASSERT_TRUE(CreatePayments(*store_).ok());
    inbox_ = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments", .env = &env_});
  }
  void ExpectExactlyOnce(int n) {
    for (int i = 0; i < n; ++i) EXPECT_EQ(Charges(*store_, Id(i)), 1) << Id(i);
    EXPECT_EQ(Charges(*store_), n);
  }

  TempDir dir_;
  FakeEnv env_{Env::Default()->NowMs()};
  std::unique_ptr<Store> store_;
  std::unique_ptr<Inbox> inbox_;
};

TEST_F(StreamsTest, ProducerRetryIsTwoEntriesWithOneMessageIdFromTheConfiguredField) {
  StreamOptions o = Opts();
  o.id_field = "order_id";
  o.payload_field = "body";
  auto s = StreamSource::Open(o);
  ASSERT_OK(s);
  // A producer that is not idem: XADD with its own fields, twice (a retry).
  for (int i = 0; i < 2; ++i) {
    std::string id = RedisRaw({"XADD", o.stream, "*", "order_id", "order-7", "body", "4000", "tenant", "acme"});
    ASSERT_EQ(id.find("ERROR"), std::string::npos) << id;
  }
  auto got = (*s)->Receive(10, 0);
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), 2u);
  EXPECT_NE((*got)[0].receipt, (*got)[1].receipt);
  for (const Delivery& d : *got) {
    EXPECT_EQ(d.message.id, "order-7");
    EXPECT_EQ(d.message.payload, "4000");
    EXPECT_EQ(d.message.attempt, 1);
    EXPECT_EQ(d.message.Header("tenant"), std::optional<std::string_view>("acme"));
    EXPECT_TRUE((*s)->Ack(d).ok());
  }
  EXPECT_EQ(PendingCount(o), 0);
}

TEST_F(StreamsTest, UnackedEntryIsTakenOverByAnotherConsumerAfterTheLeaseWithAttemptTwo) {
  auto a = Open(&env_, kLease, "consumer-a");
  auto b = Open(&env_, kLease, "consumer-b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Publish(Msg("m-1")).ok());
  ASSERT_TRUE(a->Publish(Msg("m-1")).ok());
  std::vector<Delivery> held = ReceiveAll(*a);
  ASSERT_EQ(held.size(), 2u);
  EXPECT_TRUE(ReceiveAll(*b).empty()) << "leased to a";
  env_.Advance(kLease - 1);
  EXPECT_TRUE(ReceiveAll(*b).empty()) << "a's lease still runs";
  env_.Advance(2);
  std::vector<Delivery> taken = ReceiveAll(*b);
  ASSERT_EQ(taken.size(), 2u);
  for (const Delivery& d : taken) {
    EXPECT_EQ(d.message.id, "m-1");
    EXPECT_EQ(d.message.attempt, 2);
  }
  // The group's pending list agrees: owner b, delivery count 2.
  std::string pending = RedisRaw({"XPENDING", Opts().stream, "payments", "-", "+", "10"});
  EXPECT_EQ(pending.find("consumer-a"), std::string::npos) << pending;
  // a acks after its lease ran out: lease lost, nothing removed.
  for (const Delivery& d : held) {
    Status s = a->Ack(d);
    EXPECT_EQ(s.code(), Code::kLeaseLost) << s;
    EXPECT_NE(s.message().find("consumer-b"), std::string::npos) << s;
  }
  EXPECT_EQ(PendingCount(Opts()), 2);
  for (const Delivery& d : taken) EXPECT_TRUE(b->Ack(d).ok());
  EXPECT_EQ(PendingCount(Opts()), 0);
  // Acked twice: lease lost too.
  EXPECT_EQ(b->Ack(taken[0]).code(), Code::kLeaseLost);
}

// The horizon is the time part of the oldest entry id the group may still
// deliver: not yet delivered (after the group's last-delivered-id), pending
// (leased, its lease run out, nacked), and only an ack moves it. The
// entries get ids of chosen times, so the horizon is known exactly.
TEST_F(StreamsTest, HorizonIsTheOldestEntryPendingOrNotYetDelivered) {
  auto s = Open(&env_, kLease, "consumer-a");
  ASSERT_TRUE(s);
  auto horizon = [&] {
    auto h = s->Horizon();
    EXPECT_OK(h);
    return h.ok() ? *h : RedeliveryHorizon::Unknown();
  };
  EXPECT_EQ(horizon().kind, RedeliveryHorizon::Kind::kNone) << "an empty stream";
  const int64_t t0 = 1'700'000'000'000;
  const std::pair<int64_t, std::string> entries[] = {{t0, "m-1"}, {t0 + 5'000, "m-1"}, {t0 + 9'000, "m-2"}};
  for (const auto& [ms, id] : entries) {
    std::string entry = RedisRaw({"XADD", Opts().stream, std::to_string(ms) + "-0", "id", id, "payload", "4000"});
    ASSERT_EQ(entry, std::to_string(ms) + "-0");
  }
  EXPECT_EQ(horizon().kind, RedeliveryHorizon::Kind::kAt);
  EXPECT_EQ(horizon().at_ms, t0) << "none delivered yet";
  auto first = s->Receive(2, 0);
  ASSERT_OK(first);
  ASSERT_EQ(first->size(), 2u);
  EXPECT_EQ(horizon().at_ms, t0) << "both copies pending";
  ASSERT_OK(s->Ack((*first)[0]));
  EXPECT_EQ(horizon().at_ms, t0 + 5'000) << "the retry's copy is still pending";
  env_.Advance(kLease + 1);  // its lease runs out unacknowledged
  EXPECT_EQ(horizon().at_ms, t0 + 5'000);
  ASSERT_OK(s->Ack((*first)[1]));  // late, but nobody took it over
  EXPECT_EQ(horizon().at_ms, t0 + 9'000) << "m-2, not delivered yet";
  auto m2 = s->Receive(1, 0);
  ASSERT_OK(m2);
  ASSERT_EQ(m2->size(), 1u);
  ASSERT_OK(s->Nack(m2->front(), 60'000));
  EXPECT_EQ(horizon().at_ms, t0 + 9'000) << "nacked: pending, to come again";
  env_.Advance(60'001);
  auto again = s->Receive(1, 0);
  ASSERT_OK(again);
  ASSERT_EQ(again->size(), 1u);
  EXPECT_EQ(again->front().message.attempt, 2);
  ASSERT_OK(s->Ack(again->front()));
  EXPECT_EQ(horizon().kind, RedeliveryHorizon::Kind::kNone) << "everything acknowledged";
}

// ExtendLease renews the lease for the consumer that holds the entry (the
// same stored lease end a Receive of ANY consumer compares with), keeps its
// delivery count, and never takes an entry back from a consumer that took
// it over.
TEST_F(StreamsTest, ExtendLeaseRenewsOnlyWhileTheEntryIsPendingUnderItsConsumer) {
  auto a = Open(&env_, kLease, "consumer-a");
  auto b = Open(&env_, kLease, "consumer-b");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->lease_ms(), kLease);
  ASSERT_TRUE(a->Publish(Msg("m-1")).ok());
  ASSERT_TRUE(a->Publish(Msg("m-1")).ok());
  std::vector<Delivery> held = ReceiveAll(*a);
  ASSERT_EQ(held.size(), 2u);
  env_.Advance(kLease - 1);
  for (const Delivery& d : held) {
    Status s = a->ExtendLease(d);
    EXPECT_TRUE(s.ok()) << s;
  }
  env_.Advance(2);  // past the original lease end
  EXPECT_TRUE(ReceiveAll(*b).empty()) << "b took over an extended lease";
  const std::string pending = RedisRaw({"XPENDING", Opts().stream, "payments", "-", "+", "10"});
  EXPECT_EQ(pending.find("consumer-b"), std::string::npos) << pending;
  EXPECT_EQ(GroupConsumers(Opts())["consumer-a"], 2);
  env_.Advance(kLease - 3);  // 1 ms before the extended lease end
  EXPECT_TRUE(ReceiveAll(*b).empty()) << "the extension ended early";
  env_.Advance(1);  // the extended lease ran out
  std::vector<Delivery> taken = ReceiveAll(*b);
  ASSERT_EQ(taken.size(), 2u);
  for (const Delivery& d : taken) EXPECT_EQ(d.message.attempt, 2) << "the extension kept the delivery count";
  for (const Delivery& d : held) {
    Status s = a->ExtendLease(d);
    EXPECT_EQ(s.code(), Code::kLeaseLost) << s;
    EXPECT_NE(s.message().find("consumer-b"), std::string::npos) << s;
  }
  EXPECT_EQ(GroupConsumers(Opts())["consumer-b"], 2) << "a's late extension took the entries back";
  EXPECT_TRUE(ReceiveAll(*a).empty());
  for (const Delivery& d : taken) EXPECT_TRUE(b->Ack(d).ok());
  EXPECT_EQ(PendingCount(Opts()), 0);
}

// A clean stop removes the handle's generated consumer name (by Close, or by
// the destructor) when nothing is pending under it.
TEST_F(StreamsTest, CleanStopWithNothingPendingLeavesNoConsumerBehind) {
  auto a = Open();
  auto c = Open();
  ASSERT_TRUE(a && c);
  const std::string name_a = a->consumer(), name_c = c->consumer();
  ASSERT_NE(name_a, name_c);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(a->Publish(Msg("m-1")).ok());
    ASSERT_TRUE(a->Publish(Msg("m-2")).ok());
  }
  auto got_a = a->Receive(2, 0);
  auto got_c = c->Receive(2, 0);
  ASSERT_TRUE(got_a.ok() && got_c.ok());
  ASSERT_EQ(got_a->size() + got_c->size(), 4u);
  for (const Delivery& d : *got_a) EXPECT_TRUE(a->Ack(d).ok());
  for (const Delivery& d : *got_c) EXPECT_TRUE(c->Ack(d).ok());
  auto before = GroupConsumers(Opts());
  EXPECT_EQ(before.count(name_a), 1u);
  EXPECT_EQ(before.count(name_c), 1u);
  Status s = a->Close();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(GroupConsumers(Opts()).count(name_a), 0u) << "Close left the consumer in the group";
  c.reset();
  EXPECT_TRUE(GroupConsumers(Opts()).empty()) << "the destructor left the consumer in the group";
}

// A name with an entry still pending stays (DELCONSUMER would drop the
// entry's pending state, and nobody would ever take it over): the entry is
// taken over by another consumer once its lease ran out.
TEST_F(StreamsTest, CleanStopWithAnEntryPendingKeepsTheNameAndTheEntryStaysClaimable) {
  auto a = Open();
  ASSERT_TRUE(a);
  const std::string name = a->consumer();
  ASSERT_TRUE(a->Publish(Msg("m-1")).ok());
  ASSERT_TRUE(a->Publish(Msg("m-1")).ok());
  std::vector<Delivery> got = ReceiveAll(*a);
  ASSERT_EQ(got.size(), 2u);
  ASSERT_TRUE(a->Ack(got[0]).ok());  // got[1] stays pending
  Status s = a->Close();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(GroupConsumers(Opts())[name], 1);
  a.reset();
  EXPECT_EQ(GroupConsumers(Opts())[name], 1) << "the destructor removed a consumer with a pending entry";
  auto b = Open(&env_, kLease, "consumer-b");
  ASSERT_TRUE(b);
  EXPECT_TRUE(ReceiveAll(*b).empty()) << "the lease still runs";
  env_.Advance(kLease + 1);
  std::vector<Delivery> taken = ReceiveAll(*b);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].message.id, "m-1");
  EXPECT_EQ(taken[0].message.attempt, 2);
  EXPECT_TRUE(b->Ack(taken[0]).ok());
  EXPECT_EQ(PendingCount(Opts()), 0);
}

// One stable name per process slot: a handle that reuses the name of one
// that closed with entries unacked finds them pending under it, renews their
// leases, and gets them again when the leases run out.
TEST_F(StreamsTest, AStableNameReusedAfterACloseSeesTheEarlierHandlesPendingEntries) {
  auto first = Open(&env_, kLease, "billing-0");
  ASSERT_TRUE(first);
  ASSERT_TRUE(first->Publish(Msg("m-1")).ok());
  ASSERT_TRUE(first->Publish(Msg("m-1")).ok());
  std::vector<Delivery> left = ReceiveAll(*first);  // never acked: the process stops
  ASSERT_EQ(left.size(), 2u);
  EXPECT_TRUE(first->Close().ok());
  first.reset();
  auto second = Open(&env_, kLease, "billing-0");
  ASSERT_TRUE(second);
  EXPECT_EQ(GroupConsumers(Opts())["billing-0"], 2);
  env_.Advance(kLease - 1);
  for (const Delivery& d : left) {
    Status s = second->ExtendLease(d);
    EXPECT_TRUE(s.ok()) << s;
  }
  env_.Advance(2);
  EXPECT_TRUE(ReceiveAll(*second).empty()) << "the renewed leases still run";
  env_.Advance(kLease);
  std::vector<Delivery> again = ReceiveAll(*second);
  ASSERT_EQ(again.size(), 2u);
  for (const Delivery& d : again) {
    EXPECT_EQ(d.message.id, "m-1");
    EXPECT_EQ(d.message.attempt, 2);
    EXPECT_TRUE(second->Ack(d).ok());
  }
  EXPECT_TRUE(second->Close().ok());
  EXPECT_EQ(GroupConsumers(Opts()).count("billing-0"), 0u);
}

TEST_F(StreamsTest, ReceiptsWorkFromAnyHandleAndForeignReceiptsAreInvalid) {
  auto a = Open(&env_, kLease, "consumer-a");
  auto b = Open(&env_, kLease, "consumer-b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Publish(Msg("m-1")).ok());
  ASSERT_TRUE(a->Publish(Msg("m-1")).ok());
  std::vector<Delivery> got = ReceiveAll(*a);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(b->Ack(got[0]).ok()) << "the receipt names its consumer";
  EXPECT_TRUE(b->Nack(got[1], 0).ok());
  std::vector<Delivery> again = ReceiveAll(*b);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].message.attempt, 2);
  EXPECT_TRUE(b->Ack(again[0]).ok());
  Delivery foreign;
  foreign.message = Msg("m-1");
  for (std::string r : {"", "not-a-receipt", "1-0", "1-0:x:c", "1-0:0:c", "1-0:1:", "x-0:1:c"}) {
    foreign.receipt = r;
    EXPECT_EQ(a->Ack(foreign).code(), Code::kInvalidArgument) << r;
    EXPECT_EQ(a->Nack(foreign, 0).code(), Code::kInvalidArgument) << r;
  }
}

TEST_F(StreamsTest, EntryWithoutTheIdFieldIsDeadLetteredByTheConsumerAndAcked) {
  OpenStore();
  auto s = Open();
  ASSERT_TRUE(s);
  StreamOptions o = Opts();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(s->Publish(Msg(Id(0))).ok());
    // A producer that forgot the id field, retrying.
    RedisRaw({"XADD", o.stream, "*", "payload", "4000"});
    ASSERT_TRUE(s->Publish(Msg(Id(1))).ok());
  }
  // Seen by the source: an empty id and a header that says why.
  auto consumer_owned = MustOpen<Consumer>(
      *s, *inbox_, ChargeHandler(),
      Consumer::Options{.max_attempts = 5, .receive_wait_ms = 2 * kLease, .stop_when_idle = true, .env = &env_});
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  ExpectExactlyOnce(2);
  auto dead = store_->ListDeadLetters("payments", 10);
  ASSERT_OK(dead);
  ASSERT_EQ(dead->size(), 2u);  // one per entry: told apart by receipt
  for (const DeadLetter& d : *dead) {
    EXPECT_NE(d.id.find("invalid id"), std::string::npos) << d.id;
    EXPECT_NE(d.error.find("message id is empty"), std::string::npos) << d.error;
    EXPECT_EQ(d.payload, "4000");
  }
  EXPECT_EQ(consumer.stats().dead_lettered, 2u);
  EXPECT_EQ(PendingCount(o), 0);
}

// A message whose handler always fails (a poison message), published twice:
// nacked with backoff, redelivered through the stream's pending list, and
// after max_attempts moved to the dead-letter table and acknowledged; the
// other messages apply once each, and nothing stays pending.
TEST_F(StreamsTest, PoisonMessageReachesTheDeadLetterTableAndTheRestApplyOnce) {
  OpenStore();
  auto s = Open();
  ASSERT_TRUE(s);
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(s->Publish(Msg(Id(i))).ok());
  Handler poison = [](Transaction& tx, const Message& m) -> Status {
    if (m.id == Id(2)) return Status::HandlerFailed("cannot parse order 2");
    return ChargeHandler()(tx, m);
  };
  auto consumer_owned = MustOpen<Consumer>(*s, *inbox_, poison,
                                           Consumer::Options{.max_attempts = 3,
                                                             .backoff_base_ms = 100,
                                                             .backoff_max_ms = 1'000,
                                                             .receive_wait_ms = 2 * kLease,
                                                             .stop_when_idle = true,
                                                             .env = &env_});
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  for (int i : {0, 1, 3}) EXPECT_EQ(Charges(*store_, Id(i)), 1) << Id(i);
  EXPECT_EQ(Charges(*store_, Id(2)), 0);
  auto dead = store_->ListDeadLetters("payments", 10);
  ASSERT_OK(dead);
  ASSERT_EQ(dead->size(), 1u);
  EXPECT_EQ((*dead)[0].id, Id(2));
  EXPECT_EQ((*dead)[0].reason, "failed");
  EXPECT_GE((*dead)[0].attempts, 3) << "max_attempts 3; both copies count";
  EXPECT_NE((*dead)[0].error.find("cannot parse order 2"), std::string::npos) << (*dead)[0].error;
  EXPECT_EQ(PendingCount(Opts()), 0) << "the poison message's copies are acknowledged too";
}

TEST_F(StreamsTest, MissingIdFieldIsReportedInAHeader) {
  auto s = Open();
  ASSERT_TRUE(s);
  RedisRaw({"XADD", Opts().stream, "*", "payload", "x"});
  std::vector<Delivery> got = ReceiveAll(*s);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].message.id, "");
  auto why = got[0].message.Header("idem-error");
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("no field 'id'"), std::string::npos) << *why;
  EXPECT_TRUE(s->Ack(got[0]).ok());
}

// A source that loses some acks (reports OK without acking), as a broker or
// network may: those entries come back after the lease, to be absorbed.
class DroppingSource final : public Source {
 public:
  DroppingSource(Source& inner, int every) : inner_(inner), every_(every) {}
  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override { return inner_.Receive(max, wait_ms); }
  Status Ack(const Delivery& d) override {
    if (++acks_ % every_ == 0) return Status::OK();
    return inner_.Ack(d);
  }
  Status Nack(const Delivery& d, int64_t delay_ms) override { return inner_.Nack(d, delay_ms); }
  std::string_view Kind() const override { return inner_.Kind(); }

 private:
  Source& inner_;
  int every_;
  std::atomic<int> acks_{0};
};

TEST_F(StreamsTest, ConsumerDrainsDuplicatesAndLostAcksToExactlyOneEffectPerMessage) {
  constexpr int kIds = 60;
  OpenStore();
  auto s = Open();
  ASSERT_TRUE(s);
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < kIds; ++i) ASSERT_TRUE(s->Publish(Msg(Id(i))).ok());
  DroppingSource lossy(*s, 5);
  for (int run = 0; run < 10 && PendingCount(Opts()) + (run == 0) > 0; ++run) {
    auto consumer_owned = MustOpen<Consumer>(
        lossy, *inbox_, ChargeHandler(),
        Consumer::Options{.workers = 3, .batch = 4, .receive_wait_ms = 200, .stop_when_idle = true, .env = &env_});
    Consumer& consumer = *consumer_owned;
    ASSERT_TRUE(consumer.Run().ok());
    env_.Advance(kLease + 1);  // lost acks come back
  }
  ExpectExactlyOnce(kIds);
  EXPECT_EQ(PendingCount(Opts()), 0);
  EXPECT_TRUE(ReceiveAll(*s).empty());
}

TEST_F(StreamsTest, ConsumerKilledAfterCommitBeforeAckIsAbsorbedByAnotherConsumer) {
  constexpr int kIds = 20;
  OpenStore();
  {
    auto s = Open();
    ASSERT_TRUE(s);
    for (int round = 0; round < 2; ++round)
      for (int i = 0; i < kIds; ++i) ASSERT_TRUE(s->Publish(Msg(Id(i))).ok());
  }
  store_.reset();
  inbox_.reset();
  // The child consumes with the real clock and a long lease, and SIGKILLs
  // itself after its 7th commit, before that ack.
  const int status = RunInChild([&] {
    auto src = StreamSource::Open(OptionsFor(dir_, 600'000, Env::Default()));
    if (!src.ok()) return 2;
    auto st = sqlite::Store::Open({.path = dir_.File("store.db"), .synchronous = sqlite::Synchronous::kNormal});
    if (!st.ok()) return 3;
    auto inbox_owned = MustOpen<Inbox>(**st, Inbox::Options{.consumer = "payments"});
    Inbox& inbox = *inbox_owned;
    ArmKillPoint("inbox.after_commit", 7);
    auto c_owned = MustOpen<Consumer>(**src, inbox, ChargeHandler(),
                                      Consumer::Options{.receive_wait_ms = 50, .stop_when_idle = true});
    Consumer& c = *c_owned;
    (void)c.Run();
    return 4;
  });
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  EXPECT_GE(PendingCount(Opts()), 1) << "the killed consumer's delivery is still pending";
  OpenStore();
  auto s = Open(&env_, kLease, "survivor");
  ASSERT_TRUE(s);
  env_.Advance(600'001);  // past the dead consumer's lease
  auto consumer_owned =
      MustOpen<Consumer>(*s, *inbox_, ChargeHandler(),
                         Consumer::Options{.receive_wait_ms = 2 * kLease, .stop_when_idle = true, .env = &env_});
  Consumer& consumer = *consumer_owned;
  ASSERT_TRUE(consumer.Run().ok());
  ExpectExactlyOnce(kIds);
  EXPECT_EQ(PendingCount(Opts()), 0);
  EXPECT_EQ(inbox_->counters().applied, static_cast<uint64_t>(kIds - 7));
}

TEST_F(StreamsTest, UnreachableServerIsUnavailableNamingHostPortWithoutThePassword) {
  StreamOptions o = Opts();
  o.url = "redis://:hunter2-secret@127.0.0.1:1";
  o.connect_timeout_ms = 1000;
  auto s = StreamSource::Open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kUnavailable) << s.status();
  EXPECT_NE(s.status().message().find("127.0.0.1:1"), std::string::npos) << s.status();
  EXPECT_EQ(s.status().message().find("hunter2"), std::string::npos) << s.status();
  // A wrong password on the real server.
  auto ep = redis_internal::ParseUrl(RedisUrl());
  ASSERT_TRUE(ep.ok());
  o.url = "redis://idem_pw:not-the-password@" + ep->Address();
  s = StreamSource::Open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kUnavailable) << s.status();
  EXPECT_EQ(s.status().message().find("not-the-password"), std::string::npos) << s.status();
}

TEST_F(StreamsTest, InvalidOptionsAndAMissingGroupAreRejected) {
  auto bad = [&](auto change) {
    StreamOptions o = Opts();
    change(o);
    return StreamSource::Open(o).status().code();
  };
  EXPECT_EQ(bad([](auto& o) { o.stream = ""; }), Code::kInvalidArgument);
  EXPECT_EQ(bad([](auto& o) { o.group = ""; }), Code::kInvalidArgument);
  EXPECT_EQ(bad([](auto& o) { o.id_field = ""; }), Code::kInvalidArgument);
  EXPECT_EQ(bad([](auto& o) { o.payload_field = "id"; }), Code::kInvalidArgument);
  EXPECT_EQ(bad([](auto& o) { o.id_field = "header:id"; }), Code::kInvalidArgument);
  EXPECT_EQ(bad([](auto& o) { o.lease_ms = 0; }), Code::kInvalidArgument);
  EXPECT_EQ(bad([](auto& o) { o.url = "http://x"; }), Code::kInvalidArgument);
  FakeEnv epoch0(0);
  EXPECT_EQ(bad([&](auto& o) { o.env = &epoch0; }), Code::kInvalidArgument);
  Status missing = StreamSource::Open([&] {
                     StreamOptions o = Opts();
                     o.create_group = false;
                     return o;
                   }())
                       .status();
  EXPECT_EQ(missing.code(), Code::kNotFound) << missing;
  EXPECT_NE(missing.message().find("payments"), std::string::npos) << missing;
  auto s = Open();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->Publish(Msg("")).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(s->Receive(0, 0).status().code(), Code::kInvalidArgument);
}

TEST_F(StreamsTest, GroupDestroyedUnderTheSourceIsRecreatedAndLeasesAreLost) {
  auto s = Open();
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->Publish(Msg("m-1")).ok());
  std::vector<Delivery> got = ReceiveAll(*s);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(RedisRaw({"XGROUP", "DESTROY", Opts().stream, "payments"}), "1");
  EXPECT_EQ(s->Ack(got[0]).code(), Code::kLeaseLost);
  // Recreated at the start of the stream: the entry comes again.
  std::vector<Delivery> again = ReceiveAll(*s);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].message.id, "m-1");
  EXPECT_TRUE(s->Ack(again[0]).ok());
}

TEST_F(StreamsTest, RealClockReceiveBlocksUntilAnEntryArrives) {
  auto s = Open(Env::Default(), 5'000);
  ASSERT_TRUE(s);
  auto t0 = std::chrono::steady_clock::now();
  auto none = s->Receive(10, 150);
  ASSERT_OK(none);
  EXPECT_TRUE(none->empty());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(140));
  std::thread producer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (void)s->Publish(Msg("m-1"));
    (void)s->Publish(Msg("m-1"));
  });
  // Each wait is far longer than the producer takes: a receive that returns
  // before its wait ran out was woken by the XADD (not a speed check: only
  // whether the wait ended early).
  constexpr auto kWait = std::chrono::seconds(60);
  std::vector<Delivery> got;
  for (int call = 0; call < 2 && got.size() < 2; ++call) {
    const auto start = std::chrono::steady_clock::now();
    auto r = s->Receive(10, std::chrono::duration_cast<std::chrono::milliseconds>(kWait).count());
    ASSERT_OK(r);
    EXPECT_LT(std::chrono::steady_clock::now() - start, kWait) << "the wait ran out: not woken by the XADD";
    for (auto& d : *r) got.push_back(std::move(d));
  }
  producer.join();
  ASSERT_EQ(got.size(), 2u);
  for (const Delivery& d : got) EXPECT_TRUE(s->Ack(d).ok());
}

// ---------------------------------------------------------------------------
// A redis-server of this test's own, restarted mid-run.
// ---------------------------------------------------------------------------

// OwnRedis: see redis/redis_test_util.h.

TEST_F(StreamsTest, ServerRestartMidRunLosesNothingAndAppliesEachMessageOnce) {
  OwnRedis server(IDEM_TEST_STREAMS_RESTART_PORT);  // IDEM_TEST_REDIS_PORT + 3
  std::filesystem::create_directories(dir_.File("redis"));
  ASSERT_TRUE(server.Start(dir_.File("redis")));
  constexpr int kIds = 200;
  OpenStore();
  StreamOptions o = OptionsFor(dir_, 2'000, Env::Default(), server.url());
  auto s = StreamSource::Open(o);
  ASSERT_OK(s);
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < kIds; ++i) ASSERT_TRUE((*s)->Publish(Msg(Id(i))).ok());
  // Slow handler: the restart falls in the middle of the run.
  std::atomic<int> handled{0};
  Handler slow = [&](Transaction& tx, const Message& m) {
    ++handled;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return ChargeHandler()(tx, m);
  };
  auto consumer_owned = MustOpen<Consumer>(
      **s, *inbox_, slow,
      Consumer::Options{.workers = 2, .backoff_base_ms = 20, .backoff_max_ms = 200, .receive_wait_ms = 50});
  Consumer& consumer = *consumer_owned;
  std::thread runner([&] { (void)consumer.Run(); });
  while (handled.load() < kIds / 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  server.Stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_TRUE(server.Start(dir_.File("redis")));
  // Done when every message applied and nothing is pending or unread.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    std::string lag = RedisRaw({"XINFO", "GROUPS", o.stream}, server.url());
    // Pending 0 alone is not the end: between two reads nothing may be
    // pending while the second round's entries are still unread.
    if (Charges(*store_) >= kIds && GroupReadEverything(o, server.url()) && PendingCount(o, server.url()) == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "not drained: " << lag;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  consumer.Stop();
  runner.join();
  ExpectExactlyOnce(kIds);
  EXPECT_GE(consumer.stats().receive_errors + consumer.stats().ack_errors, 1u) << "the restart was seen";
  // Every entry was read by the group (none left unread).
  auto left = (*s)->Receive(1000, 0);
  ASSERT_OK(left);
  EXPECT_TRUE(left->empty());
}

// The outbox relay across a server restart: the server goes away after the
// relay's third batch and comes back while its publishes fail; the relay
// backs off and finishes. Every row arrives (each message was added twice),
// as often as the server confirmed it, each key's first copies in order.
TEST_F(StreamsTest, TheOutboxRelayBacksOffAcrossAServerRestartAndLosesNothing) {
  OwnRedis server(IDEM_TEST_STREAMS_RESTART_PORT);
  const std::string data = dir_.File("redis");
  std::filesystem::create_directories(data);
  ASSERT_TRUE(server.Start(data));
  RelayWorkload w(60, 6);
  auto store = OpenOutboxStore(dir_.File("outbox.db"));
  ASSERT_OK(store);
  for (int add = 0; add < 2; ++add) ASSERT_TRUE(AddInTransactions(**store, w.messages, 10).ok());
  StreamOptions o = OptionsFor(dir_, kLease, Env::Default(), server.url());
  ASSERT_TRUE(StreamSource::Open(o).ok());  // the group first: it reads the stream from its start
  auto p = redis::StreamPublisher::Open({.url = o.url, .stream = o.stream});
  ASSERT_OK(p);
  bool restarted = false;
  auto stats = DrainAcrossABrokerRestart(
      **store, **p, dir_.File("published.log"), 3, [&] { server.Stop(); },
      [&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        restarted = server.Start(data);
      });
  ASSERT_TRUE(restarted);
  ASSERT_OK(stats);
  EXPECT_GE(stats->transient_errors, 1u) << "the relay saw the server go";
  const std::map<RelayedRow, int> confirmed = ReadPublishLog(dir_.File("published.log"));
  auto s = StreamSource::Open(o);  // a connection to the server that came back
  ASSERT_OK(s);
  std::vector<Delivery> got = ReceiveUntil(**s, CountCopies(confirmed));
  ASSERT_EQ(got.size(), CountCopies(confirmed));
  ExpectCopiesAsConfirmed(ExpectRelayed(w, got, 2), confirmed);
  for (const Delivery& d : got) EXPECT_TRUE((*s)->Ack(d).ok()) << d.message.id;
  auto left = (*s)->Receive(1000, 0);
  ASSERT_OK(left);
  EXPECT_TRUE(left->empty()) << left->size() << " copies left";
}

// ---------------------------------------------------------------------------
// The wire format (doc/wire-format.md), the publisher, opening by URL.
// ---------------------------------------------------------------------------

// Entries written under the producer time's former field name keep their
// time; the current name wins over a former one; none of them is a header.
TEST_F(StreamsTest, FormerProducerTimeFieldNamesAreRead) {
  auto s = Open();
  ASSERT_TRUE(s);
  const std::string stream = Opts().stream;
  RedisRaw({"XADD", stream, "*", "id", "redis-name", "producer_time_ms", "1700000000002", "payload", "p"});
  RedisRaw({"XADD", stream, "*", "id", "kafka-name", "idem-produced-at-ms", "1700000000001", "payload", "p"});
  RedisRaw({"XADD", stream, "*", "id", "both", "producer_time_ms", "5", "idem-producer-time-ms", "1700000000003"});
  std::vector<Delivery> got = ReceiveAll(*s);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].message.id, "redis-name");
  EXPECT_EQ(got[0].message.producer_time_ms, 1'700'000'000'002);
  EXPECT_EQ(got[1].message.producer_time_ms, 1'700'000'000'001);
  EXPECT_EQ(got[2].message.producer_time_ms, 1'700'000'000'003);
  for (const Delivery& d : got) {
    EXPECT_TRUE(d.message.headers.empty()) << d.message.id;
    EXPECT_TRUE(s->Ack(d).ok());
  }
}

TEST_F(StreamsTest, PublisherWritesTheCurrentProducerTimeName) {
  auto pub = redis::StreamPublisher::Open({.url = RedisUrl(), .stream = Opts().stream});
  ASSERT_OK(pub);
  EXPECT_EQ((*pub)->Kind(), "redis-streams");
  Message m = Msg("m-1");
  m.producer_time_ms = 1'712'345'678'901;
  auto entry = (*pub)->Append(m);
  ASSERT_OK(entry);
  auto ep = redis_internal::ParseUrl(RedisUrl());
  ASSERT_TRUE(ep.ok());
  auto c = redis_internal::Conn::Connect(*ep, {});
  ASSERT_OK(c);
  auto r = (*c)->Command({"XRANGE", Opts().stream, *entry, *entry});
  ASSERT_OK(r);
  ASSERT_EQ((*r)->elements, 1u);
  const redisReply* fields = (*r)->element[0]->element[1];
  std::vector<std::string> names;
  for (size_t k = 0; k < fields->elements; k += 2) names.emplace_back(redis_internal::ReplyString(fields->element[k]));
  EXPECT_EQ(names, (std::vector<std::string>{"id", "idem-producer-time-ms", "payload"}));
  auto s = Open();
  ASSERT_TRUE(s);
  std::vector<Delivery> got = ReceiveAll(*s);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].message.producer_time_ms, m.producer_time_ms);
  EXPECT_TRUE(s->Ack(got[0]).ok());
  // Without a stream a publisher opens (PublishBatch names a destination
  // per message); Publish then says that no stream was given.
  auto none = redis::StreamPublisher::Open({.url = RedisUrl(), .stream = ""});
  ASSERT_OK(none);
  EXPECT_EQ((*none)->Channel(), "");
  EXPECT_EQ((*none)->Publish(m).code(), Code::kInvalidArgument);
  auto by_url = OpenPublisher(RedisUrl());
  ASSERT_OK(by_url);
  EXPECT_EQ((*by_url)->Channel(), "");
  const auto opts = Opts();  // the destination's view must outlive the batch
  const Outgoing there[] = {{opts.stream, "k", &m}};
  EXPECT_TRUE((*by_url)->PublishBatch(there)[0].ok());
  EXPECT_EQ((*pub)->Publish(Msg("")).code(), Code::kInvalidArgument);
}

TEST_F(StreamsTest, ParseUrlReadsEveryKey) {
  auto o = StreamSource::ParseUrl(
      "redis://:pw@127.0.0.1:6380/3?stream=orders&group=billing&consumer=billing-0&id_field=oid&payload_field=body"
      "&lease_ms=5000&create_group=false&delete_on_ack=true&poll_ms=7&pool_size=3&connect_timeout_ms=900");
  ASSERT_OK(o);
  EXPECT_EQ(o->url, "redis://:pw@127.0.0.1:6380/3");
  EXPECT_EQ(o->stream, "orders");
  EXPECT_EQ(o->group, "billing");
  EXPECT_EQ(o->consumer, "billing-0");
  EXPECT_EQ(o->id_field, "oid");
  EXPECT_EQ(o->payload_field, "body");
  EXPECT_EQ(o->lease_ms, 5'000);
  EXPECT_FALSE(o->create_group);
  EXPECT_TRUE(o->delete_on_ack);
  EXPECT_EQ(o->poll_ms, 7);
  EXPECT_EQ(o->pool_size, 3);
  EXPECT_EQ(o->connect_timeout_ms, 900);
  auto plain = StreamSource::ParseUrl("redis://h?stream=s");
  ASSERT_OK(plain);
  EXPECT_EQ(plain->group, "idem");
  EXPECT_EQ(plain->lease_ms, StreamSource::Options{}.lease_ms);
  auto pub = redis::StreamPublisher::ParseUrl("redis://h/2?stream=s&group=g&id_field=oid&pool_size=2");
  ASSERT_OK(pub);
  EXPECT_EQ(pub->url, "redis://h/2");
  EXPECT_EQ(pub->stream, "s");
  EXPECT_EQ(pub->id_field, "oid");
  EXPECT_EQ(pub->pool_size, 2);
  for (const char* bad : {"redis://:topsecret@h", "redis://:topsecret@h?stream=s&colour=red",
                          "redis://:topsecret@h?stream=s&lease_ms=0", "redis://:topsecret@h?stream=s&pool_size=x",
                          "redis://:topsecret@h:0?stream=s", "rediss://:topsecret@h?stream=s",
                          "redis://:topsecret@h?stream=s&create_group=maybe", "embedded:/tmp/q.db?stream=s"}) {
    auto r = StreamSource::ParseUrl(bad);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_EQ(r.status().message().find("topsecret"), std::string::npos) << r.status();
  }
}

TEST_F(StreamsTest, OpenSourceAndOpenPublisherByUrl) {
  const std::string url = RedisUrl() + "?stream=" + Opts().stream + "&group=by-url&lease_ms=4000";
  auto pub = OpenPublisher(url);
  ASSERT_OK(pub);
  EXPECT_EQ((*pub)->Kind(), "redis-streams");
  Message m = Msg("m-1");
  m.producer_time_ms = 1'700'000'000'000;
  ASSERT_TRUE((*pub)->Publish(m).ok());
  ASSERT_TRUE((*pub)->Publish(m).ok());
  auto src = OpenSource(url, {.lease_ms = 99, .consumer = "by-url-0"});
  ASSERT_OK(src);
  EXPECT_EQ((*src)->Kind(), "redis-streams");
  EXPECT_EQ((*src)->lease_ms(), 4'000);  // the URL's, not the settings'
  auto* streams = dynamic_cast<StreamSource*>(src->get());
  ASSERT_NE(streams, nullptr);
  EXPECT_EQ(streams->consumer(), "by-url-0");
  std::vector<Delivery> got = ReceiveAll(**src);
  ASSERT_EQ(got.size(), 2u);
  for (const Delivery& d : got) {
    EXPECT_EQ(d.message.id, "m-1");
    EXPECT_EQ(d.message.producer_time_ms, m.producer_time_ms);
    EXPECT_TRUE((*src)->Ack(d).ok());
  }
  EXPECT_TRUE(streams->Close().ok());
  auto unreachable = OpenSource("redis://:topsecret@127.0.0.1:1?stream=s&connect_timeout_ms=500");
  EXPECT_EQ(unreachable.status().code(), Code::kUnavailable) << unreachable.status();
  EXPECT_EQ(unreachable.status().message().find("topsecret"), std::string::npos) << unreachable.status();
}

// OpenSource without a consumer name (in the URL or the settings): each
// source is a consumer of its own, named anew per start and reported by
// consumer(), never a name every such process would share.
TEST_F(StreamsTest, OpenSourceWithoutAConsumerNameGivesEachStartANameOfItsOwn) {
  EXPECT_TRUE(SourceOptions{}.consumer.empty());
  const std::string url = RedisUrl() + "?stream=" + Opts().stream + "&group=unnamed";
  auto a = OpenSource(url);
  ASSERT_OK(a);
  auto b = OpenSource(url, SourceOptions{});
  ASSERT_OK(b);
  auto* sa = dynamic_cast<StreamSource*>(a->get());
  auto* sb = dynamic_cast<StreamSource*>(b->get());
  ASSERT_NE(sa, nullptr);
  ASSERT_NE(sb, nullptr);
  EXPECT_NE(sa->consumer(), "idem");
  EXPECT_NE(sa->consumer(), sb->consumer());
  EXPECT_EQ(sa->consumer().rfind("idem-", 0), 0u) << sa->consumer();
  EXPECT_NE(sa->consumer().find("-" + std::to_string(::getpid()) + "-"), std::string::npos) << sa->consumer();
  EXPECT_TRUE(sa->Close().ok());
  EXPECT_TRUE(sb->Close().ok());
}

}  // namespace
}  // namespace idem::testing
