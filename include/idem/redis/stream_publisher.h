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
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/message.h"
#include "idem/publisher.h"
#include "idem/result.h"
#include "idem/status.h"

namespace idem::redis {

class StreamPublisher : public Publisher {
 public:
  struct Options {
    // "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]", no query. Required.
    std::string url{};
    // The stream's key: Channel(), where Publish appends. Empty: Publish is
    // kInvalidArgument, PublishBatch needs a destination per message.
    std::string stream{};
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
  // checked and ignored. Unlike the source's, ?stream= may be left out.
  static Result<Options> ParseUrl(std::string_view url);

  // Appends `message`. kInvalidArgument for an invalid message id, or when
  // the publisher was opened without a stream.
  Status Publish(const Message& message) override = 0;
  // One XADD per element (destination: the stream's key; empty: Options::
  // stream), pipelined on one connection, each answered by its own reply
  // (an error reply fails that element only); a non-empty key is written
  // as the field header:idem-ordering-key. traits(): not ordered (one entry
  // may fail and the next pass), max_batch 500. Channel(): Options::stream.
  std::vector<Status> PublishBatch(std::span<const Outgoing> batch) override = 0;
  // As Publish, and returns the new entry's id.
  virtual Result<std::string> Append(const Message& message) = 0;
  std::string_view Kind() const override { return "redis-streams"; }
};

}  // namespace idem::redis

#endif  // IDEM_REDIS_STREAM_PUBLISHER_H_
