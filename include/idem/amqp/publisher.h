// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// amqp::Publisher: the producer's end of a RabbitMQ queue, with publisher
// confirms. Publish returns once the broker confirmed the message (it is
// then on disk for a durable queue); it writes the wire format of
// doc/wire-format.md: the id as the message-id property, the producer time
// in the header "idem-producer-time-ms" (and, in seconds, the timestamp
// property), the payload as the body.
//
//   auto pub = idem::amqp::Publisher::Open({.url = "amqp://idem:secret@127.0.0.1:5672/%2f",
//                                           .queue = "payments"});
//   (*pub)->Publish(message);
//
// Thread safety: a Publisher may be used from many threads; it holds one
// connection behind a mutex (rabbitmq-c connections are not thread-safe).
#ifndef IDEM_AMQP_PUBLISHER_H_
#define IDEM_AMQP_PUBLISHER_H_

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

namespace idem::amqp {

class Publisher : public ::idem::Publisher {
 public:
  struct Options {
    // "amqp://user:password@host:port/vhost", as for Source::Options::url.
    // Required.
    std::string url{};
    // The routing key Publish(message) uses: with the default exchange, the
    // queue's name. Empty: Publish(message) is kInvalidArgument (use
    // Publish(routing_key, message)). Default: empty.
    std::string queue{};
    // Exchange to publish to. Empty: the default exchange (routing key =
    // queue name). Default: empty.
    std::string exchange{};
    // Declare `queue` (durable, not exclusive, not auto-delete, of
    // queue_type) on every connect, as Source::Options::declare_queue does.
    // Default: false.
    bool declare_queue = false;
    // With declare_queue: "classic" or "quorum", as the consumers declare it
    // (RabbitMQ refuses a declaration with other arguments). Default: classic.
    std::string queue_type = "classic";
    // Connect and confirm timeout, in ms (values below 1 are taken as
    // 5000). Default: 5000.
    int64_t connect_timeout_ms = 5'000;
  };

  // Checks the options, connects and puts the channel in confirm mode
  // (confirm.select). kInvalidArgument for a bad URL (password hidden), a
  // queue longer than 255 bytes, declare_queue without a queue, a bad
  // queue_type; kUnavailable when the broker cannot be reached or refuses
  // the login.
  static Result<std::unique_ptr<Publisher>> Open(const Options& options);
  // Reads the URL of Source::ParseUrl (the same URL opens both ends):
  // queue, queue_type, declare_queue (default true, as for the Source) and
  // connect_timeout_ms; the keys only a consumer uses are checked and
  // ignored. Unlike the source's, ?queue= may be left out (no queue is then
  // declared: PublishBatch names a destination per message).
  static Result<Options> ParseUrl(std::string_view url);

  // Publishes to Options::queue (see Publish(routing_key, message));
  // kInvalidArgument when it is empty.
  Status Publish(const Message& message) override = 0;
  // Publishes persistently (delivery mode 2, mandatory) and waits for the
  // broker's confirm. message.id becomes the message-id property (an empty
  // id publishes none: for tests of the dead-letter path); headers become
  // string headers. Reconnects once if the connection was lost before.
  //   kInvalidArgument: a header with an empty name (rabbitmq-c 0.11 cannot
  //     decode such a table: a consumer's connection would fail on every
  //     delivery of it), a name or an id longer than 255 bytes.
  //   kNotFound: unroutable (no queue bound to the routing key).
  //   kInDoubt: the connection dropped or the confirm did not come in time:
  //     the message may or may not be queued; publish it again (consumers
  //     are idempotent).
  //   kUnavailable: the broker nacked it or cannot be reached.
  virtual Status Publish(std::string_view routing_key, const Message& message) = 0;
  // Publishes every element (routing key: its destination, else
  // Options::queue) as Publish does, all at once on the confirm channel,
  // then reads the confirms (basic.ack / basic.nack, `multiple` included)
  // and maps them to the elements by delivery tag: one round trip for the
  // batch. A non-empty key becomes the string header idem-ordering-key.
  // Per element: OK; kInvalidArgument (as Publish, and an empty id or no
  // destination); kRejected when the broker returned it as unroutable
  // (mandatory: no queue takes its routing key); kUnavailable when nacked or
  // never sent; kInDoubt when sent and then the channel or the connection
  // was lost or no confirm came in time (the next call reconnects).
  // traits(): not ordered, max_batch 500. Channel(): Options::queue.
  std::vector<Status> PublishBatch(std::span<const Outgoing> batch) override = 0;
  std::string_view Kind() const override { return "amqp"; }
};

}  // namespace idem::amqp

#endif  // IDEM_AMQP_PUBLISHER_H_
