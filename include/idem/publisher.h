// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Publisher: how a producer hands a message to a broker, the same on every
// broker. Publish returns once the broker has taken the message durably
// (the embedded queue's commit, Redis's XADD reply, RabbitMQ's publisher
// confirm, Kafka's delivery report); an error means it may or may not have
// been taken: publish again (the consumer's Inbox drops the copy).
//
// On the wire every broker carries the same two fields (doc/wire-format.md):
// the message id, and the producer's time in ms since the epoch when the
// Message has one, under the name kProducerTimeHeader.
//
// Thread safety: Publish may be called from many threads at once.
#ifndef IDEM_PUBLISHER_H_
#define IDEM_PUBLISHER_H_

#include <span>
#include <string_view>
#include <vector>

#include "idem/message.h"
#include "idem/status.h"

namespace idem {

// The name under which every publisher writes Message::producer_time_ms
// (a header, a stream field: decimal milliseconds since the Unix epoch, or
// a 64-bit integer where the broker's headers are typed). Sources also read
// the former names "idem-produced-at-ms" (Kafka) and "producer_time_ms"
// (Redis Streams); see doc/wire-format.md.
inline constexpr std::string_view kProducerTimeHeader = "idem-producer-time-ms";

// The name under which PublishBatch writes Outgoing::key when it is not
// empty (a header, a stream field header:idem-ordering-key; on Kafka also
// the record key): doc/wire-format.md. A source delivers it among
// Message::headers.
inline constexpr std::string_view kOrderingKeyHeader = "idem-ordering-key";

// One message of a PublishBatch: where it goes and what orders it.
struct Outgoing {
  // The queue, stream or topic. Empty: the channel the publisher was
  // opened on (its URL's queue, stream or topic).
  std::string_view destination{};
  // The ordering key (the aggregate id): Kafka's record key (the message id
  // when empty), and the idem-ordering-key header elsewhere. Messages with
  // one key are meant to be stored in the order they are handed over.
  std::string_view key{};
  const Message* message = nullptr;
};

// What a publisher promises about a batch.
struct PublisherTraits {
  // True when, within one PublishBatch, a message of a key is never stored
  // unless every earlier message of that key in the batch was (no gaps, no
  // reordering): the embedded queue (one transaction), Kafka's idempotent
  // producer. False: the caller sends at most one message per key per
  // batch to keep order (the outbox relay does).
  bool ordered_batch = false;
  // The most messages worth handing over in one PublishBatch.
  int max_batch = 1;
};

class Publisher {
 public:
  virtual ~Publisher() = default;

  // Appends `message` (id, payload, producer time) and waits until the
  // broker confirms it. kInvalidArgument for a message the broker cannot
  // carry (empty id, too large); kUnavailable / kInDoubt when the broker
  // did not confirm.
  virtual Status Publish(const Message& message) = 0;

  // Hands over every message of `batch` and waits until the broker has
  // confirmed or refused each; element i answers batch[i]. Permanent
  // refusals are kInvalidArgument (the broker can never carry it) and
  // kRejected (the broker refused it: no such destination, a nack of a
  // message it will never take); anything else may succeed if sent again.
  // Default: Publish in turn, for the publisher's own channel only.
  virtual std::vector<Status> PublishBatch(std::span<const Outgoing> batch);
  virtual PublisherTraits traits() const { return {}; }
  // The channel named by the URL or options the publisher was opened with
  // (the default destination); empty if none.
  virtual std::string_view Channel() const { return {}; }

  // "embedded", "redis-streams", "amqp", "kafka": the same names as the
  // Source::Kind() of the source that reads what it publishes.
  virtual std::string_view Kind() const = 0;
};

}  // namespace idem

#endif  // IDEM_PUBLISHER_H_
