// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "sources.h"

#include <unistd.h>

#include <map>
#include <mutex>

#include "idem/publisher.h"
#include "idem/url.h"
#if IDEM_HAVE_REDIS_STREAMS
#include "idem/redis/stream_source.h"
#endif
#if IDEM_HAVE_KAFKA
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "idem/kafka/source.h"
#endif

namespace idem::cli {
namespace {

// The source and its publisher as the command uses them.
Result<OpenedSource> Wrap(std::unique_ptr<Source> source, std::unique_ptr<Publisher> publisher, std::string url) {
  OpenedSource out;
  std::shared_ptr<Publisher> pub(std::move(publisher));
  out.publish = [pub](const Message& m) { return pub->Publish(m); };
  // The publisher must go after the source only where it is the source
  // itself (embedded); otherwise any order. `owner` keeps it alive.
  out.owner = pub;
  out.kind = source->Kind() == "amqp" ? "rabbitmq" : std::string(source->Kind());
#if IDEM_HAVE_REDIS_STREAMS
  if (auto* s = dynamic_cast<redis::StreamSource*>(source.get())) out.close = [s] { return s->Close(); };
#endif
  out.source = std::move(source);
  out.shared_url = std::move(url);
  return out;
}

#if IDEM_HAVE_KAFKA
// kafka-mock:?topic=T&partitions=N&...: librdkafka's mock cluster inside
// this process (the Kafka path without a broker: Debian has none), then the
// kafka:// source and publisher on its bootstrap address.
Result<OpenedSource> OpenKafkaMock(const std::string& url, const SourceSettings& settings) {
  IDEM_ASSIGN_OR_RETURN(ParsedUrl u, ParseUrl(url, "kafka-mock URL", UrlForm::kFile));
  IDEM_RETURN_IF_ERROR(u.CheckKeys({"topic", "group", "partitions", "session_timeout_ms", "connect_timeout_ms"}));
  if (!u.path.empty()) return Status::InvalidArgument("a kafka-mock: URL has no path: '" + url + "'");
  const std::string topic = u.Get("topic", "payments");
  if (topic.empty()) return Status::InvalidArgument("a kafka-mock: URL needs ?topic=NAME");
  IDEM_ASSIGN_OR_RETURN(const int64_t partitions, u.GetInt("partitions", 4, 1, 1'000));
  struct Mock {
    rd_kafka_t* host = nullptr;
    rd_kafka_mock_cluster_t* cluster = nullptr;
    ~Mock() {
      if (cluster != nullptr) rd_kafka_mock_cluster_destroy(cluster);
      if (host != nullptr) rd_kafka_destroy(host);
    }
  };
  // One cluster per URL in this process, while someone holds it: a second
  // source on the same URL (another group member, a consumer taking over)
  // joins the same cluster.
  static std::mutex registry_mu;
  static std::map<std::string, std::weak_ptr<Mock>> registry;
  std::shared_ptr<Mock> m;
  {
    std::lock_guard lock(registry_mu);
    m = registry[url].lock();
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
  }
  // The same source as kafka:// on the cluster's address, the mock's keys
  // (but partitions) passed on.
  std::string shared = "kafka://" + std::string(rd_kafka_mock_cluster_bootstraps(m->cluster)) + "?topic=" + topic;
  for (const auto& [k, v] : u.query)
    if (k != "topic" && k != "partitions") {
      shared += '&';
      shared += k;
      shared += '=';
      shared += v;
    }
  IDEM_ASSIGN_OR_RETURN(kafka::Source::Options so, kafka::Source::ParseUrl(shared));
  so.client_id = settings.consumer.empty() ? so.client_id : settings.consumer;
  so.config = {{"fetch.wait.max.ms", "20"}, {"topic.metadata.refresh.interval.ms", "500"}};
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<kafka::Source> src, kafka::Source::Open(so));
  IDEM_ASSIGN_OR_RETURN(kafka::Publisher::Options po, kafka::Publisher::ParseUrl(shared));
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<kafka::Publisher> pub, kafka::Publisher::Open(po));
  IDEM_ASSIGN_OR_RETURN(OpenedSource out, Wrap(std::move(src), std::move(pub), shared));
  // The publisher must go before the mock cluster it talks to.
  out.owner = std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>>(m, out.owner);
  out.kind = "kafka-mock";
  return out;
}
#endif

}  // namespace

Result<std::unique_ptr<Publisher>> OpenPublisherFlag(const std::string& flag, const std::string& url) {
  auto publisher = ::idem::OpenPublisher(url);
  if (!publisher.ok() && publisher.status().code() == Code::kInvalidArgument)
    return Status::InvalidArgument("--" + flag + " " + RedactUrl(url) + ": " + publisher.status().message());
  return publisher;
}

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
#if IDEM_HAVE_PUBSUB
  s += ", pubsub://PROJECT/SUBSCRIPTION?topic=T[&endpoint=http://HOST:PORT][&create=true]";
#endif
#if IDEM_HAVE_SQS
  s += ", sqs://QUEUE?region=R[&endpoint=URL][&profile=P] (credentials from the environment or ~/.aws)";
#endif
  return s + " (doc/sources.md lists every key)";
}

Result<OpenedSource> OpenSource(const std::string& url, const SourceSettings& settings) {
  SourceSettings s = settings;
  if (!s.consumer.empty()) {
    s.consumer += '-';
    s.consumer += std::to_string(::getpid());
  }
#if IDEM_HAVE_KAFKA
  if (UrlScheme(url) == "kafka-mock") return OpenKafkaMock(url, s);
#endif
  auto source = ::idem::OpenSource(url, s);
  if (!source.ok()) {
    if (source.status().message().starts_with("unknown source")) {
      std::string m = "unknown source '";
      m += RedactUrl(url);
      m += "' (known: ";
      m += KnownSources();
      return Status::InvalidArgument(m + ")");
    }
    return source.status();
  }
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<Publisher> publisher, ::idem::OpenPublisher(url));
  return Wrap(std::move(*source), std::move(publisher), url);
}

}  // namespace idem::cli
