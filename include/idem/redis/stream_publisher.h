// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// StreamPublisher: the producer's end of a Redis Stream. Publish appends one
// entry (XADD <stream> * ...) in the fields StreamSource reads
// (idem/redis/stream_source.h, doc/wire-format.md) and returns once Redis
// answered the XADD. An error may still mean the entry was appended (the
// connection broke before the reply): publish again, the consumer's Inbox
// drops the copy.
//
//   auto pub = idem::redis::StreamPublisher::Open({.url = "redis://127.0.0.1:6379", .stream = "orders"});
//   (*pub)->Publish(message);
//
// Thread safety: Publish and Append may be called from many threads (a pool
// of connections).
#ifndef IDEM_REDIS_STREAM_PUBLISHER_H_
#define IDEM_REDIS_STREAM_PUBLISHER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "idem/message.h"
#include "idem/publisher.h"
#include "idem/result.h"
#include "idem/status.h"

namespace idem::redis {

class StreamPublisher : public Publisher {
 public:
  struct Options {
    // "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]", no query. Required.
    std::string url;
    // The stream's key. Required.
    std::string stream;
    // The entry fields for the message id and the payload: the same as the
    // consumers' StreamSource::Options. Defaults: "id", "payload".
    std::string id_field = "id";
    std::string payload_field = "payload";
    // Idle connections kept for reuse (values below 1 are taken as 1).
    // Default: 8.
    int pool_size = 8;
    // How long to wait for a connection, in ms (> 0). Default: 5000.
    int64_t connect_timeout_ms = 5'000;
  };

  // Checks the options and connects (so a wrong URL or password shows at
  // once). kInvalidArgument naming the field; kUnavailable naming host:port
  // (the password is never echoed).
  static Result<std::unique_ptr<StreamPublisher>> Open(const Options& options);
  // Reads the URL of StreamSource::ParseUrl (the same URL opens both ends);
  // the keys only a consumer uses (group, consumer, lease_ms, ...) are
  // checked and ignored.
  static Result<Options> ParseUrl(std::string_view url);

  // Appends `message`. kInvalidArgument for an invalid message id.
  Status Publish(const Message& message) override = 0;
  // As Publish, and returns the new entry's id.
  virtual Result<std::string> Append(const Message& message) = 0;
  std::string_view Kind() const override { return "redis-streams"; }
};

}  // namespace idem::redis

#endif  // IDEM_REDIS_STREAM_PUBLISHER_H_
