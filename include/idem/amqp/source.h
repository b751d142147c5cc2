// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::amqp: RabbitMQ (AMQP 0-9-1, rabbitmq-c) as an idem::Source. Its
// producer's end, with publisher confirms, is amqp::Publisher
// (idem/amqp/publisher.h, included here).
//
//   auto src = idem::amqp::Source::Open({.url = "amqp://idem:secret@127.0.0.1:5672/%2f",
//                                        .queue = "payments", .prefetch = 50});
//   auto consumer = idem::Consumer::Open(**src, inbox, handler, {.workers = 4});
//   consumer.Run();
//
// What RabbitMQ gives and what idem makes of it:
//   - Manual acknowledgements: a delivery stays unacknowledged until Ack, so
//     a consumer that dies (or whose connection drops) before it acks has its
//     deliveries requeued by the broker and delivered again, maybe to another
//     consumer. Ack only after the commit (the Consumer does).
//   - basic.qos prefetch bounds the unacknowledged deliveries per Source.
//   - The message id is the AMQP message-id property; when a message has
//     none, the header named by `id_header` (if set); with neither, the
//     delivery carries an empty (invalid) id, which the Consumer sends to the
//     dead-letter path at once (and acks).
//   - Message::attempt is 1, or 2 when the broker set `redelivered` (on
//     quorum queues: x-delivery-count + 1). It is a HINT only: a first
//     delivery may be a duplicate too (a producer retry, a publish confirmed
//     twice), so the Inbox's marker check runs on every delivery, redelivered
//     or not.
//   - The receipt names the delivery tag AND the connection it came on. After
//     a reconnect the broker has requeued every delivery of the old
//     connection: acking one gives Code::kLeaseLost (harmless after a commit:
//     the redelivery finds the marker). A basic.ack is not confirmed by the
//     broker: if the connection drops just after it, the message may come
//     again, and the Inbox absorbs it.
//   - Optional leases (lease_ms): a delivery held too long is given back.
//     lease_ms() is Options::lease_ms (0 by default: no lease, a
//     delivery stays ours until acked or the connection closes, and
//     ExtendLease is OK with nothing to renew). With a lease, ExtendLease
//     moves the delivery's lease end to now + lease_ms (env's clock), or is
//     kLeaseLost when the delivery was settled, its lease ran out (it is
//     given back first, as for an Ack), or its connection is gone.
//   - The broker's own limit, consumer_timeout (RabbitMQ 3.8.15 and later;
//     30 min by default, in rabbitmq.conf; per queue with the
//     x-consumer-timeout argument or a consumer-timeout policy only from
//     RabbitMQ 3.12): a delivery left unacknowledged longer than that makes
//     the broker close the channel (406 PRECONDITION_FAILED, "delivery
//     acknowledgement on channel 1 timed out"), which is the source's only
//     channel, so every unacknowledged delivery of the connection is
//     requeued, not only the late one. The next call notices, every receipt
//     of that connection then gives kLeaseLost, and the next Receive
//     reconnects. Nothing in AMQP 0-9-1 resets that timer: ExtendLease
//     renews idem's lease only, never the broker's. So a handler must finish
//     (and ack) within consumer_timeout, or the broker's consumer_timeout
//     must be raised for the queue; the broker checks it about once a
//     minute, so a delivery may live a little longer than the timeout.
//   - Nack(delay) is basic.nack with requeue=true. RabbitMQ requeues at once,
//     so the Source honours the delay itself: the delivery is held
//     (unacknowledged, counting against the prefetch) and nacked by the first
//     Receive/Ack/Nack call after the delay ran out (delays are capped by
//     `max_nack_delay_ms`). If the connection drops meanwhile, the broker
//     requeues it anyway.
//   - A lost connection (broker restart, network) is noticed by the call that
//     meets it; the next Receive reconnects (redeclaring the queue, qos and
//     consumer). Until the broker is back, Receive returns kUnavailable.
//   - Producer time travels in the header "idem-producer-time-ms" (and,
//     rounded to seconds, in the timestamp property); the former names
//     "idem-produced-at-ms" and "producer_time_ms" are read too
//     (doc/wire-format.md). Neither they nor x-delivery-count are repeated
//     in Message::headers.
//   - Known limit (rabbitmq-c 0.11): a message whose headers hold an empty
//     name fails to decode, which drops the consumer's connection; the
//     message is requeued and fails again (it never reaches the dead-letter
//     path). Publisher refuses such headers; other producers must too.
//
// Thread safety: a Source or a Publisher may be used from many threads; each
// holds one connection behind a mutex (rabbitmq-c connections are not
// thread-safe). A Receive waiting for messages does not hold the mutex while
// it waits, so Acks from other workers are not delayed by it.
#ifndef IDEM_AMQP_SOURCE_H_
#define IDEM_AMQP_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "idem/env.h"
#include "idem/message.h"
#include "idem/publisher.h"
#include "idem/result.h"
#include "idem/source.h"
#include "idem/status.h"

namespace idem::amqp {

// The header that carries Message::producer_time_ms (a signed 64-bit
// integer): idem::kProducerTimeHeader, as on every broker.
using ::idem::kProducerTimeHeader;

// A parsed "amqp://user:password@host:port/vhost" (percent-escapes decoded;
// "/%2f" or no path is the vhost "/"). Defaults: guest:guest, port 5672.
struct Endpoint {
  std::string host{};
  int port = 5672;
  std::string user{};
  std::string password{};
  std::string vhost = "/";
  // "host:port" (what error messages name; never the password).
  std::string Where() const;
};
// kInvalidArgument naming what is wrong (never echoing the password).
Result<Endpoint> ParseUrl(std::string_view url);

class Source : public idem::Source {
 public:
  struct Options {
    // "amqp://user:password@host:port/vhost". Required. amqps is not supported.
    std::string url{};
    // The queue to consume from. Required.
    std::string queue{};
    // basic.qos prefetch count: unacknowledged deliveries at most. 1..65535.
    // Default: 100.
    int prefetch = 100;
    // When a message has no message-id property, take the id from this header
    // (a string or integer value). Empty: no fallback. Default: empty.
    std::string id_header{};
    // Declare the queue (durable, not exclusive, not auto-delete) on every
    // connect. Off for a queue that someone else declares with other
    // arguments. Default: true.
    bool declare_queue = true;
    // With declare_queue: "classic" or "quorum" (x-queue-type). Quorum queues
    // count deliveries (x-delivery-count), so Message::attempt is exact there
    // (1, 2, 3, ...) instead of the redelivered hint (1 or 2). Default: classic.
    std::string queue_type = "classic";
    // A lease on each delivery, like a visibility timeout: a delivery neither
    // acked nor nacked within lease_ms (on env's clock) is given back
    // (basic.nack, requeue) by the first call after that, and its receipt then
    // gives kLeaseLost; ExtendLease renews it. 0: no lease; a delivery stays
    // ours until the connection closes (RabbitMQ's own consumer_timeout, 30
    // min by default, then closes the channel: see above). Default: 0.
    int64_t lease_ms = 0;
    // AMQP heartbeat in ms, sent to the broker in whole seconds (rounded
    // up); 0: off; at most 65535000. rabbitmq-c answers heartbeats only
    // inside calls: if no Receive/Ack/Nack runs for 2 x heartbeat_ms (every
    // worker stuck in a slow handler), the broker drops the connection and
    // requeues its deliveries (absorbed by the Inbox). Default: 30000.
    int64_t heartbeat_ms = 30'000;
    // Connect (TCP and AMQP handshake) and RPC timeout, in ms (values below
    // 1 are taken as 5000). Default: 5000.
    int64_t connect_timeout_ms = 5'000;
    // Longest delay a Nack holds a delivery for, in ms. Default: 60000.
    int64_t max_nack_delay_ms = 60'000;
    // Clock for leases, nack delays and Receive's wait. With the real clock
    // Receive waits on the socket; with another Env (a FakeEnv in tests) it
    // waits by env->SleepMs in 50 ms steps, looking at the socket for up to
    // 5 ms of real time per step. Default: Env::Default().
    Env* env = nullptr;
  };

  // Connects, declares the queue (if asked) and sets the prefetch.
  // kInvalidArgument for bad options, kUnavailable when the broker cannot be
  // reached or refuses the login or the queue. Consuming (basic.consume)
  // starts at the first Receive on each connection: RabbitMQ pushes up to
  // the prefetch to every consumer, so a Source never asked for messages
  // takes none.
  static Result<std::unique_ptr<Source>> Open(const Options& options);
  // Parses "amqp://USER:PASS@HOST[:PORT]/VHOST?queue=Q[&id_header=H]
  // [&prefetch=N][&lease_ms=N][&queue_type=classic|quorum][&declare_queue=B]
  // [&heartbeat_ms=N][&connect_timeout_ms=N][&max_nack_delay_ms=N]":
  // Options::url is the URL without its query. kInvalidArgument for a bad
  // URL (password hidden), no queue, an unknown key or a bad value.
  static Result<Options> ParseUrl(std::string_view url);

  // Closing the connection makes the broker requeue every unacknowledged
  // delivery (with redelivered set).
  ~Source() override = default;

  // Drops the connection (the broker requeues its unacknowledged deliveries)
  // and opens a new one. Receipts of the old connection give kLeaseLost.
  virtual Status Reconnect() = 0;
  // Connections opened so far (1 after Open; +1 per reconnect).
  virtual uint64_t generation() const = 0;

  std::string_view Kind() const override { return "amqp"; }
};

}  // namespace idem::amqp

#include "idem/amqp/publisher.h"  // IWYU pragma: export

#endif  // IDEM_AMQP_SOURCE_H_
