// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
// OpenSource's and OpenPublisher's kafka:// (src/open/openers.h).
#include "idem/kafka/publisher.h"
#include "idem/kafka/source.h"
#include "open/openers.h"

extern "C" void idem_open_link_kafka() {}

namespace idem::open_internal {

Result<std::unique_ptr<Source>> OpenKafkaSource(std::string_view url, const SourceOptions& settings) {
  IDEM_ASSIGN_OR_RETURN(kafka::Source::Options o, kafka::Source::ParseUrl(url));
  if (!UrlSets(url, "client_id") && !settings.consumer.empty()) o.client_id = settings.consumer;
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<kafka::Source> s, kafka::Source::Open(o));
  return std::unique_ptr<Source>(std::move(s));
}

Result<std::unique_ptr<Publisher>> OpenKafkaPublisher(std::string_view url) {
  IDEM_ASSIGN_OR_RETURN(kafka::Publisher::Options o, kafka::Publisher::ParseUrl(url));
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<kafka::Publisher> p, kafka::Publisher::Open(o));
  return std::unique_ptr<Publisher>(std::move(p));
}

}  // namespace idem::open_internal
