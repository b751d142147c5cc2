// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: what idem::pubsub's Source and Publisher share: the connection
// (endpoint, token, client) from their options or URL, resource names, and
// the creation of topics and subscriptions.
#ifndef IDEM_SRC_PUBSUB_COMMON_H_
#define IDEM_SRC_PUBSUB_COMMON_H_

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "idem/pubsub/source.h"
#include "idem/result.h"
#include "idem/url.h"
#include "pubsub/rest.h"

namespace idem::pubsub_internal {

// The URL keys of the connection (both URL forms accept them).
#define IDEM_PUBSUB_CONNECTION_KEYS \
  "endpoint", "token_file", "ca_file", "connect_timeout_ms", "read_timeout_ms", "max_attempts", "pool_size"
// The source's own keys (a publisher URL may carry them: one URL opens both).
#define IDEM_PUBSUB_SOURCE_KEYS                                                                                      \
  "id_attribute", "id_fallback", "poll_ms", "batch_acks", "create", "topic", "lease_ms", "exactly_once", "ordering", \
      "dead_letter_topic", "max_delivery_attempts"

// "pubsub://PROJECT[/REST]?...": the parsed URL, the connection's keys read
// into `c`, and REST (the subscription, or "").
Result<ParsedUrl> ParseConnectionUrl(std::string_view url, pubsub::Connection& c, std::string* rest);

// The client for `c` (its endpoint and token found: FindEndpoint).
Result<std::unique_ptr<RestClient>> OpenClient(const pubsub::Connection& c, Env* env);

// kInvalidArgument unless `id` is a Pub/Sub resource id (3..255 characters,
// a letter first, then letters, digits and -_.~+%, not starting with
// "goog"); `what` names it ("subscription").
Status CheckResourceId(std::string_view what, std::string_view id);

std::string TopicName(std::string_view project, std::string_view topic);       // projects/P/topics/T
std::string SubscriptionName(std::string_view project, std::string_view sub);  // projects/P/subscriptions/S

// PUTs the topic; an existing one (409 ALREADY_EXISTS) is OK.
Status CreateTopic(RestClient& client, std::string_view project, std::string_view topic);
// GETs `path`: OK, kNotFound, or the error, `what` naming the resource.
Result<nlohmann::json> GetResource(RestClient& client, const std::string& path, std::string_view what);

// The call's error, if any, as a Status (`what` first); OK for a 2xx.
Status ReplyStatus(const Result<RestReply>& r, std::string_view what);

}  // namespace idem::pubsub_internal

#endif  // IDEM_SRC_PUBSUB_COMMON_H_
