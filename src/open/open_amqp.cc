// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
// OpenSource's and OpenPublisher's amqp:// (src/open/openers.h).
#include "idem/amqp/publisher.h"
#include "idem/amqp/source.h"
#include "open/openers.h"

extern "C" void idem_open_link_amqp() {}

namespace idem::open_internal {

Result<std::unique_ptr<Source>> OpenAmqpSource(std::string_view url, const SourceOptions& settings) {
  IDEM_ASSIGN_OR_RETURN(amqp::Source::Options o, amqp::Source::ParseUrl(url));
  if (!UrlSets(url, "lease_ms")) o.lease_ms = settings.lease_ms;
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<amqp::Source> s, amqp::Source::Open(o));
  return std::unique_ptr<Source>(std::move(s));
}

Result<std::unique_ptr<Publisher>> OpenAmqpPublisher(std::string_view url) {
  IDEM_ASSIGN_OR_RETURN(amqp::Publisher::Options o, amqp::Publisher::ParseUrl(url));
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<amqp::Publisher> p, amqp::Publisher::Open(o));
  return std::unique_ptr<Publisher>(std::move(p));
}

}  // namespace idem::open_internal
