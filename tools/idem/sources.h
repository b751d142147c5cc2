// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The idem command's sources: one URL names a broker and what to consume.
//   embedded:PATH?queue=NAME                      the embedded queue (SQLite file)
//   redis://HOST:PORT[/DB]?stream=S&group=G       Redis Streams (consumer group)
//   amqp://USER:PASS@HOST:PORT/VHOST?queue=Q      RabbitMQ
//   kafka://HOST:PORT[,...]?topic=T&group=G       Kafka (consumer group)
//   kafka-mock:?topic=T                           librdkafka's mock cluster, in this process
// Each comes with a publisher for the demo producer and the benchmarks.
#ifndef IDEM_TOOLS_IDEM_SOURCES_H_
#define IDEM_TOOLS_IDEM_SOURCES_H_

#include <functional>
#include <memory>
#include <string>

#include "idem/message.h"
#include "idem/result.h"
#include "idem/source.h"

namespace idem::cli {

struct OpenedSource {
  // Whatever must outlive the source and the publisher (a mock cluster):
  // declared first, so it is destroyed last.
  std::shared_ptr<void> owner;
  std::unique_ptr<Source> source;
  // Appends a message as a producer would (with the broker's confirms).
  std::function<Status(const Message&)> publish;
  std::string kind;
  // A clean stop before the source is destroyed, where the source has one
  // (Redis Streams: StreamSource::Close, which removes the consumer name
  // from the group when nothing is pending under it). Empty: nothing to do.
  std::function<Status()> close;
  // A URL another process can open to reach the same broker and topic: the
  // URL itself, except for kafka-mock: (the mock cluster's bootstrap address
  // as kafka://..., valid while `owner` lives).
  std::string shared_url;
};

struct SourceSettings {
  int64_t lease_ms = 30'000;     // visibility timeout where the broker has one
  std::string consumer = "idem";  // this process's name in a consumer group
};

// kInvalidArgument for an unknown scheme or a bad URL (naming it, password
// hidden); the source's own errors otherwise.
Result<OpenedSource> OpenSource(const std::string& url, const SourceSettings& settings);

// The schemes this build knows, for --help and errors.
std::string KnownSources();

}  // namespace idem::cli

#endif  // IDEM_TOOLS_IDEM_SOURCES_H_
