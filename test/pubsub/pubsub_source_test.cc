// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::pubsub on the fixture's emulator, beyond the delivery suite: the
// service's acknowledgement deadlines in real time (PubsubLeases: each test
// waits past a 10 s deadline, the shortest Pub/Sub has), ordering keys, bad
// input, and opening by URL.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "idem/consumer.h"
#include "idem/inbox.h"
#include "idem/open.h"
#include "idem/pubsub/publisher.h"
#include "idem/pubsub/source.h"
#include "idem/sqlite/store.h"
#include "pubsub/pubsub_test_util.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

struct Channel {
  std::unique_ptr<pubsub::Source> source;
  std::unique_ptr<pubsub::Publisher> publisher;
  std::string topic, subscription;
};

// A new topic and subscription (10 s deadline unless told).
Channel NewChannel(const std::string& prefix, pubsub::Source::Options o = {}) {
  Channel c;
  const std::string base = PubsubName(prefix);
  c.topic = "t" + base;
  c.subscription = "s" + base;
  o.connection = PubsubConnection();
  o.subscription = c.subscription;
  o.topic = c.topic;
  o.create = true;
  if (o.lease_ms == 30'000) o.lease_ms = 10'000;
  c.source = MustOpen<pubsub::Source>(o);
  c.publisher =
      MustOpen<pubsub::Publisher>(pubsub::Publisher::Options{.connection = PubsubConnection(), .topic = c.topic});
  return c;
}

void Sleep(int64_t ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

TEST(PubsubLeases, LeaseIsTheSubscriptionsAckDeadline) {
  Channel c = NewChannel("lease", {.lease_ms = 20'000});
  EXPECT_EQ(c.source->lease_ms(), 20'000);
  EXPECT_EQ(c.source->Kind(), "pubsub");
}

// ExtendLease (modifyAckDeadline) keeps a delivery past the subscription's
// 10 s deadline: no redelivery meanwhile, and the ack then succeeds.
TEST(PubsubLeases, ExtendLeaseKeepsTheMessagePastTheDeadline) {
  Channel c = NewChannel("extend", {.exactly_once = true});
  ASSERT_OK(c.publisher->Publish(Msg("m-1")));
  std::vector<Delivery> got = ReceiveUntil(*c.source, 1);
  ASSERT_EQ(got.size(), 1u);
  // 6 x 3 s: 18 s, past the 10 s deadline; each extension comes 7 s before
  // the deadline it renews, room for a loaded machine.
  for (int round = 0; round < 6; ++round) {
    Sleep(3'000);
    ASSERT_OK(c.source->ExtendLease(got[0]));
    auto again = c.source->Receive(10, 0);
    ASSERT_OK(again);
    EXPECT_TRUE(again->empty()) << "redelivered during an extended lease, round " << round;
  }
  EXPECT_OK(c.source->Ack(got[0]));
  Sleep(11'000);
  auto after = c.source->Receive(10, 0);
  ASSERT_OK(after);
  EXPECT_TRUE(after->empty()) << "redelivered after its ack";
}

// A handler whose commit lands after the ack deadline: on an exactly-once
// subscription the late ack is refused (kLeaseLost), the message comes back,
// and the Inbox absorbs the copy: one effect.
TEST(PubsubLeases, AnExpiredAckIdIsLeaseLostAndTheRedeliveryIsAbsorbedByTheInbox) {
  TempDir dir;
  Channel c =
      NewChannel("expired", {.exactly_once = true, .dead_letter_topic = PubsubName("x"), .max_delivery_attempts = 5});
  auto opened = sqlite::Store::Open({.path = dir.File("store.db")});
  ASSERT_OK(opened);
  Store& store = **opened;
  ASSERT_OK(CreatePayments(store));
  auto inbox = MustOpen<Inbox>(store, Inbox::Options{.consumer = "pubsub"});
  ASSERT_OK(c.publisher->Publish(Msg("order-7", "700")));
  std::vector<Delivery> first = ReceiveUntil(*c.source, 1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].message.attempt, 1);
  // The handler commits, then stalls past the deadline before its ack.
  Outcome o = inbox->Handle(first[0].message, ChargeHandler());
  ASSERT_EQ(o.kind, Outcome::Kind::kApplied) << o.status;
  std::vector<Delivery> second = ReceiveUntil(*c.source, 1, 40);  // redelivered once the deadline passed
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].message.id, "order-7");
  EXPECT_EQ(second[0].message.attempt, 2);
  Status late = c.source->Ack(first[0]);
  EXPECT_EQ(late.code(), Code::kLeaseLost) << late;
  // The copy goes through the Consumer and the Inbox: a duplicate, acked.
  ASSERT_OK(c.source->Nack(second[0], 0));
  auto consumer = MustOpen<Consumer>(*c.source, *inbox, ChargeHandler(),
                                     Consumer::Options{.receive_wait_ms = 500, .stop_when_idle = true});
  ASSERT_OK(consumer->Run());
  EXPECT_EQ(Charges(store, "order-7"), 1);
  EXPECT_EQ(consumer->stats().acked, 1u) << "the copy, a duplicate, is acknowledged";
  auto left = c.source->Receive(10, 0);
  ASSERT_OK(left);
  EXPECT_TRUE(left->empty());
}

// The ordering key reaches the subscription (orderingKey), from the batch's
// key, the publisher's option, or the message's idem-ordering-key header,
// and an ordered subscription delivers one key's messages in order.
TEST(PubsubOrdering, TheOrderingKeyIsPassedThroughAndKeepsOrder) {
  Channel c = NewChannel("order", {.ordering = true});
  std::vector<Message> ms;
  for (int i = 0; i < 5; ++i) ms.push_back(Msg("k-" + std::to_string(i), std::to_string(i)));
  std::vector<Outgoing> batch;
  for (const Message& m : ms) batch.push_back({.key = "acct-1", .message = &m});
  for (const Status& s : c.publisher->PublishBatch(batch)) ASSERT_OK(s);
  Message with_header = Msg("h-1");
  with_header.headers = {{std::string(kOrderingKeyHeader), "acct-2"}};
  ASSERT_OK(c.publisher->Publish(with_header));
  auto keyed = MustOpen<pubsub::Publisher>(
      pubsub::Publisher::Options{.connection = PubsubConnection(), .topic = c.topic, .ordering_key = "acct-3"});
  ASSERT_OK(keyed->Publish(Msg("o-1")));

  std::vector<Delivery> got = ReceiveUntil(*c.source, 7);
  ASSERT_EQ(got.size(), 7u);
  std::vector<std::string> acct1;
  for (const Delivery& d : got) {
    const auto key = d.message.Header(kOrderingKeyHeader);
    ASSERT_TRUE(key.has_value()) << d.message.id;
    if (d.message.id.starts_with("k-")) {
      EXPECT_EQ(*key, "acct-1");
      acct1.push_back(d.message.id);
    } else if (d.message.id == "h-1") {
      EXPECT_EQ(*key, "acct-2");
      EXPECT_EQ(d.message.headers.size(), 1u) << "the header is the ordering key, not an attribute besides";
    } else {
      EXPECT_EQ(d.message.id, "o-1");
      EXPECT_EQ(*key, "acct-3");
    }
    EXPECT_OK(c.source->Ack(d));
  }
  EXPECT_EQ(acct1, (std::vector<std::string>{"k-0", "k-1", "k-2", "k-3", "k-4"}));
}

TEST(PubsubBadInput, AMissingSubscriptionIsNotFoundAtOpen) {
  auto s = pubsub::Source::Open({.connection = PubsubConnection(), .subscription = PubsubName("missing")});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kNotFound) << s.status();
  EXPECT_NE(s.status().message().find("subscription"), std::string::npos) << s.status();
}

TEST(PubsubBadInput, AMissingTopicIsNotFoundAtOpenAndRejectedInABatch) {
  auto p = pubsub::Publisher::Open({.connection = PubsubConnection(), .topic = PubsubName("missing")});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Code::kNotFound) << p.status();
  Channel c = NewChannel("dest");
  const Message m = Msg("m-1");
  const std::string nowhere = PubsubName("nowhere");
  const Outgoing o[] = {{.destination = nowhere, .message = &m}, {.message = &m}};
  std::vector<Status> got = c.publisher->PublishBatch(o);
  EXPECT_EQ(got[0].code(), Code::kRejected) << got[0];
  EXPECT_OK(got[1]);
}

TEST(PubsubBadInput, AnUnreachableEndpointIsUnavailableAfterBoundedTries) {
  pubsub::Connection c{.project = kPubsubProject, .endpoint = "http://127.0.0.1:1", .max_attempts = 3};
  auto s = pubsub::Source::Open({.connection = c, .subscription = "sub-x"});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kUnavailable) << s.status();
}

// A message no idem publisher wrote: no id attribute (id_fallback off), or
// data that is not base64. It is delivered with an empty id and the reason,
// and the Consumer dead-letters and acknowledges it: nothing is lost silently
// and nothing is applied.
TEST(PubsubBadInput, AMalformedMessageIsDeliveredWithItsErrorAndDeadLettered) {
  TempDir dir;
  Channel c = NewChannel("malformed", {.id_fallback = false});
  httplib::Client raw(PubsubEndpoint());
  const std::string path = "/v1/projects/" + std::string(kPubsubProject) + "/topics/" + c.topic + ":publish";
  const nlohmann::json body = {{"messages",
                                {{{"data", "aGVsbG8="}, {"attributes", {{"other", "x"}}}},
                                 {{"data", "aGVsbG8="}, {"attributes", {{"idem-b64:idem-id", "***"}}}}}}};
  auto r = raw.Post(path, body.dump(), "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  ASSERT_EQ(r->status, 200) << r->body;
  std::vector<Delivery> got = ReceiveUntil(*c.source, 2);
  ASSERT_EQ(got.size(), 2u);
  for (const Delivery& d : got) {
    EXPECT_TRUE(d.message.id.empty());
    const auto why = d.message.Header(pubsub::kErrorHeader);
    ASSERT_TRUE(why.has_value());
    EXPECT_TRUE(why->find("idem-id") != std::string_view::npos) << *why;
    ASSERT_OK(c.source->Nack(d, 0));
  }
  auto opened = sqlite::Store::Open({.path = dir.File("store.db")});
  ASSERT_OK(opened);
  Store& store = **opened;
  ASSERT_OK(CreatePayments(store));
  auto inbox = MustOpen<Inbox>(store, Inbox::Options{.consumer = "pubsub"});
  auto consumer = MustOpen<Consumer>(*c.source, *inbox, ChargeHandler(),
                                     Consumer::Options{.receive_wait_ms = 500, .stop_when_idle = true});
  ASSERT_OK(consumer->Run());
  EXPECT_EQ(consumer->stats().dead_lettered, 2u);
  EXPECT_EQ(Charges(store), 0);
  auto left = c.source->Receive(10, 0);
  ASSERT_OK(left);
  EXPECT_TRUE(left->empty()) << "dead-lettered messages are acknowledged";
}

// One URL opens the source and, with topic=, the publisher onto its topic.
TEST(PubsubOpen, OneUrlOpensTheSourceAndThePublisher) {
  const std::string base = PubsubName("url");
  const std::string url = "pubsub://" + std::string(kPubsubProject) + "/s" + base + "?topic=t" + base +
                          "&create=true&endpoint=" + PubsubEndpoint();
  auto src = OpenSource(url);
  ASSERT_OK(src);
  EXPECT_EQ((*src)->Kind(), "pubsub");
  auto pub = OpenPublisher(url);
  ASSERT_OK(pub);
  EXPECT_EQ((*pub)->Channel(), "t" + base);
  ASSERT_OK((*pub)->Publish(Msg("u-1", "42")));
  std::vector<Delivery> got = ReceiveUntil(**src, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].message.id, "u-1");
  EXPECT_EQ(got[0].message.payload, "42");
  EXPECT_OK((*src)->Ack(got[0]));
}

}  // namespace
}  // namespace idem::testing
