// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "sources.h"

#include "idem/embedded/queue.h"

namespace idem::cli {

std::string KnownSources() {
  std::string s = "embedded:PATH?queue=NAME";
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
    return out;
  }
  auto colon = url.find(':');
  return Status::InvalidArgument("unknown source '" + (colon == std::string::npos ? url : url.substr(0, colon + 1)) +
                                 "...' (known: " + KnownSources() + ")");
}

}  // namespace idem::cli
