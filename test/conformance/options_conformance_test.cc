// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The options rule of doc/adapters.md, over every adapter built: a value out
// of range (a pool_size of 0 or below, a negative timeout or wait, an empty
// name) is refused by T::Open with kInvalidArgument naming the field, before
// anything is connected or created, and never clamped; a URL key out of
// range is refused by T::ParseUrl, naming the key. The servers named below
// do not exist (127.0.0.1:1): an Open that let a bad value through would
// answer kUnavailable instead.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "idem/embedded/queue.h"
#include "idem/sqlite/store.h"
#include "idem/testing/throwaway.h"
#if IDEM_TEST_HAVE_POSTGRES
#include "idem/postgres/store.h"
#endif
#if IDEM_TEST_HAVE_REDIS
#include "idem/redis/claim_store.h"
#include "idem/redis/prefilter.h"
#endif
#if IDEM_TEST_HAVE_REDIS_STREAMS
#include "idem/redis/stream_publisher.h"
#include "idem/redis/stream_source.h"
#endif
#if IDEM_TEST_HAVE_AMQP
#include "idem/amqp/publisher.h"
#include "idem/amqp/source.h"
#endif
#if IDEM_TEST_HAVE_KAFKA
#include "idem/kafka/publisher.h"
#include "idem/kafka/source.h"
#endif
#if IDEM_TEST_HAVE_HTTP
#include "idem/http/client.h"
#endif
#if IDEM_TEST_HAVE_PUBSUB
#include "idem/pubsub/publisher.h"
#include "idem/pubsub/source.h"
#endif
#if IDEM_TEST_HAVE_SQS
#include "idem/sqs/source.h"
#endif
#if IDEM_TEST_HAVE_DYNAMODB
#include "idem/dynamodb/store.h"
#endif

namespace idem {
namespace {

// One bad value: the field it is in, and how it is set on valid options.
template <typename O>
struct Bad {
  std::string field;
  std::function<void(O&)> set;
};

// T::Open(base with each bad value) is kInvalidArgument naming the field.
template <typename T>
void ExpectOpenRefuses(const std::string& adapter, const typename T::Options& base,
                       const std::vector<Bad<typename T::Options>>& cases) {
  for (const auto& c : cases) {
    typename T::Options o = base;
    c.set(o);
    auto r = T::Open(o);
    ASSERT_FALSE(r.ok()) << adapter << ": Open accepted a bad " << c.field;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << adapter << " " << c.field << ": " << r.status();
    EXPECT_NE(r.status().message().find(c.field), std::string::npos)
        << adapter << ": the error does not name " << c.field << ": " << r.status();
  }
}

// T::ParseUrl(base + each query) is kInvalidArgument naming its key.
template <typename T>
void ExpectParseUrlRefuses(const std::string& adapter, const std::string& base,
                           const std::vector<std::pair<std::string, std::string>>& cases) {
  for (const auto& [key, value] : cases) {
    const std::string url = base + (base.find('?') == std::string::npos ? "?" : "&") + key + "=" + value;
    auto r = T::ParseUrl(url);
    ASSERT_FALSE(r.ok()) << adapter << ": ParseUrl accepted " << url;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << url << ": " << r.status();
    EXPECT_NE(r.status().message().find(key), std::string::npos)
        << adapter << ": the error does not name " << key << ": " << r.status();
  }
}

TEST(OptionsConformance, SqliteOpenRefusesOutOfRangeValues) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/s.db";
  using O = sqlite::Store::Options;
  ExpectOpenRefuses<sqlite::Store>("sqlite", O{.path = path},
                                   {{"path", [](O& o) { o.path = ""; }},
                                    {"busy_timeout_ms", [](O& o) { o.busy_timeout_ms = -1; }},
                                    {"cache_kib", [](O& o) { o.cache_kib = -1; }},
                                    {"wal_autocheckpoint_pages", [](O& o) { o.wal_autocheckpoint_pages = -1; }},
                                    {"page_size", [](O& o) { o.page_size = 0; }}});
  EXPECT_FALSE(std::filesystem::exists(path));
  ExpectParseUrlRefuses<sqlite::Store>("sqlite", "sqlite:" + path, {{"busy_timeout_ms", "-1"}});
}

TEST(OptionsConformance, EmbeddedOpenRefusesOutOfRangeValues) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/q.db";
  using O = embedded::Queue::Options;
  ExpectOpenRefuses<embedded::Queue>("embedded", O{.path = path},
                                     {{"path", [](O& o) { o.path = ""; }},
                                      {"queue", [](O& o) { o.queue = ""; }},
                                      {"lease_ms", [](O& o) { o.lease_ms = 0; }},
                                      {"lease_ms", [](O& o) { o.lease_ms = -5; }},
                                      {"busy_timeout_ms", [](O& o) { o.busy_timeout_ms = -1; }},
                                      {"poll_ms", [](O& o) { o.poll_ms = 0; }},
                                      {"poll_ms", [](O& o) { o.poll_ms = -1; }}});
  EXPECT_FALSE(std::filesystem::exists(path));
  ExpectParseUrlRefuses<embedded::Queue>("embedded", "embedded:" + path,
                                         {{"lease_ms", "-1"}, {"poll_ms", "-1"}, {"busy_timeout_ms", "-1"}});
}

#if IDEM_TEST_HAVE_POSTGRES
TEST(OptionsConformance, PostgresOpenRefusesOutOfRangeValues) {
  using O = postgres::Store::Options;
  ExpectOpenRefuses<postgres::Store>("postgres", O{.url = "postgres://u@127.0.0.1:1/db"},
                                     {{"pool_size", [](O& o) { o.pool_size = 0; }},
                                      {"pool_size", [](O& o) { o.pool_size = -3; }},
                                      {"connect_timeout_ms", [](O& o) { o.connect_timeout_ms = -1; }},
                                      {"standby_wait_ms", [](O& o) { o.standby_wait_ms = -1; }},
                                      {"partition_days_ahead", [](O& o) { o.partition_days_ahead = -1; }}});
  ExpectParseUrlRefuses<postgres::Store>("postgres", "postgres://u@127.0.0.1:1/db",
                                         {{"idem_pool_size", "0"}, {"idem_connect_timeout_ms", "-1"}});
}
#endif

#if IDEM_TEST_HAVE_REDIS
TEST(OptionsConformance, RedisClaimStoreAndPrefilterOpenRefuseOutOfRangeValues) {
  const std::string url = "redis://127.0.0.1:1";
  using C = redis::ClaimStore::Options;
  ExpectOpenRefuses<redis::ClaimStore>("redis claim store", C{.url = url},
                                       {{"pool_size", [](C& o) { o.pool_size = 0; }},
                                        {"pool_size", [](C& o) { o.pool_size = -1; }},
                                        {"connect_timeout_ms", [](C& o) { o.connect_timeout_ms = -1; }},
                                        {"command_timeout_ms", [](C& o) { o.command_timeout_ms = -1; }},
                                        {"abandon_margin_ms", [](C& o) { o.abandon_margin_ms = -1; }}});
  ExpectParseUrlRefuses<redis::ClaimStore>("redis claim store", url,
                                           {{"pool_size", "0"}, {"connect_timeout_ms", "-1"}});
  using P = redis::Prefilter::Options;
  ExpectOpenRefuses<redis::Prefilter>("redis prefilter", P{.url = url},
                                      {{"pool_size", [](P& o) { o.pool_size = 0; }},
                                       {"connect_timeout_ms", [](P& o) { o.connect_timeout_ms = -1; }},
                                       {"command_timeout_ms", [](P& o) { o.command_timeout_ms = 0; }},
                                       {"ttl_ms", [](P& o) { o.ttl_ms = 0; }},
                                       {"retry_after_ms", [](P& o) { o.retry_after_ms = -1; }}});
  ExpectParseUrlRefuses<redis::Prefilter>("redis prefilter", url, {{"pool_size", "0"}, {"ttl_ms", "-1"}});
}
#endif

#if IDEM_TEST_HAVE_REDIS_STREAMS
TEST(OptionsConformance, RedisStreamsOpenRefusesOutOfRangeValues) {
  const std::string url = "redis://127.0.0.1:1";
  using S = redis::StreamSource::Options;
  ExpectOpenRefuses<redis::StreamSource>("redis stream source", S{.url = url, .stream = "s", .group = "g"},
                                         {{"stream", [](S& o) { o.stream = ""; }},
                                          {"group", [](S& o) { o.group = ""; }},
                                          {"lease_ms", [](S& o) { o.lease_ms = -1; }},
                                          {"poll_ms", [](S& o) { o.poll_ms = 0; }},
                                          {"poll_ms", [](S& o) { o.poll_ms = -10; }},
                                          {"pool_size", [](S& o) { o.pool_size = 0; }},
                                          {"pool_size", [](S& o) { o.pool_size = -1; }},
                                          {"connect_timeout_ms", [](S& o) { o.connect_timeout_ms = -1; }}});
  ExpectParseUrlRefuses<redis::StreamSource>("redis stream source", url + "?stream=s",
                                             {{"pool_size", "0"}, {"poll_ms", "-1"}, {"lease_ms", "-1"}});
  using P = redis::StreamPublisher::Options;
  ExpectOpenRefuses<redis::StreamPublisher>("redis stream publisher", P{.url = url, .stream = "s"},
                                            {{"pool_size", [](P& o) { o.pool_size = 0; }},
                                             {"pool_size", [](P& o) { o.pool_size = -1; }},
                                             {"connect_timeout_ms", [](P& o) { o.connect_timeout_ms = -1; }}});
}
#endif

#if IDEM_TEST_HAVE_AMQP
TEST(OptionsConformance, AmqpOpenRefusesOutOfRangeValues) {
  const std::string url = "amqp://u:p@127.0.0.1:1/%2f";
  using S = amqp::Source::Options;
  ExpectOpenRefuses<amqp::Source>("amqp source", S{.url = url, .queue = "q"},
                                  {{"queue", [](S& o) { o.queue = ""; }},
                                   {"queue", [](S& o) { o.queue = std::string(256, 'q'); }},
                                   {"queue_type", [](S& o) { o.queue_type = "stream-ish"; }},
                                   {"prefetch", [](S& o) { o.prefetch = 0; }},
                                   {"lease_ms", [](S& o) { o.lease_ms = -1; }},
                                   {"heartbeat_ms", [](S& o) { o.heartbeat_ms = -1; }},
                                   {"connect_timeout_ms", [](S& o) { o.connect_timeout_ms = 0; }},
                                   {"connect_timeout_ms", [](S& o) { o.connect_timeout_ms = -1; }},
                                   {"max_nack_delay_ms", [](S& o) { o.max_nack_delay_ms = -1; }}});
  ExpectParseUrlRefuses<amqp::Source>("amqp source", url + "?queue=q",
                                      {{"prefetch", "0"}, {"connect_timeout_ms", "0"}, {"lease_ms", "-1"}});
  using P = amqp::Publisher::Options;
  ExpectOpenRefuses<amqp::Publisher>("amqp publisher", P{.url = url, .queue = "q"},
                                     {{"queue", [](P& o) { o.queue = std::string(256, 'q'); }},
                                      {"queue_type", [](P& o) { o.queue_type = "x"; }},
                                      {"connect_timeout_ms", [](P& o) { o.connect_timeout_ms = 0; }},
                                      {"connect_timeout_ms", [](P& o) { o.connect_timeout_ms = -1; }}});
}
#endif

#if IDEM_TEST_HAVE_KAFKA
TEST(OptionsConformance, KafkaOpenRefusesOutOfRangeValues) {
  using S = kafka::Source::Options;
  ExpectOpenRefuses<kafka::Source>("kafka source", S{.brokers = "127.0.0.1:1", .topic = "t", .group = "g"},
                                   {{"brokers", [](S& o) { o.brokers = ""; }},
                                    {"topic", [](S& o) { o.topic = ""; }},
                                    {"group", [](S& o) { o.group = ""; }},
                                    {"id_header", [](S& o) { o.id_header = ""; }},
                                    {"session_timeout_ms", [](S& o) { o.session_timeout_ms = 0; }},
                                    {"heartbeat_interval_ms", [](S& o) { o.heartbeat_interval_ms = -1; }},
                                    {"max_poll_interval_ms", [](S& o) { o.max_poll_interval_ms = 0; }},
                                    {"revoke_wait_ms", [](S& o) { o.revoke_wait_ms = -1; }},
                                    {"connect_timeout_ms", [](S& o) { o.connect_timeout_ms = -1; }}});
  ExpectParseUrlRefuses<kafka::Source>("kafka source", "kafka://127.0.0.1:1?topic=t",
                                       {{"session_timeout_ms", "0"}, {"revoke_wait_ms", "-1"}});
  using P = kafka::Publisher::Options;
  ExpectOpenRefuses<kafka::Publisher>("kafka publisher", P{.brokers = "127.0.0.1:1", .topic = "t"},
                                      {{"brokers", [](P& o) { o.brokers = ""; }},
                                       {"id_header", [](P& o) { o.id_header = ""; }},
                                       {"connect_timeout_ms", [](P& o) { o.connect_timeout_ms = -1; }},
                                       {"publish_timeout_ms", [](P& o) { o.publish_timeout_ms = 0; }}});
}
#endif

#if IDEM_TEST_HAVE_PUBSUB
TEST(OptionsConformance, PubsubOpenRefusesOutOfRangeValues) {
  // Every field is checked before the first call (nothing listens on port 1).
  const pubsub::Connection c{.project = "p", .endpoint = "http://127.0.0.1:1"};
  using S = pubsub::Source::Options;
  ExpectOpenRefuses<pubsub::Source>("pubsub source", S{.connection = c, .subscription = "subs"},
                                    {{"project", [](S& o) { o.connection.project = ""; }},
                                     {"subscription", [](S& o) { o.subscription = ""; }},
                                     {"id_attribute", [](S& o) { o.id_attribute = ""; }},
                                     {"poll_ms", [](S& o) { o.poll_ms = 0; }},
                                     {"lease_ms", [](S& o) { o.lease_ms = 5'000; }},
                                     {"max_delivery_attempts", [](S& o) { o.max_delivery_attempts = 101; }},
                                     {"connect_timeout_ms", [](S& o) { o.connection.connect_timeout_ms = 0; }},
                                     {"read_timeout_ms", [](S& o) { o.connection.read_timeout_ms = 0; }},
                                     {"max_attempts", [](S& o) { o.connection.max_attempts = 0; }},
                                     {"pool_size", [](S& o) { o.connection.pool_size = 0; }}});
  ExpectParseUrlRefuses<pubsub::Source>("pubsub source", "pubsub://p/subs",
                                        {{"lease_ms", "5000"}, {"poll_ms", "0"}, {"max_attempts", "0"}});
  using P = pubsub::Publisher::Options;
  ExpectOpenRefuses<pubsub::Publisher>("pubsub publisher", P{.connection = c, .topic = "topic"},
                                       {{"id_attribute", [](P& o) { o.id_attribute = ""; }},
                                        {"max_batch", [](P& o) { o.max_batch = 0; }},
                                        {"pool_size", [](P& o) { o.connection.pool_size = 0; }}});
  ExpectParseUrlRefuses<pubsub::Publisher>("pubsub publisher", "pubsub://p?topic=topic", {{"max_batch", "1001"}});
}
#endif

#if IDEM_TEST_HAVE_SQS
TEST(OptionsConformance, SqsOpenRefusesOutOfRangeValues) {
  // Checked before any call: the endpoint is never reached.
  sqs::ConnectOptions c{
      .region = "us-east-1", .endpoint = "http://127.0.0.1:1", .access_key_id = "AKID", .secret_access_key = "secret"};
  using S = sqs::Source::Options;
  ExpectOpenRefuses<sqs::Source>("sqs source", S{.queue = "q", .connect = c},
                                 {{"queue", [](S& o) { o.queue = ""; }},
                                  {"id_attribute", [](S& o) { o.id_attribute = ""; }},
                                  {"lease_ms", [](S& o) { o.lease_ms = 999; }},
                                  {"lease_ms", [](S& o) { o.lease_ms = 1'500; }},
                                  {"connect_timeout_ms", [](S& o) { o.connect.connect_timeout_ms = 0; }},
                                  {"read_timeout_ms", [](S& o) { o.connect.read_timeout_ms = -1; }},
                                  {"max_attempts", [](S& o) { o.connect.max_attempts = 0; }},
                                  {"pool_size", [](S& o) { o.connect.pool_size = 0; }}});
  ExpectParseUrlRefuses<sqs::Source>("sqs source", "sqs://q",
                                     {{"lease_ms", "0"}, {"max_attempts", "0"}, {"pool_size", "0"}});
  using P = sqs::Publisher::Options;
  ExpectOpenRefuses<sqs::Publisher>("sqs publisher", P{.queue = "q", .connect = c},
                                    {{"id_attribute", [](P& o) { o.id_attribute = ""; }},
                                     {"max_attempts", [](P& o) { o.connect.max_attempts = 0; }}});
}
#endif

#if IDEM_TEST_HAVE_HTTP
TEST(OptionsConformance, HttpClientOpenRefusesOutOfRangeValues) {
  using O = http::Client::Options;
  ExpectOpenRefuses<http::Client>("http client", O{.base_url = "http://127.0.0.1:1"},
                                  {{"max_attempts", [](O& o) { o.max_attempts = 0; }},
                                   {"backoff_base_ms", [](O& o) { o.backoff_base_ms = -1; }},
                                   {"backoff_max_ms", [](O& o) { o.backoff_max_ms = -1; }},
                                   {"connect_timeout_ms", [](O& o) { o.connect_timeout_ms = -1; }},
                                   {"read_timeout_ms", [](O& o) { o.read_timeout_ms = -1; }},
                                   {"pool_size", [](O& o) { o.pool_size = -1; }}});
}
#endif

#if IDEM_TEST_HAVE_DYNAMODB
TEST(OptionsConformance, DynamodbOpenRefusesOutOfRangeValues) {
  using O = dynamodb::Store::Options;
  ExpectOpenRefuses<dynamodb::Store>("dynamodb",
                                     O{.table = "idem-t", .region = "us-east-1", .endpoint = "http://127.0.0.1:1"},
                                     {{"table", [](O& o) { o.table = ""; }},
                                      {"marker_ttl_s", [](O& o) { o.marker_ttl_s = -1; }},
                                      {"max_attempts", [](O& o) { o.max_attempts = 0; }},
                                      {"pool_size", [](O& o) { o.pool_size = 0; }}});
  ExpectParseUrlRefuses<dynamodb::Store>("dynamodb", "dynamodb://idem-t", {{"max_attempts", "0"}, {"pool_size", "0"}});
}
#endif

}  // namespace
}  // namespace idem
