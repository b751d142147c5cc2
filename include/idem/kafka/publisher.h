// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// kafka::Publisher: the producer's end of a topic (librdkafka), opened by the
// URL of kafka::Source (idem/kafka/source.h).
//
//   auto pub = idem::kafka::Publisher::Open({.brokers = "k1:9092", .topic = "payments"});
//   (*pub)->Publish(message);
#ifndef IDEM_KAFKA_PUBLISHER_H_
#define IDEM_KAFKA_PUBLISHER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/message.h"
#include "idem/publisher.h"
#include "idem/result.h"
#include "idem/status.h"

namespace idem::kafka {

struct ProduceOptions {
  // The partition, or -1 to let the partitioner pick by key. Default: -1.
  int32_t partition = -1;
  // The record key; nullopt: the message id (so every copy of a message
  // lands in one partition, in order). Default: nullopt.
  std::optional<std::string> key{};
};

// The producer's end of a topic: writes messages as records, payload as
// value, the id in the id header, the message's headers after it, and
// producer_time_ms in the header "idem-producer-time-ms" (decimal ms;
// doc/wire-format.md). Publish waits for the brokers' delivery report;
// Produce and Flush are the batched form (queue many, then wait once).
//
// Thread safety: Publish, Produce and Flush may be called from many threads.
class Publisher final : public ::idem::Publisher {
 public:
  struct Options {
    // Bootstrap brokers, "host:port,...". Required.
    std::string brokers{};
    // The topic Publish and Produce write to. Empty: they are
    // kInvalidArgument, and PublishBatch needs a destination per message.
    std::string topic{};
    // The header that carries the message id. Default: "id".
    std::string id_header = "id";
    // acks: "all", "1" or "0". Default: "all".
    std::string acks = "all";
    // Extra librdkafka properties, applied last. Default: none.
    std::vector<std::pair<std::string, std::string>> config{};
    // As Source::Options::connect_timeout_ms: when > 0, Open fails with
    // Code::kUnavailable unless a broker answers a metadata request within
    // this long. Default: 0 (lazily).
    int64_t connect_timeout_ms = 0;
    // How long Publish waits for the delivery report, in ms (> 0).
    // Default: 30000.
    int64_t publish_timeout_ms = 30'000;
  };

  // kInvalidArgument for a missing or rejected option; with
  // connect_timeout_ms, kUnavailable when no broker answers in time.
  static Result<std::unique_ptr<Publisher>> Open(const Options& options);
  // Reads the URL of Source::ParseUrl (the same URL opens both ends): the
  // brokers, topic, id_header and connect_timeout_ms (5000 where the URL
  // says nothing); the keys only a consumer uses are checked and ignored.
  static Result<Options> ParseUrl(std::string_view url);
  // Flushes (up to 10 s) and destroys the producer.
  ~Publisher() override;
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  // Produce(message) and Flush(publish_timeout_ms): returns once the
  // brokers acknowledged it (acks). An error: it may or may not be written;
  // publish again.
  Status Publish(const Message& message) override;
  // Produces every element as a record (topic: its destination, else
  // Options::topic; record key: its key, else the message id; the headers
  // as Produce writes them, and idem-ordering-key = key when not empty),
  // then flushes and gives each element its own delivery report
  // (kInDoubt for one that did not come within publish_timeout_ms).
  // traits(): ordered_batch when the producer is idempotent (the default:
  // acks=all, enable.idempotence=true unless `config` turns it off), with
  // the partitioner murmur2_random (one key, one partition, as the Java
  // client places it); max_batch 1000. Channel(): Options::topic.
  std::vector<Status> PublishBatch(std::span<const Outgoing> batch) override;
  PublisherTraits traits() const override;
  std::string_view Channel() const override;
  std::string_view Kind() const override { return "kafka"; }

  // Queues one record. kBusy when the local queue is full (Flush, retry).
  Status Produce(const Message& message, const ProduceOptions& options = {});
  // Waits up to `timeout_ms` for every queued record to be acknowledged by
  // the brokers. OK when all were; otherwise the first delivery error since
  // the last Flush (kUnavailable when the wait timed out).
  Status Flush(int64_t timeout_ms = 30'000);

  struct Impl;

 private:
  explicit Publisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::kafka

#endif  // IDEM_KAFKA_PUBLISHER_H_
