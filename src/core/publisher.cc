// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/publisher.h"

#include <string>

namespace idem {

std::vector<Status> Publisher::PublishBatch(std::span<const Outgoing> batch) {
  std::vector<Status> out;
  out.reserve(batch.size());
  for (const Outgoing& o : batch) {
    if (o.message == nullptr) {
      out.push_back(Status::InvalidArgument("PublishBatch: an Outgoing without a message"));
    } else if (!o.destination.empty() && o.destination != Channel()) {
      out.push_back(Status::InvalidArgument("this " + std::string(Kind()) + " publisher publishes to '" +
                                            std::string(Channel()) + "' only, not to '" + std::string(o.destination) +
                                            "'"));
    } else {
      out.push_back(Publish(*o.message));
    }
  }
  return out;
}

}  // namespace idem
