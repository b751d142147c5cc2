// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// OpenSource / OpenPublisher: the source schemes compiled in
// (IDEM_OPEN_HAVE_<COMPONENT>), each by its adapter's ParseUrl and Open.
#include <cctype>

#include "idem/open.h"
#include "idem/url.h"
#if IDEM_OPEN_HAVE_EMBEDDED
#include "idem/embedded/queue.h"
#endif
#if IDEM_OPEN_HAVE_REDIS_STREAMS
#include "idem/redis/stream_publisher.h"
#include "idem/redis/stream_source.h"
#endif
#if IDEM_OPEN_HAVE_AMQP
#include "idem/amqp/publisher.h"
#include "idem/amqp/source.h"
#endif
#if IDEM_OPEN_HAVE_KAFKA
#include "idem/kafka/source.h"
#endif

namespace idem {
namespace {

// kInvalidArgument naming the scheme, or the component that was not built.
Status UnknownScheme(std::string_view url) {
  std::string known;
  for (const std::string& s : SourceSchemes()) known += (known.empty() ? "" : ", ") + s + ":";
  const std::string scheme = UrlScheme(url);
  const std::string component = scheme == "embedded" ? "embedded"
                                : scheme == "redis"  ? "redis_streams"
                                : scheme == "amqp"   ? "amqp"
                                : scheme == "kafka"  ? "kafka"
                                                     : "";
  if (!component.empty()) {
    std::string option = component == "redis_streams" ? "REDIS" : component;
    for (char& c : option) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    std::string m = "'";
    m += RedactUrl(url);
    m += "': this installation was built without idem::";
    m += component;
    m += " (configure idem with -DIDEM_WITH_" + option + "=ON; known sources: " + known + ")";
    return Status::InvalidArgument(m);
  }
  std::string m = "unknown source '";
  m += RedactUrl(url);
  m += "' (known: " + known + ")";
  if (scheme == "sqlite" || scheme == "postgres" || scheme == "postgresql")
    m += ": " + scheme + ": names a store (idem::OpenStore), not a source";
  return Status::InvalidArgument(m);
}

// Whether the URL's query sets `key` (then it wins over SourceSettings).
bool UrlSets(std::string_view url, std::string_view key) {
  auto u = ParseUrl(url, "URL", UrlForm::kFile);
  return u.ok() && u->Has(key);
}

}  // namespace

std::vector<std::string> SourceSchemes() {
  std::vector<std::string> out;
#if IDEM_OPEN_HAVE_EMBEDDED
  out.push_back("embedded");
#endif
#if IDEM_OPEN_HAVE_REDIS_STREAMS
  out.push_back("redis");
#endif
#if IDEM_OPEN_HAVE_AMQP
  out.push_back("amqp");
#endif
#if IDEM_OPEN_HAVE_KAFKA
  out.push_back("kafka");
#endif
  return out;
}

Result<std::unique_ptr<Source>> OpenSource(std::string_view url, const SourceSettings& settings) {
  const std::string scheme = UrlScheme(url);
  const bool lease_in_url = UrlSets(url, "lease_ms");
#if IDEM_OPEN_HAVE_EMBEDDED
  if (scheme == "embedded") {
    IDEM_ASSIGN_OR_RETURN(embedded::Queue::Options o, embedded::Queue::ParseUrl(url));
    if (!lease_in_url) o.lease_ms = settings.lease_ms;
    if (settings.env != nullptr) o.env = settings.env;
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<embedded::Queue> q, embedded::Queue::Open(o));
    return std::unique_ptr<Source>(std::move(q));
  }
#endif
#if IDEM_OPEN_HAVE_REDIS_STREAMS
  if (scheme == "redis") {
    IDEM_ASSIGN_OR_RETURN(redis::StreamSource::Options o, redis::StreamSource::ParseUrl(url));
    if (!lease_in_url) o.lease_ms = settings.lease_ms;
    if (o.consumer.empty()) o.consumer = settings.consumer;
    if (settings.env != nullptr) o.env = settings.env;
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<redis::StreamSource> s, redis::StreamSource::Open(o));
    return std::unique_ptr<Source>(std::move(s));
  }
#endif
#if IDEM_OPEN_HAVE_AMQP
  if (scheme == "amqp") {
    IDEM_ASSIGN_OR_RETURN(amqp::Source::Options o, amqp::Source::ParseUrl(url));
    if (!lease_in_url) o.lease_ms = settings.lease_ms;
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<amqp::Source> s, amqp::Source::Open(o));
    return std::unique_ptr<Source>(std::move(s));
  }
#endif
#if IDEM_OPEN_HAVE_KAFKA
  if (scheme == "kafka") {
    IDEM_ASSIGN_OR_RETURN(kafka::Source::Options o, kafka::Source::ParseUrl(url));
    if (!UrlSets(url, "client_id") && !settings.consumer.empty()) o.client_id = settings.consumer;
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<kafka::Source> s, kafka::Source::Open(o));
    return std::unique_ptr<Source>(std::move(s));
  }
#endif
  return UnknownScheme(url);
}

Result<std::unique_ptr<Publisher>> OpenPublisher(std::string_view url) {
  const std::string scheme = UrlScheme(url);
#if IDEM_OPEN_HAVE_EMBEDDED
  if (scheme == "embedded") {
    IDEM_ASSIGN_OR_RETURN(embedded::Queue::Options o, embedded::Queue::ParseUrl(url));
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<embedded::Queue> q, embedded::Queue::Open(o));
    return std::unique_ptr<Publisher>(std::move(q));
  }
#endif
#if IDEM_OPEN_HAVE_REDIS_STREAMS
  if (scheme == "redis") {
    IDEM_ASSIGN_OR_RETURN(redis::StreamPublisher::Options o, redis::StreamPublisher::ParseUrl(url));
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<redis::StreamPublisher> p, redis::StreamPublisher::Open(o));
    return std::unique_ptr<Publisher>(std::move(p));
  }
#endif
#if IDEM_OPEN_HAVE_AMQP
  if (scheme == "amqp") {
    IDEM_ASSIGN_OR_RETURN(amqp::Publisher::Options o, amqp::Publisher::ParseUrl(url));
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<amqp::Publisher> p, amqp::Publisher::Open(o));
    return std::unique_ptr<Publisher>(std::move(p));
  }
#endif
#if IDEM_OPEN_HAVE_KAFKA
  if (scheme == "kafka") {
    IDEM_ASSIGN_OR_RETURN(kafka::Publisher::Options o, kafka::Publisher::ParseUrl(url));
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<kafka::Publisher> p, kafka::Publisher::Open(o));
    return std::unique_ptr<Publisher>(std::move(p));
  }
#endif
  return UnknownScheme(url);
}

}  // namespace idem
