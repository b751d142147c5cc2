// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// OpenSource / OpenPublisher: the embedded queue, always; the other source
// schemes through their openers (src/open/openers.h), when this program
// links them (IDEM_OPEN_HAVE_<COMPONENT>: built into idem::open).
#include <cctype>

#include "idem/open.h"
#include "idem/url.h"
#include "open/openers.h"
#if IDEM_OPEN_HAVE_EMBEDDED
#include "idem/embedded/queue.h"
#endif

#ifndef IDEM_OPEN_HAVE_REDIS_STREAMS
#define IDEM_OPEN_HAVE_REDIS_STREAMS 0
#endif
#ifndef IDEM_OPEN_HAVE_AMQP
#define IDEM_OPEN_HAVE_AMQP 0
#endif
#ifndef IDEM_OPEN_HAVE_KAFKA
#define IDEM_OPEN_HAVE_KAFKA 0
#endif
#ifndef IDEM_OPEN_HAVE_PUBSUB
#define IDEM_OPEN_HAVE_PUBSUB 0
#endif
#ifndef IDEM_OPEN_HAVE_SQS
#define IDEM_OPEN_HAVE_SQS 0
#endif

namespace idem {
namespace open_internal {

bool UrlSets(std::string_view url, std::string_view key) {
  auto u = ParseUrl(url, "URL", UrlForm::kFile);
  return u.ok() && u->Has(key);
}

Status NotLinked(std::string_view component, std::string_view url) {
  std::string m = "'";
  m += RedactUrl(url);
  m += "': this program does not link idem::";
  m += component;
  m += " (find_package(idem COMPONENTS open ";
  m += component;
  m += ") and link idem::";
  m += component;
  m += ")";
  return Status::InvalidArgument(m);
}

}  // namespace open_internal

namespace {

using open_internal::NotLinked;
using open_internal::UrlSets;

// The opener of a source scheme, in this program: null when not linked.
struct SourceScheme {
  std::string_view scheme;
  std::string_view component;
  bool built;
  decltype(&open_internal::OpenAmqpSource) source;
  decltype(&open_internal::OpenAmqpPublisher) publisher;
};

std::vector<SourceScheme> NetworkSchemes() {
  return {
      {"redis", "redis_streams", IDEM_OPEN_HAVE_REDIS_STREAMS != 0, &open_internal::OpenRedisStreamsSource,
       &open_internal::OpenRedisStreamsPublisher},
      {"amqp", "amqp", IDEM_OPEN_HAVE_AMQP != 0, &open_internal::OpenAmqpSource, &open_internal::OpenAmqpPublisher},
      {"kafka", "kafka", IDEM_OPEN_HAVE_KAFKA != 0, &open_internal::OpenKafkaSource,
       &open_internal::OpenKafkaPublisher},
      {"pubsub", "pubsub", IDEM_OPEN_HAVE_PUBSUB != 0, &open_internal::OpenPubsubSource,
       &open_internal::OpenPubsubPublisher},
      {"sqs", "sqs", IDEM_OPEN_HAVE_SQS != 0, &open_internal::OpenSqsSource, &open_internal::OpenSqsPublisher},
  };
}

// kInvalidArgument naming the scheme, or the component that was not built.
Status UnknownScheme(std::string_view url) {
  std::string known;
  for (const std::string& s : SourceSchemes()) known += (known.empty() ? "" : ", ") + s + ":";
  const std::string scheme = UrlScheme(url);
  const std::string component = scheme == "embedded" ? "embedded"
                                : scheme == "redis"  ? "redis_streams"
                                : scheme == "amqp"   ? "amqp"
                                : scheme == "kafka"  ? "kafka"
                                : scheme == "pubsub" ? "pubsub"
                                : scheme == "sqs"    ? "sqs"
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

}  // namespace

std::vector<std::string> SourceSchemes() {
  std::vector<std::string> out;
#if IDEM_OPEN_HAVE_EMBEDDED
  out.push_back("embedded");
#endif
  for (const SourceScheme& s : NetworkSchemes())
    if (s.source != nullptr) out.emplace_back(s.scheme);
  return out;
}

Result<std::unique_ptr<Source>> OpenSource(std::string_view url, const SourceOptions& settings) {
  const std::string scheme = UrlScheme(url);
#if IDEM_OPEN_HAVE_EMBEDDED
  if (scheme == "embedded") {
    IDEM_ASSIGN_OR_RETURN(embedded::Queue::Options o, embedded::Queue::ParseUrl(url));
    if (!UrlSets(url, "lease_ms")) o.lease_ms = settings.lease_ms;
    if (settings.env != nullptr) o.env = settings.env;
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<embedded::Queue> q, embedded::Queue::Open(o));
    return std::unique_ptr<Source>(std::move(q));
  }
#endif
  for (const SourceScheme& s : NetworkSchemes()) {
    if (s.scheme != scheme || !s.built) continue;
    if (s.source == nullptr) return NotLinked(s.component, url);
    return s.source(url, settings);
  }
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
  for (const SourceScheme& s : NetworkSchemes()) {
    if (s.scheme != scheme || !s.built) continue;
    if (s.publisher == nullptr) return NotLinked(s.component, url);
    return s.publisher(url);
  }
  return UnknownScheme(url);
}

}  // namespace idem
