// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
// OpenSource's and OpenPublisher's pubsub:// (src/open/openers.h).
#include <algorithm>

#include "idem/pubsub/publisher.h"
#include "idem/pubsub/source.h"
#include "open/openers.h"

extern "C" void idem_open_link_pubsub() {}

namespace idem::open_internal {

Result<std::unique_ptr<Source>> OpenPubsubSource(std::string_view url, const SourceOptions& settings) {
  IDEM_ASSIGN_OR_RETURN(pubsub::Source::Options o, pubsub::Source::ParseUrl(url));
  // The acknowledgement deadline is the subscription's; lease_ms only
  // sets it for a subscription created here.
  if (!UrlSets(url, "lease_ms")) o.lease_ms = std::clamp<int64_t>(settings.lease_ms, 10'000, 600'000);
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<pubsub::Source> s, pubsub::Source::Open(o));
  return std::unique_ptr<Source>(std::move(s));
}

Result<std::unique_ptr<Publisher>> OpenPubsubPublisher(std::string_view url) {
  IDEM_ASSIGN_OR_RETURN(pubsub::Publisher::Options o, pubsub::Publisher::ParseUrl(url));
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<pubsub::Publisher> p, pubsub::Publisher::Open(o));
  return std::unique_ptr<Publisher>(std::move(p));
}

}  // namespace idem::open_internal
