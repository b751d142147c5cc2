// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "sources.h"

#include <unistd.h>

#include <charconv>
#include <map>
#include <mutex>
#include <system_error>

#include "components.h"
#include "idem/embedded/queue.h"
#if IDEM_HAVE_REDIS_STREAMS
#include "idem/redis/stream_source.h"
#endif
#if IDEM_HAVE_AMQP
#include "idem/amqp/source.h"
#endif
#if IDEM_HAVE_KAFKA
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "idem/kafka/source.h"
#endif

namespace idem::cli {
namespace {

// Splits "base?k=v&k2=v2" into base and its query parameters.
std::pair<std::string, std::map<std::string, std::string>> SplitQuery(const std::string& url) {
  std::map<std::string, std::string> q;
  auto at = url.find('?');
  if (at == std::string::npos) return {url, q};
  std::string rest = url.substr(at + 1);
  size_t pos = 0;
  while (pos <= rest.size()) {
    size_t amp = rest.find('&', pos);
    std::string kv = rest.substr(pos, amp == std::string::npos ? std::string::npos : amp - pos);
    auto eq = kv.find('=');
    if (!kv.empty()) q[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
    if (amp == std::string::npos) break;
    pos = amp + 1;
  }
  return {url.substr(0, at), q};
}

// Takes the known keys out of `q`; anything left is an error naming it.
Status NoOthers(const std::map<std::string, std::string>& q, const std::string& scheme, const std::string& known) {
  if (q.empty()) return Status::OK();
  return Status::InvalidArgument("unknown parameter '" + q.begin()->first + "' in the " + scheme + " URL (known: " +
                                 known + ")");
}

std::string Take(std::map<std::string, std::string>& q, const std::string& key, const std::string& def = "") {
  auto it = q.find(key);
  if (it == q.end()) return def;
  std::string v = it->second;
  q.erase(it);
  return v;
}

// The integer parameter `key` of a `scheme` URL, taken out of `q`: `def`
// when absent; otherwise decimal digits only (no sign, spaces, units or
// fraction) within [min, max], else kInvalidArgument naming the parameter
// and the bounds.
Result<int64_t> TakeInt(std::map<std::string, std::string>& q, const std::string& scheme, const std::string& key,
                        int64_t def, int64_t min, int64_t max) {
  auto it = q.find(key);
  if (it == q.end()) return def;
  const std::string v = it->second;
  q.erase(it);
  int64_t n = 0;
  const char* end = v.data() + v.size();
  auto [p, ec] = std::from_chars(v.data(), end, n);
  const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
  if (!digits || ec != std::errc() || p != end || n < min || n > max)
    return Status::InvalidArgument(scheme + ": " + key + " must be an integer from " + std::to_string(min) + " to " +
                                   std::to_string(max) + ", got '" + v.substr(0, 40) + "'");
  return n;
}

}  // namespace

std::string KnownSources() {
  std::string s = "embedded:PATH?queue=NAME";
#if IDEM_HAVE_REDIS_STREAMS
  s += ", redis://HOST:PORT[/DB]?stream=S&group=G";
#endif
#if IDEM_HAVE_AMQP
  s += ", amqp://USER:PASS@HOST:PORT/VHOST?queue=Q";
#endif
#if IDEM_HAVE_KAFKA
  s += ", kafka://HOST:PORT[,...]?topic=T&group=G[&session_timeout_ms=MS][&connect_timeout_ms=MS (default 5000)],"
       " kafka-mock:?topic=T&partitions=N (1..1000)";
#endif
  return s;
}

Result<OpenedSource> OpenSource(const std::string& url, const SourceSettings& settings) {
  if (url.rfind("embedded:", 0) == 0) {
    IDEM_ASSIGN_OR_RETURN(embedded::QueueOptions o, embedded::Queue::ParseUrl(url));
    if (url.find("lease_ms=") == std::string::npos) o.lease_ms = settings.lease_ms;
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<embedded::Queue> q, embedded::Queue::Open(o));
    OpenedSource out;
    embedded::Queue* raw = q.get();
    out.publish = [raw](const Message& m) { return raw->Publish(m); };
    out.source = std::move(q);
    out.kind = "embedded";
    out.shared_url = url;
    return out;
  }
#if IDEM_HAVE_REDIS_STREAMS
  if (url.rfind("redis://", 0) == 0) {
    auto [base, q] = SplitQuery(url);
    redis::StreamSourceOptions o;
    o.url = base;
    o.stream = Take(q, "stream");
    o.group = Take(q, "group", "idem");
    o.id_field = Take(q, "id_field", "id");
    o.payload_field = Take(q, "payload_field", "payload");
    o.consumer = Take(q, "consumer", settings.consumer.empty() ? "" : settings.consumer + "-" + std::to_string(::getpid()));
    o.lease_ms = settings.lease_ms;
    IDEM_RETURN_IF_ERROR(NoOthers(q, "redis", "stream, group, consumer, id_field, payload_field"));
    if (o.stream.empty()) return Status::InvalidArgument("a redis:// source needs ?stream=NAME");
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<redis::StreamSource> src, redis::StreamSource::Open(o));
    OpenedSource out;
    redis::StreamSource* raw = src.get();
    out.publish = [raw](const Message& m) { return raw->Publish(m).status(); };
    out.close = [raw] { return raw->Close(); };
    out.source = std::move(src);
    out.kind = "redis-streams";
    out.shared_url = url;
    return out;
  }
#endif
#if IDEM_HAVE_AMQP
  if (url.rfind("amqp://", 0) == 0) {
    auto [base, q] = SplitQuery(url);
    amqp::SourceOptions o;
    o.url = base;
    o.queue = Take(q, "queue");
    o.id_header = Take(q, "id_header");
    IDEM_ASSIGN_OR_RETURN(int64_t prefetch, TakeInt(q, "amqp", "prefetch", 100, 1, 65'535));
    o.prefetch = static_cast<int>(prefetch);
    o.lease_ms = settings.lease_ms;
    IDEM_RETURN_IF_ERROR(NoOthers(q, "amqp", "queue, id_header, prefetch"));
    if (o.queue.empty()) return Status::InvalidArgument("an amqp:// source needs ?queue=NAME");
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<amqp::Source> src, amqp::Source::Open(o));
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<amqp::Publisher> pub,
                          amqp::Publisher::Open({.url = base, .declare_queue = o.queue}));
    std::shared_ptr<amqp::Publisher> publisher(std::move(pub));
    const std::string queue = o.queue;
    OpenedSource out;
    out.publish = [publisher, queue](const Message& m) { return publisher->Publish(queue, m); };
    out.source = std::move(src);
    out.kind = "rabbitmq";
    out.shared_url = url;
    return out;
  }
#endif
#if IDEM_HAVE_KAFKA
  if (url.rfind("kafka://", 0) == 0 || url.rfind("kafka-mock:", 0) == 0) {
    auto [base, q] = SplitQuery(url);
    const bool mock = url.rfind("kafka-mock:", 0) == 0;
    OpenedSource out;
    std::string brokers = mock ? "" : base.substr(std::string("kafka://").size());
    const std::string topic = Take(q, "topic", mock ? "payments" : "");
    const std::string group = Take(q, "group", "idem");
    // The mock cluster's topic (kafka:// has no such parameter: NoOthers
    // below names it).
    int64_t partitions = 4;
    if (mock) {
      IDEM_ASSIGN_OR_RETURN(partitions, TakeInt(q, "kafka-mock", "partitions", 4, 1, 1'000));
    }
    // How soon a member that died (kill -9) loses its partitions.
    IDEM_ASSIGN_OR_RETURN(const int64_t session, TakeInt(q, "kafka", "session_timeout_ms", 10'000, 100, 3'600'000));
    // How long opening waits for a broker to answer before it gives up
    // (librdkafka alone would retry an unreachable cluster forever).
    IDEM_ASSIGN_OR_RETURN(const int64_t connect, TakeInt(q, "kafka", "connect_timeout_ms", 5'000, 100, 600'000));
    IDEM_RETURN_IF_ERROR(NoOthers(q, "kafka",
                                  mock ? "topic, group, partitions, session_timeout_ms, connect_timeout_ms"
                                       : "topic, group, session_timeout_ms, connect_timeout_ms"));
    if (topic.empty()) return Status::InvalidArgument("a kafka:// source needs ?topic=NAME");
    if (mock) {
      // librdkafka's mock cluster, inside this process: the Kafka path
      // without a broker (Debian has none). It lives as long as the source.
      struct Mock {
        rd_kafka_t* host = nullptr;
        rd_kafka_mock_cluster_t* cluster = nullptr;
        ~Mock() {
          if (cluster != nullptr) rd_kafka_mock_cluster_destroy(cluster);
          if (host != nullptr) rd_kafka_destroy(host);
        }
      };
      // One cluster per URL in this process, while someone holds it: a
      // second source on the same URL (another group member, a consumer
      // taking over) joins the same cluster.
      static std::mutex registry_mu;
      static std::map<std::string, std::weak_ptr<Mock>> registry;
      std::lock_guard lock(registry_mu);
      std::shared_ptr<Mock> m = registry[url].lock();
      if (m == nullptr) {
        m = std::make_shared<Mock>();
        char err[256];
        rd_kafka_conf_t* conf = rd_kafka_conf_new();
        // A client that only hosts the cluster: its "no bootstrap.servers"
        // warning is noise.
        rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
        m->host = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
        if (m->host == nullptr) return Status::Internal(std::string("kafka-mock: ") + err);
        m->cluster = rd_kafka_mock_cluster_new(m->host, 3);
        if (m->cluster == nullptr) return Status::Internal("kafka-mock: could not start the mock cluster");
        if (rd_kafka_mock_topic_create(m->cluster, topic.c_str(), static_cast<int>(partitions), 1) !=
            RD_KAFKA_RESP_ERR_NO_ERROR)
          return Status::Internal("kafka-mock: could not create topic " + topic);
        registry[url] = m;
      }
      brokers = rd_kafka_mock_cluster_bootstraps(m->cluster);
      out.owner = m;
    }
    kafka::Options o{.brokers = brokers, .topic = topic, .group = group};
    o.session_timeout_ms = static_cast<int>(session);
    o.heartbeat_interval_ms = std::max(50, std::min(o.heartbeat_interval_ms, o.session_timeout_ms / 4));
    o.connect_timeout_ms = connect;
    if (mock) o.config = {{"fetch.wait.max.ms", "20"}, {"topic.metadata.refresh.interval.ms", "500"}};
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<kafka::Source> src, kafka::Source::Open(o));
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<kafka::Producer> prod,
                          kafka::Producer::Open({.brokers = brokers, .topic = topic, .connect_timeout_ms = connect}));
    std::shared_ptr<kafka::Producer> producer(std::move(prod));
    out.publish = [producer](const Message& m) {
      IDEM_RETURN_IF_ERROR(producer->Produce(m));
      return producer->Flush();
    };
    // The producer must go before a mock cluster it talks to.
    out.owner = std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<kafka::Producer>>>(out.owner, producer);
    out.source = std::move(src);
    out.kind = mock ? "kafka-mock" : "kafka";
    out.shared_url = mock ? "kafka://" + brokers + "?topic=" + topic + "&group=" + group +
                                "&session_timeout_ms=" + std::to_string(session) +
                                "&connect_timeout_ms=" + std::to_string(connect)
                          : url;
    return out;
  }
#endif
  // A scheme whose component this idem was built without.
  const std::string scheme = UrlScheme(url);
  if (scheme == "redis") return NotBuilt("the Redis Streams source", "IDEM_WITH_REDIS");
  if (scheme == "amqp" || scheme == "amqps") return NotBuilt("the RabbitMQ source", "IDEM_WITH_AMQP");
  if (scheme == "kafka" || scheme == "kafka-mock") return NotBuilt("the Kafka source", "IDEM_WITH_KAFKA");
  auto colon = url.find(':');
  return Status::InvalidArgument("unknown source '" + (colon == std::string::npos ? url : url.substr(0, colon + 1)) +
                                 "...' (known: " + KnownSources() + ")");
}

}  // namespace idem::cli
