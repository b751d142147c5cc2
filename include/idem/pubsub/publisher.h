// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::pubsub::Publisher: publishes to a Google Cloud Pub/Sub topic over the
// REST API (projects.topics.publish), in batches, in the form
// idem::pubsub::Source reads (doc/wire-format.md):
//   data                     the payload (base64 on the wire)
//   attribute idem-id        the message id (Options::id_attribute)
//   attribute idem-producer-time-ms   decimal ms since the Unix epoch, when set
//   other attributes         the headers (names unique, not starting with
//                            "goog", values valid UTF-8: else kInvalidArgument)
//   orderingKey              Outgoing::key, else Options::ordering_key, else
//                            the message's idem-ordering-key header
//
// Publish returns once the service answered with the message ids (it has
// stored them). A failed call may still have been stored: publish again; the
// consumer's Inbox drops the copy (the id attribute is the same).
//
// Endpoint and credentials as idem::pubsub::Source (idem/pubsub/source.h).
//
// Thread safety: Publish and PublishBatch may be called from many threads.
#ifndef IDEM_PUBSUB_PUBLISHER_H_
#define IDEM_PUBSUB_PUBLISHER_H_

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/publisher.h"
#include "idem/pubsub/source.h"
#include "idem/result.h"

namespace idem::pubsub {

class Publisher : public idem::Publisher {
 public:
  struct Options {
    Connection connection{};
    // The topic's id (not its full name): where Publish goes and
    // PublishBatch's elements without a destination. Empty: Publish is
    // kInvalidArgument; PublishBatch needs destinations.
    std::string topic{};
    // The attribute the message id goes in. Default: "idem-id".
    std::string id_attribute = std::string(kDefaultIdAttribute);
    // The ordering key of messages that bring none (Outgoing::key, then an
    // idem-ordering-key header). Default: none.
    std::string ordering_key{};
    // Create the topic at Open when it does not exist. Default: false.
    bool create = false;
    // The most messages per publish call (1..1000). Default: 100.
    int max_batch = 100;
    Env* env = nullptr;  // sleeps between retries; default Env::Default()
  };

  // Checks that the topic exists (creating it with `create`). Errors as
  // Source::Open.
  static Result<std::unique_ptr<Publisher>> Open(const Options& options);
  // Parses "pubsub://PROJECT[/SUBSCRIPTION]?topic=T[&endpoint=URL]
  // [&token_file=PATH][&ca_file=PATH][&id_attribute=A][&ordering_key=K]
  // [&create=B][&max_batch=N][&connect_timeout_ms=N][&read_timeout_ms=N]
  // [&max_attempts=N][&pool_size=N]" (a source URL with topic=; the source's
  // own keys are accepted and ignored). kInvalidArgument for another scheme,
  // no project, an unknown key or a bad value.
  static Result<Options> ParseUrl(std::string_view url);

  std::string_view Kind() const override { return "pubsub"; }
};

}  // namespace idem::pubsub

#endif  // IDEM_PUBSUB_PUBLISHER_H_
