// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// RabbitMQ by URL (idem::OpenSource / idem::OpenPublisher, idem/open.h), and
// the wire format's former producer-time names (doc/wire-format.md), on the
// fixture's broker.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "idem/amqp/source.h"
#include "idem/open.h"
#include "util/test_servers.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

std::string BaseUrl() { return FixtureServerUrl("rabbitmq", ""); }

std::string QueueName(const std::string& what) { return UniqueServerName("idem-open-" + what + "-"); }

TEST(AmqpOpenByUrl, PublisherAndSourceOfOneUrlMeetOnTheQueue) {
  ASSERT_FALSE(BaseUrl().empty()) << "no broker (run via ctest, which starts it)";
  const std::string url = BaseUrl() + "?queue=" + QueueName("url") + "&prefetch=10&queue_type=quorum";
  auto pub = OpenPublisher(url);
  ASSERT_OK(pub);
  EXPECT_EQ((*pub)->Kind(), "amqp");
  auto src = OpenSource(url, {.lease_ms = 60'000});
  ASSERT_OK(src);
  EXPECT_EQ((*src)->Kind(), "amqp");
  EXPECT_EQ((*src)->lease_ms(), 60'000);
  Message m = Msg("m-1", "body");
  m.producer_time_ms = 1'712'345'678'901;
  ASSERT_TRUE((*pub)->Publish(m).ok());
  ASSERT_TRUE((*pub)->Publish(m).ok());
  std::vector<Delivery> got = ReceiveUntil(**src, 2);
  ASSERT_EQ(got.size(), 2u);
  for (const Delivery& d : got) {
    EXPECT_EQ(d.message.id, "m-1");
    EXPECT_EQ(d.message.payload, "body");
    EXPECT_EQ(d.message.producer_time_ms, m.producer_time_ms);
    EXPECT_TRUE((*src)->Ack(d).ok());
  }
}

TEST(AmqpOpenByUrl, BadKeysAndValuesAreRefusedBeforeConnecting) {
  for (const std::string q :
       {"?queue=q&colour=red", "?queue=q&prefetch=0", "?queue=q&prefetch=1x", "?queue=q&declare_queue=maybe"}) {
    auto src = OpenSource(BaseUrl() + q);
    EXPECT_EQ(src.status().code(), Code::kInvalidArgument) << q << ": " << src.status();
    EXPECT_EQ(src.status().message().find("secret"), std::string::npos) << src.status();
    auto pub = OpenPublisher(BaseUrl() + q);
    EXPECT_EQ(pub.status().code(), Code::kInvalidArgument) << q << ": " << pub.status();
  }
}

// A source needs a queue; a publisher opens without one (Channel() empty:
// Publish says so, PublishBatch names a destination per message), and an
// unroutable element of a batch is kRejected alone, naming its routing key.
TEST(AmqpOpenByUrl, APublisherWithoutAQueuePublishesBatchesAndRejectsJustTheUnroutableElement) {
  ASSERT_FALSE(BaseUrl().empty()) << "no broker (run via ctest, which starts it)";
  EXPECT_EQ(OpenSource(BaseUrl() + "?prefetch=5").status().code(), Code::kInvalidArgument);
  auto pub = OpenPublisher(BaseUrl() + "?prefetch=5");
  ASSERT_OK(pub);
  EXPECT_EQ((*pub)->Channel(), "");
  Status no_queue = (*pub)->Publish(Msg("m-0"));
  EXPECT_EQ(no_queue.code(), Code::kInvalidArgument) << no_queue;
  EXPECT_NE(no_queue.message().find("no queue"), std::string::npos) << no_queue;
  const std::string queue = QueueName("batch"), missing = QueueName("nobody");
  auto src = OpenSource(BaseUrl() + "?queue=" + queue);
  ASSERT_OK(src);
  Message a = Msg("m-1", "a"), lost = Msg("m-2", "b"), c = Msg("m-3", "c");
  const Outgoing batch[] = {{queue, "k-1", &a}, {missing, "k-2", &lost}, {queue, "k-3", &c}};
  for (int round = 0; round < 2; ++round) {
    std::vector<Status> st = (*pub)->PublishBatch(batch);
    ASSERT_EQ(st.size(), 3u);
    EXPECT_TRUE(st[0].ok()) << st[0];
    EXPECT_EQ(st[1].code(), Code::kRejected) << st[1];
    EXPECT_NE(st[1].message().find(missing), std::string::npos) << st[1];
    EXPECT_TRUE(st[2].ok()) << st[2];
  }
  std::vector<Delivery> got = ReceiveUntil(**src, 4);
  ASSERT_EQ(got.size(), 4u);
  std::map<std::string, int> ids;
  for (const Delivery& d : got) {
    ++ids[d.message.id];
    EXPECT_EQ(d.message.Header(kOrderingKeyHeader), d.message.id == "m-1" ? "k-1" : "k-3");
    EXPECT_TRUE((*src)->Ack(d).ok());
  }
  EXPECT_EQ(ids, (std::map<std::string, int>{{"m-1", 2}, {"m-3", 2}}));
  // The publisher goes on working after the return.
  EXPECT_TRUE((*pub)->PublishBatch(std::span<const Outgoing>(batch, 1))[0].ok());
}

// Messages written under the producer time's former names keep their time;
// the current name wins over a former one. None of them is a header.
TEST(AmqpWireFormat, FormerProducerTimeNamesAreRead) {
  ASSERT_FALSE(BaseUrl().empty()) << "no broker (run via ctest, which starts it)";
  const std::string queue = QueueName("wire");
  auto pub = amqp::Publisher::Open({.url = BaseUrl(), .queue = queue, .declare_queue = true});
  ASSERT_OK(pub);
  auto src = amqp::Source::Open({.url = BaseUrl(), .queue = queue});
  ASSERT_OK(src);
  Message kafka_name = Msg("kafka-name");
  kafka_name.headers = {{"idem-produced-at-ms", "1700000000001"}, {"trace", "t"}};
  Message redis_name = Msg("redis-name");
  redis_name.headers = {{"producer_time_ms", "1700000000002"}};
  Message both = Msg("both");
  both.producer_time_ms = 1'700'000'000'003;  // idem-producer-time-ms, as an integer
  both.headers = {{"producer_time_ms", "5"}};
  for (const Message& m : {kafka_name, redis_name, both}) ASSERT_TRUE((*pub)->Publish(m).ok()) << m.id;
  std::vector<Delivery> got = ReceiveUntil(**src, 3);
  ASSERT_EQ(got.size(), 3u);
  for (const Delivery& d : got) {
    const Message& m = d.message;
    if (m.id == "kafka-name") {
      EXPECT_EQ(m.producer_time_ms, 1'700'000'000'001);
      EXPECT_EQ(m.headers, (std::vector<std::pair<std::string, std::string>>{{"trace", "t"}}));
    } else if (m.id == "redis-name") {
      EXPECT_EQ(m.producer_time_ms, 1'700'000'000'002);
      EXPECT_TRUE(m.headers.empty());
    } else {
      EXPECT_EQ(m.producer_time_ms, 1'700'000'000'003);
      EXPECT_TRUE(m.headers.empty());
    }
    EXPECT_TRUE((*src)->Ack(d).ok());
  }
}

}  // namespace
}  // namespace idem::testing
