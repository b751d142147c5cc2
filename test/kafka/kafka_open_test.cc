// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Kafka by URL (Source::ParseUrl, Publisher::ParseUrl, idem::OpenSource and
// idem::OpenPublisher of idem/open.h) and the wire format's producer-time
// names (doc/wire-format.md), on librdkafka's mock cluster.
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>

#include <chrono>
#include <string>
#include <vector>

#include "idem/kafka/source.h"
#include "idem/open.h"
#include "mock_kafka.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

constexpr const char* kTopic = "orders";

TEST(KafkaUrl, ParseUrlReadsEveryKey) {
  auto o = kafka::Source::ParseUrl(
      "kafka://k1:9092,[::1]:9093,k3?topic=orders&group=billing&id_header=oid&id_from_key=true&client_id=c"
      "&session_timeout_ms=6000&heartbeat_interval_ms=300&max_poll_interval_ms=60000&auto_offset_reset=latest"
      "&revoke_wait_ms=100&connect_timeout_ms=2000");
  ASSERT_OK(o);
  EXPECT_EQ(o->brokers, "k1:9092,[::1]:9093,k3");
  EXPECT_EQ(o->topic, "orders");
  EXPECT_EQ(o->group, "billing");
  EXPECT_EQ(o->id_header, "oid");
  EXPECT_TRUE(o->id_from_key);
  EXPECT_EQ(o->client_id, "c");
  EXPECT_EQ(o->session_timeout_ms, 6'000);
  EXPECT_EQ(o->heartbeat_interval_ms, 300);
  EXPECT_EQ(o->max_poll_interval_ms, 60'000);
  EXPECT_EQ(o->auto_offset_reset, "latest");
  EXPECT_EQ(o->revoke_wait_ms, 100);
  EXPECT_EQ(o->connect_timeout_ms, 2'000);
  // What a URL leaves out.
  auto plain = kafka::Source::ParseUrl("kafka://k1:9092?topic=t&session_timeout_ms=400");
  ASSERT_OK(plain);
  EXPECT_EQ(plain->group, "idem");
  EXPECT_EQ(plain->connect_timeout_ms, 5'000);
  EXPECT_EQ(plain->heartbeat_interval_ms, 100);  // a quarter of the session timeout
  EXPECT_EQ(kafka::Source::ParseUrl("kafka://k?topic=t")->heartbeat_interval_ms, 1'000);
  auto pub = kafka::Publisher::ParseUrl("kafka://k1:9092?topic=t&group=g&id_header=oid&connect_timeout_ms=700");
  ASSERT_OK(pub);
  EXPECT_EQ(pub->brokers, "k1:9092");
  EXPECT_EQ(pub->topic, "t");
  EXPECT_EQ(pub->id_header, "oid");
  EXPECT_EQ(pub->connect_timeout_ms, 700);
  for (const char* bad : {"kafka://k", "kafka://k?topic=t&colour=red", "kafka://k?topic=t&session_timeout_ms=10",
                          "kafka://k?topic=t&revoke_wait_ms=soon", "kafka://u:topsecret@k?topic=t",
                          "kafka://k?topic=t&auto_offset_reset=middle", "kafka://k:0?topic=t", "amqp://k?topic=t",
                          "kafka://k?topic=t&id_from_key=perhaps"}) {
    auto r = kafka::Source::ParseUrl(bad);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_EQ(r.status().message().find("topsecret"), std::string::npos) << r.status();
    if (std::string_view(bad) == "kafka://k") continue;  // a publisher needs no topic (next test)
    EXPECT_EQ(kafka::Publisher::ParseUrl(bad).status().code(), Code::kInvalidArgument) << bad;
  }
  auto no_topic = kafka::Publisher::ParseUrl("kafka://k");
  ASSERT_OK(no_topic);
  EXPECT_EQ(no_topic->topic, "");
}

TEST(KafkaUrl, OpenSourceAndOpenPublisherOnTheMockCluster) {
  MockKafka kafka(kTopic, 2, "by-url");
  ASSERT_TRUE(kafka.ok()) << kafka.error();
  const std::string url = "kafka://" + kafka.brokers() + "?topic=" + kTopic + "&group=by-url&session_timeout_ms=6000";
  auto pub = OpenPublisher(url);
  ASSERT_OK(pub);
  EXPECT_EQ((*pub)->Kind(), "kafka");
  Message m = Msg("m-1", "body");
  m.producer_time_ms = 1'712'345'678'901;
  ASSERT_TRUE((*pub)->Publish(m).ok());
  ASSERT_TRUE((*pub)->Publish(m).ok());
  auto src = OpenSource(url, {.consumer = "by-url-client"});
  ASSERT_OK(src);
  EXPECT_EQ((*src)->Kind(), "kafka");
  std::vector<Delivery> got = ReceiveUntil(**src, 2);
  ASSERT_EQ(got.size(), 2u);
  for (const Delivery& d : got) {
    EXPECT_EQ(d.message.id, "m-1");
    EXPECT_EQ(d.message.payload, "body");
    EXPECT_EQ(d.message.producer_time_ms, m.producer_time_ms);
    // Kafka delivers every record header, the id's and the time's included.
    EXPECT_EQ(d.message.Header("idem-producer-time-ms"), std::optional<std::string_view>("1712345678901"));
    EXPECT_TRUE((*src)->Ack(d).ok());
  }
  // Unreachable: the URL's connect_timeout_ms (default 5000) bounds the wait.
  auto none = OpenSource("kafka://127.0.0.1:1?topic=t&connect_timeout_ms=300");
  EXPECT_EQ(none.status().code(), Code::kUnavailable) << none.status();
}

// A publisher without a topic: Publish says so, a batch names its topic.
// (A cluster of its own: the mock cluster appears to give every idempotent
// producer the same producer id, so a second producer's first records on a
// partition another one wrote to would be taken for duplicates.)
TEST(KafkaUrl, APublisherWithoutATopicPublishesBatchesToTheirTopics) {
  MockKafka kafka(kTopic, 2, "no-topic");
  ASSERT_TRUE(kafka.ok()) << kafka.error();
  auto bare = OpenPublisher("kafka://" + kafka.brokers());
  ASSERT_OK(bare);
  EXPECT_EQ((*bare)->Channel(), "");
  Message m = Msg("m-1", "body");
  EXPECT_EQ((*bare)->Publish(m).code(), Code::kInvalidArgument);
  EXPECT_TRUE((*bare)->traits().ordered_batch) << "idempotent producer";
  const Outgoing to_topic[] = {{kTopic, "k-1", &m}, {kTopic, "k-1", &m}};
  for (const Status& st : (*bare)->PublishBatch(to_topic)) ASSERT_TRUE(st.ok()) << st;
  auto src = OpenSource("kafka://" + kafka.brokers() + "?topic=" + kTopic + "&group=no-topic&session_timeout_ms=6000");
  ASSERT_OK(src);
  std::vector<Delivery> got = ReceiveUntil(**src, 2);
  ASSERT_EQ(got.size(), 2u);
  for (const Delivery& d : got) {
    EXPECT_EQ(d.message.id, "m-1");
    EXPECT_EQ(d.message.Header(kOrderingKeyHeader), std::optional<std::string_view>("k-1"));
    EXPECT_TRUE((*src)->Ack(d).ok());
  }
}

// Records written under the producer time's former header name keep their
// time; the current name wins over a former one.
TEST(KafkaWireFormat, FormerProducerTimeNamesAreRead) {
  MockKafka kafka(kTopic, 1, "wire");
  ASSERT_TRUE(kafka.ok()) << kafka.error();
  auto pub = kafka::Publisher::Open({.brokers = kafka.brokers(), .topic = kTopic});
  ASSERT_OK(pub);
  Message kafka_name = Msg("kafka-name");
  kafka_name.headers = {{"idem-produced-at-ms", "1700000000001"}};
  Message redis_name = Msg("redis-name");
  redis_name.headers = {{"producer_time_ms", "1700000000002"}};
  Message both = Msg("both");
  both.headers = {{"idem-produced-at-ms", "5"}};
  both.producer_time_ms = 1'700'000'000'003;
  for (const Message& m : {kafka_name, redis_name, both}) ASSERT_TRUE((*pub)->Publish(m).ok()) << m.id;
  auto src = kafka::Source::Open({.brokers = kafka.brokers(),
                                  .topic = kTopic,
                                  .group = "wire",
                                  .session_timeout_ms = 6'000,
                                  .heartbeat_interval_ms = 200,
                                  .config = {{"fetch.wait.max.ms", "20"}}});
  ASSERT_OK(src);
  std::vector<Delivery> got = ReceiveUntil(**src, 3);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].message.id, "kafka-name");
  EXPECT_EQ(got[0].message.producer_time_ms, 1'700'000'000'001);
  EXPECT_EQ(got[1].message.producer_time_ms, 1'700'000'000'002);
  EXPECT_EQ(got[2].message.producer_time_ms, 1'700'000'000'003);
  for (const Delivery& d : got) EXPECT_TRUE((*src)->Ack(d).ok());
}

}  // namespace
}  // namespace idem::testing
