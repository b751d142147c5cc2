// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::pubsub::Source: a Google Cloud Pub/Sub pull subscription as a Source,
// over Pub/Sub's REST API (v1): projects.subscriptions.pull, acknowledge and
// modifyAckDeadline. No Google client library is needed.
//
//   auto src = idem::pubsub::Source::Open({.project = "shop", .subscription = "payments",
//                                          .endpoint = "http://127.0.0.1:8085"});
//   idem::Consumer consumer(**src, inbox, handler);
//
// Or by URL (OpenSource, the CLI):
//   pubsub://PROJECT/SUBSCRIPTION?endpoint=http://127.0.0.1:8085
// doc/sources.md lists every key.
//
// Where calls go: Options::endpoint, else $PUBSUB_EMULATOR_HOST (as Google's
// clients do; plain HTTP, no token), else https://pubsub.googleapis.com with
// an OAuth 2.0 access token (Options::access_token or token_file, else
// $GOOGLE_OAUTH_ACCESS_TOKEN or the file named by
// $GOOGLE_OAUTH_ACCESS_TOKEN_FILE). Service-account keys are not exchanged
// for tokens here: give a token (`gcloud auth print-access-token`, or the
// metadata server's). The token is never printed.
//
// The message: its id is the attribute Options::id_attribute ("idem-id",
// which idem::pubsub::Publisher sets), so a producer that publishes one
// fact twice (two Pub/Sub messages) is caught by the Inbox. A message
// without it gets Pub/Sub's messageId when Options::id_fallback is on (the
// default): a redelivery of that message keeps it, but a producer's retry
// has another, so only the attribute catches producer retries. With
// id_fallback off, or an id that is not valid (idem::ValidateId), the
// delivery has an empty id and a header "idem-error" saying why, so the
// Consumer dead-letters it and acknowledges it; it is never dropped
// silently. The payload is the message's data (base64 on the wire; data
// that does not decode is such an error too). The attribute
// idem-producer-time-ms is the producer time; every other attribute is a
// header (attributes are a map: sorted by name, one value per name), and a
// message's orderingKey is the header idem-ordering-key.
//
// Leases: the subscription's acknowledgement deadline is the lease
// (lease_ms(), read from the subscription at Open). ExtendLease sets the
// deadline of the delivery's ack id to that again (modifyAckDeadline); Nack
// sets it to the delay, rounded up to whole seconds and at most 600 s (0:
// redelivered now); Ack is acknowledge. Message.attempt is Pub/Sub's
// deliveryAttempt, which the service counts only on a subscription with a
// dead-letter policy; elsewhere it is 0 (unknown): give the subscription a
// dead-letter policy (max_delivery_attempts up to 100) for the Consumer's
// backoff and dead-letter bookkeeping to see attempts.
//
// Exactly-once delivery subscriptions (enableExactlyOnceDelivery): an ack,
// extension or nack with an ack id that expired (its message was delivered
// again) fails, and is kLeaseLost here: the message comes back, and the
// Inbox absorbs the copy. On other subscriptions the service accepts such
// calls and they may do nothing (acks are best effort): a message acked
// after its deadline may come again, which the Inbox absorbs too. kLeaseLost
// is reported when the service refuses the ack id (HTTP 400
// INVALID_ARGUMENT on a call naming that one id).
//
// Acks are batched on subscriptions without exactly-once delivery (see
// Options::batch_acks).
//
// Waiting: Receive pulls with returnImmediately, and while nothing comes
// and wait_ms has not run out, pulls again every poll_ms.
//
// Thread safety: a Source may be used from many threads (a pool of
// connections).
#ifndef IDEM_PUBSUB_SOURCE_H_
#define IDEM_PUBSUB_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "idem/env.h"
#include "idem/result.h"
#include "idem/source.h"

namespace idem::pubsub {

// The header a malformed message is delivered with (its id empty).
inline constexpr std::string_view kErrorHeader = "idem-error";
// The attribute the message id is carried in by default.
inline constexpr std::string_view kDefaultIdAttribute = "idem-id";

// What both the Source and the Publisher are opened with.
struct Connection {
  // The Google Cloud project id. Required.
  std::string project{};
  // "http://127.0.0.1:8085" (an emulator) or "https://..."; empty:
  // $PUBSUB_EMULATOR_HOST, else https://pubsub.googleapis.com.
  std::string endpoint{};
  // The OAuth 2.0 access token for the real service; or token_file, a file
  // whose first line is one (read at Open). Neither: the environment (see
  // the header comment).
  std::string access_token{};
  std::string token_file{};
  // https: the CAs trusted (default: the system's).
  std::string ca_file{};
  // Per call: connect and answer timeouts, tries (retries of 429, 5xx,
  // UNAVAILABLE and transport failures, with backoff), idle connections kept.
  int64_t connect_timeout_ms = 2'000;
  int64_t read_timeout_ms = 10'000;
  int max_attempts = 5;
  int pool_size = 16;
};

class Source : public idem::Source {
 public:
  struct Options {
    Connection connection{};
    // The subscription's id (not its full name). Required.
    std::string subscription{};
    // The attribute holding the message id. Default: "idem-id".
    std::string id_attribute = std::string(kDefaultIdAttribute);
    // Use Pub/Sub's messageId when the attribute is missing. Default: true.
    bool id_fallback = true;
    // Pause between pulls while Receive waits, in ms (>= 1). Default: 100.
    int64_t poll_ms = 100;
    // On a subscription without exactly-once delivery: Ack queues the ack
    // id and returns OK, and the queued ids go in one acknowledge call (up
    // to 1000 ids each) before the next pull, nack or extension of this
    // handle, at Flush() and at destruction, as Google's client libraries
    // batch acks. Such a subscription accepts any ack id, so a synchronous
    // ack would say no more; a batch that fails (or a crash before it) only
    // means redeliveries, which the Inbox absorbs. On an exactly-once
    // subscription every Ack is its own call, so that an expired ack id is
    // reported (kLeaseLost). false: every Ack is its own call. Default: true.
    bool batch_acks = true;
    // Create the subscription at Open when it does not exist (and the
    // topic, when that does not either), with the settings below. Default:
    // false (a missing subscription is kNotFound).
    bool create = false;
    // For create: the topic's id (required then), the acknowledgement
    // deadline (lease_ms, whole seconds 10..600 s), exactly-once delivery,
    // message ordering, and a dead-letter topic (its id; created too) with
    // the delivery attempts (5..100) after which the service moves a
    // message there (this is what makes the service count attempts).
    std::string topic{};
    int64_t lease_ms = 30'000;
    bool exactly_once = false;
    bool ordering = false;
    std::string dead_letter_topic{};
    int max_delivery_attempts = 100;
    // Sleeps between retries and waits; default (nullptr): Env::Default().
    // Leases are the service's clock, never this one.
    Env* env = nullptr;
  };

  // Reads the subscription (its acknowledgement deadline), creating it with
  // `create`. Errors: kInvalidArgument (empty project or subscription, bad
  // endpoint or numbers, no token for the real service, a refused token),
  // kNotFound (no such subscription, or topic with create), kUnavailable /
  // kInDoubt (the service was not reached or did not answer).
  static Result<std::unique_ptr<Source>> Open(const Options& options);
  // Parses "pubsub://PROJECT/SUBSCRIPTION[?endpoint=URL][&topic=T]
  // [&token_file=PATH][&ca_file=PATH][&id_attribute=A][&id_fallback=B]
  // [&poll_ms=N][&batch_acks=B][&create=B][&lease_ms=N][&exactly_once=B][&ordering=B]
  // [&dead_letter_topic=T][&max_delivery_attempts=N][&connect_timeout_ms=N]
  // [&read_timeout_ms=N][&max_attempts=N][&pool_size=N]". The same URL with
  // topic= also opens a Publisher onto that topic. kInvalidArgument for
  // another scheme, no project or subscription, an unknown key or a bad value.
  static Result<Options> ParseUrl(std::string_view url);

  // "projects/P/subscriptions/S".
  virtual const std::string& name() const = 0;
  // Whether the subscription has exactly-once delivery (read at Open).
  virtual bool exactly_once() const = 0;
  // Sends the acks queued by batch_acks now. Errors are the acknowledge
  // call's; the ids are not kept (their messages come again).
  virtual Status Flush() = 0;
  std::string_view Kind() const override { return "pubsub"; }
};

}  // namespace idem::pubsub

#endif  // IDEM_PUBSUB_SOURCE_H_
