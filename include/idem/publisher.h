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

#include <string_view>

#include "idem/message.h"
#include "idem/status.h"

namespace idem {

// The name under which every publisher writes Message::producer_time_ms
// (a header, a stream field: decimal milliseconds since the Unix epoch, or
// a 64-bit integer where the broker's headers are typed). Sources also read
// the former names "idem-produced-at-ms" (Kafka) and "producer_time_ms"
// (Redis Streams); see doc/wire-format.md.
inline constexpr std::string_view kProducerTimeHeader = "idem-producer-time-ms";

class Publisher {
 public:
  virtual ~Publisher() = default;

  // Appends `message` (id, payload, producer time) and waits until the
  // broker confirms it. kInvalidArgument for a message the broker cannot
  // carry (empty id, too large); kUnavailable / kInDoubt when the broker
  // did not confirm.
  virtual Status Publish(const Message& message) = 0;

  // "embedded", "redis-streams", "amqp", "kafka": the same names as the
  // Source::Kind() of the source that reads what it publishes.
  virtual std::string_view Kind() const = 0;
};

}  // namespace idem

#endif  // IDEM_PUBLISHER_H_
