// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
// OpenSource's and OpenPublisher's sqs:// (src/open/openers.h).
#include "idem/sqs/publisher.h"
#include "idem/sqs/source.h"
#include "open/openers.h"

extern "C" void idem_open_link_sqs() {}

namespace idem::open_internal {

Result<std::unique_ptr<Source>> OpenSqsSource(std::string_view url, const SourceOptions& settings) {
  IDEM_ASSIGN_OR_RETURN(sqs::Source::Options o, sqs::Source::ParseUrl(url));
  // SQS's visibility timeout is whole seconds: a lease from the settings is
  // rounded up to one.
  if (!UrlSets(url, "lease_ms") && settings.lease_ms > 0) o.lease_ms = (settings.lease_ms + 999) / 1000 * 1000;
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<sqs::Source> s, sqs::Source::Open(o));
  return std::unique_ptr<Source>(std::move(s));
}

Result<std::unique_ptr<Publisher>> OpenSqsPublisher(std::string_view url) {
  IDEM_ASSIGN_OR_RETURN(sqs::Publisher::Options o, sqs::Publisher::ParseUrl(url));
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<sqs::Publisher> p, sqs::Publisher::Open(o));
  return std::unique_ptr<Publisher>(std::move(p));
}

}  // namespace idem::open_internal
