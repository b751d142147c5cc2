// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
// OpenSource's and OpenPublisher's redis:// (src/open/openers.h).
#include "idem/redis/stream_publisher.h"
#include "idem/redis/stream_source.h"
#include "open/openers.h"

extern "C" void idem_open_link_redis_streams() {}

namespace idem::open_internal {

Result<std::unique_ptr<Source>> OpenRedisStreamsSource(std::string_view url, const SourceOptions& settings) {
  IDEM_ASSIGN_OR_RETURN(redis::StreamSource::Options o, redis::StreamSource::ParseUrl(url));
  if (!UrlSets(url, "lease_ms")) o.lease_ms = settings.lease_ms;
  // Empty in both: StreamSource::Open names this start anew.
  if (o.consumer.empty()) o.consumer = settings.consumer;
  if (settings.env != nullptr) o.env = settings.env;
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<redis::StreamSource> s, redis::StreamSource::Open(o));
  return std::unique_ptr<Source>(std::move(s));
}

Result<std::unique_ptr<Publisher>> OpenRedisStreamsPublisher(std::string_view url) {
  IDEM_ASSIGN_OR_RETURN(redis::StreamPublisher::Options o, redis::StreamPublisher::ParseUrl(url));
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<redis::StreamPublisher> p, redis::StreamPublisher::Open(o));
  return std::unique_ptr<Publisher>(std::move(p));
}

}  // namespace idem::open_internal
