// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::sqs::Source: an Amazon SQS queue (standard or FIFO) as a Source,
// over SQS's JSON protocol (AmazonSQS.ReceiveMessage, ..., signed with
// Signature Version 4; no AWS SDK needed).
//
//   auto src = idem::sqs::Source::Open({.queue = "payments", .connect = {.region = "eu-west-1"}});
//   if (!src.ok()) return src.status();
//   idem::Consumer consumer(**src, inbox, handler);
//
// What a delivery is (the wire format: doc/wire-format.md, doc/sources.md):
//   - message.id is the message attribute Options::id_attribute ("idem-id",
//     String, or Binary for an id that is not text), which the Publisher
//     (idem/sqs/publisher.h) sets. A message without it gets SQS's own
//     MessageId when Options::message_id_fallback is set (the default):
//     that id is stable across redeliveries, but two SendMessage calls of
//     one fact (a producer retry) get two MessageIds, so the Inbox catches
//     only the redeliveries. Without the fallback such a message gets an
//     empty id and a header "idem-error" (the Consumer dead-letters it).
//   - message.attempt is SQS's ApproximateReceiveCount (1, 2, ...).
//   - message.producer_time_ms is the attribute "idem-producer-time-ms".
//   - message.headers are the published headers (the attribute
//     "idem-headers"), then every other message attribute under its own
//     name (a producer that is not idem's).
//   - message.payload is the body, or its base64 decoding when the
//     attribute "idem-body" says "base64" (a payload that is not valid SQS
//     text, or empty).
//   - The receipt is SQS's receipt handle of this receive.
//
// Leases: the visibility timeout is the lease. Receive asks for
// VisibilityTimeout = Options::lease_ms (whole seconds); ExtendLease sets it
// again from now (ChangeMessageVisibility), so the Consumer's lease keeper
// holds a message whose handler runs long; kLeaseLost when SQS says the
// receipt handle is no longer valid (the message was received again, or
// deleted). Nack is ChangeMessageVisibility to the delay (whole seconds,
// rounded up, at most 12 hours): the message comes back after it.
//
// Ack is DeleteMessage with the delivery's receipt handle. SQS answers a
// delete with an outdated handle (the message was received again since) with
// success and may leave the message in the queue: so Ack is OK in that case
// too, the message comes again, and the Inbox finds its marker. Ack never
// reports kLeaseLost unless SQS does. AckBatch sends DeleteMessageBatch calls
// of up to 10; single Acks go out as they come, up to 4 calls at once, and
// those that arrive meanwhile go together in one DeleteMessageBatch.
//
// Horizon() is Unknown: SQS tells the age of the oldest message only through
// CloudWatch. A message lives at most the queue's MessageRetentionPeriod
// (4 days by default, at most 14): keep markers at least that long
// (retention_period_ms() reads it at Open).
//
// Thread safety: Receive, Ack, Nack and ExtendLease may be called from many
// threads at once (a pool of keep-alive connections).
#ifndef IDEM_SQS_SOURCE_H_
#define IDEM_SQS_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "idem/env.h"
#include "idem/result.h"
#include "idem/source.h"
#include "idem/sqs/connect.h"
#include "idem/status.h"

// The producer's end (sqs::Publisher), opened by the same URL.
#include "idem/sqs/publisher.h"  // IWYU pragma: export

namespace idem::sqs {

class Source : public ::idem::Source {
 public:
  struct Options {
    // The queue: its name ("payments", "payments.fifo"), or its URL
    // ("https://sqs.eu-west-1.amazonaws.com/123456789012/payments").
    // Required. Open looks a name up (GetQueueUrl): a missing queue is
    // kNotFound at Open.
    std::string queue{};
    // Where SQS is and who calls it (idem/sqs/connect.h).
    ConnectOptions connect{};
    // Create the queue (a name; ".fifo": a FIFO queue, with SQS's default
    // attributes) when it does not exist, instead of kNotFound: for demos
    // and tests. Default: false.
    bool create_queue = false;
    // The message attribute that holds the message id. Default: "idem-id".
    std::string id_attribute = "idem-id";
    // A message without the id attribute gets SQS's MessageId as its id
    // (see above). false: an empty id (dead-lettered). Default: true.
    bool message_id_fallback = true;
    // The visibility timeout each Receive asks for, in ms: whole seconds,
    // 1000 .. 43200000 (12 hours). Default: 30000.
    int64_t lease_ms = 30'000;
  };

  // Checks the options, finds the credentials and the region, and looks the
  // queue up. kInvalidArgument (bad options, no or refused credentials, a
  // bad region), kNotFound (no such queue in that region and account),
  // kUnavailable (the endpoint does not answer), kBusy (throttled through
  // every retry).
  static Result<std::unique_ptr<Source>> Open(const Options& options);
  // Parses "sqs://QUEUE[?region=R][&endpoint=URL][&profile=P][&create_queue=B]
  // [&id_attribute=A][&message_id_fallback=B][&lease_ms=N]
  // [&connect_timeout_ms=N][&read_timeout_ms=N][&max_attempts=N]
  // [&pool_size=N]", or "sqs://?queue_url=URL&..." for a queue given by its
  // URL. The keys only a publisher uses (group_id, deduplicate_by_id) are
  // checked and ignored. Credentials are never in the URL: they come from
  // the environment or the shared files (ConnectOptions, idem/sqs/connect.h). kInvalidArgument
  // for another scheme, no queue, an unknown key or a bad value.
  static Result<Options> ParseUrl(std::string_view url);

  // The queue's URL (GetQueueUrl's answer) and whether it is a FIFO queue.
  virtual const std::string& queue_url() const = 0;
  virtual bool fifo() const = 0;
  // The queue's MessageRetentionPeriod in ms, read at Open: the longest a
  // message stays in the queue, so the shortest marker retention that
  // covers every redelivery.
  virtual int64_t retention_period_ms() const = 0;
  std::string_view Kind() const override { return "sqs"; }
};

}  // namespace idem::sqs

#endif  // IDEM_SQS_SOURCE_H_
