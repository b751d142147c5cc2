// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: what every adapter's PublishBatch checks the same way (an
// element's message and destination) and how it adds the ordering key to a
// message's headers (doc/wire-format.md).
#ifndef IDEM_SRC_CORE_PUBLISH_BATCH_H_
#define IDEM_SRC_CORE_PUBLISH_BATCH_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/message.h"
#include "idem/publisher.h"
#include "idem/result.h"
#include "idem/status.h"

namespace idem::publish_internal {

// kInvalidArgument for Publish(message) on a publisher opened without a
// channel: `what` names the channel's kind ("queue", "stream", "topic").
inline Status NoChannel(std::string_view kind, std::string_view what) {
  return Status::InvalidArgument(std::string(kind) + " publisher: no " + std::string(what) +
                                 " was given (in its URL or options): Publish(message) has nowhere to go; use "
                                 "PublishBatch with a destination");
}

// Where element `o` goes: its destination, else `channel`. kInvalidArgument
// for an element without a message or with an invalid id, and when neither
// names a destination.
inline Result<std::string_view> Destination(const Outgoing& o, std::string_view channel, std::string_view kind,
                                            std::string_view what) {
  if (o.message == nullptr) return Status::InvalidArgument("PublishBatch: an Outgoing without a message");
  if (Status s = ValidateId(o.message->id); !s.ok()) return s;
  if (!o.destination.empty()) return o.destination;
  if (channel.empty()) return NoChannel(kind, what);
  return channel;
}

// The message's headers followed by the ordering key (when not empty).
inline std::vector<std::pair<std::string, std::string>> HeadersWithKey(const Message& m, std::string_view key) {
  std::vector<std::pair<std::string, std::string>> h = m.headers;
  if (!key.empty()) h.emplace_back(std::string(kOrderingKeyHeader), std::string(key));
  return h;
}

}  // namespace idem::publish_internal

#endif  // IDEM_SRC_CORE_PUBLISH_BATCH_H_
