// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Source: a channel that delivers messages at least once. A delivery stays
// the source's until it is acknowledged; a delivery that is not acknowledged
// in time (a crash, a lost ack, an expired lease) is delivered again, maybe to
// another consumer. So acknowledge only after the effect is committed.
//
// Thread safety: implementations must allow Receive/Ack/Nack from many
// threads at once.
#ifndef IDEM_SOURCE_H_
#define IDEM_SOURCE_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/message.h"
#include "idem/result.h"
#include "idem/status.h"

namespace idem {

// How far back the messages a source may still deliver go (Source::Horizon).
// A marker must outlive the message it guards: once it is purged, a copy of
// the message that still comes (a delivery never acknowledged, a lost ack,
// a replay) applies again. idem/retention.h refuses a purge that would
// delete the markers of messages younger than the horizon.
struct RedeliveryHorizon {
  enum class Kind {
    // The source cannot tell (RabbitMQ): only a horizon the user declares
    // can guard a purge.
    kUnknown,
    // Nothing is left to deliver or redeliver: every message the source
    // took has been acknowledged.
    kNone,
    // at_ms is the time of the oldest message the source may still deliver
    // or redeliver (not acknowledged: pending, leased, nacked or not yet
    // delivered).
    kAt,
  };
  Kind kind = Kind::kUnknown;
  // kAt: milliseconds since the Unix epoch, when the source took the message
  // (its enqueue time), on the clock the source keeps: the Env's for the
  // embedded queue, the Redis server's for Redis Streams. Markers'
  // processed_at_ms are on the Inbox's Env, so the two must agree (in
  // production both are the system clock).
  int64_t at_ms = 0;

  static RedeliveryHorizon Unknown() { return {}; }
  static RedeliveryHorizon None() { return {.kind = Kind::kNone}; }
  static RedeliveryHorizon At(int64_t at_ms) { return {.kind = Kind::kAt, .at_ms = at_ms}; }
  bool known() const { return kind != Kind::kUnknown; }
};

struct Delivery {
  Message message{};  // message.attempt is the source's delivery count
  // Opaque: identifies this delivery (and its lease) to Ack and Nack.
  std::string receipt{};
};

class Source {
 public:
  virtual ~Source() = default;

  // Waits up to `wait_ms` for at least one message and returns up to `max`.
  // An empty vector means none arrived in time.
  virtual Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) = 0;
  // The message is done: the source forgets it. Code::kLeaseLost when the
  // delivery's lease had already expired and the message went to someone
  // else (harmless after a commit: the other delivery finds the marker).
  virtual Status Ack(const Delivery& delivery) = 0;
  // Acknowledges several deliveries at once: element i answers
  // deliveries[i] as Ack would. The Consumer calls it with the deliveries of
  // one batch (Consumer::Options::batch) whose outcome is settled, after
  // their transaction committed. A broker that takes acks in batches (SQS's
  // DeleteMessageBatch) overrides it. Default: Ack each in turn.
  virtual std::vector<Status> AckBatch(std::span<const Delivery> deliveries) {
    std::vector<Status> out;
    out.reserve(deliveries.size());
    for (const Delivery& d : deliveries) out.push_back(Ack(d));
    return out;
  }
  // Gives the message back, to be delivered again after `delay_ms`.
  virtual Status Nack(const Delivery& delivery, int64_t delay_ms) = 0;
  // "embedded", "redis", ...
  virtual std::string_view Kind() const = 0;

  // How long a received delivery stays this consumer's before the source may
  // hand it to another (a visibility timeout), in ms; 0 when deliveries have
  // no such lease (they stay the consumer's until acked or disconnected:
  // RabbitMQ, Kafka). The Consumer extends the lease of a delivery whose
  // handler runs longer than a third of it. Default: 0.
  virtual int64_t lease_ms() const { return 0; }
  // Renews the delivery's lease: it stays this consumer's for another
  // lease_ms() from now. Code::kLeaseLost when it was already given to
  // another consumer (the handler's commit still settles the race by the
  // marker). Default: OK (no lease to renew).
  virtual Status ExtendLease(const Delivery& delivery) {
    (void)delivery;
    return Status::OK();
  }

  // The redelivery horizon: the time of the oldest message this source may
  // still deliver or redeliver to this consumer (its group, its queue), or
  // None when there is none, or Unknown when the source cannot tell. Asked
  // before a purge (idem/retention.h) and by the horizon gauge, from any
  // thread; it reads the broker (one query), so not per message. Errors are
  // the broker's (kUnavailable, ...). Default: Unknown.
  virtual Result<RedeliveryHorizon> Horizon() { return RedeliveryHorizon::Unknown(); }
};

}  // namespace idem

#endif  // IDEM_SOURCE_H_
