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
#include <string>
#include <string_view>
#include <vector>

#include "idem/message.h"
#include "idem/result.h"
#include "idem/status.h"

namespace idem {

struct Delivery {
  Message message;  // message.attempt is the source's delivery count
  // Opaque: identifies this delivery (and its lease) to Ack and Nack.
  std::string receipt;
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
};

}  // namespace idem

#endif  // IDEM_SOURCE_H_
