// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The idem command's sources: idem::OpenSource and idem::OpenPublisher
// (idem/open.h, the URL grammar of doc/sources.md) for
//   embedded:PATH?queue=NAME, redis://...?stream=S, amqp://...?queue=Q,
//   kafka://HOST:PORT[,...]?topic=T,
// plus the command's own
//   kafka-mock:?topic=T[&partitions=N]            librdkafka's mock cluster, in this process
// (which also takes the kafka:// keys). Each comes with a publisher for the
// demo producer and the benchmarks.
#ifndef IDEM_TOOLS_IDEM_SOURCES_H_
#define IDEM_TOOLS_IDEM_SOURCES_H_

#include <functional>
#include <memory>
#include <string>

#include "idem/message.h"
#include "idem/open.h"
#include "idem/publisher.h"
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

// lease_ms: the visibility timeout where the source has one; consumer: this
// process's name in a consumer group (the process id is appended, so that
// two processes never share a Redis consumer name; empty: a new name each).
using SourceSettings = ::idem::SourceOptions;

// kInvalidArgument for an unknown scheme or a bad URL (naming it, password
// hidden); the source's own errors otherwise.
Result<OpenedSource> OpenSource(const std::string& url, const SourceSettings& settings);

// idem::OpenPublisher for the URL of a command's flag (idem relay --to, idem
// run --relay-to): a URL it refuses is kInvalidArgument naming the flag and
// the URL (password hidden).
Result<std::unique_ptr<Publisher>> OpenPublisherFlag(const std::string& flag, const std::string& url);

// The schemes this build knows, for --help and errors.
std::string KnownSources();

}  // namespace idem::cli

#endif  // IDEM_TOOLS_IDEM_SOURCES_H_
