// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::sqs::Publisher: the producer's end of an SQS queue (standard or
// FIFO), opened by the URL of sqs::Source (idem/sqs/source.h).
//
//   auto pub = idem::sqs::Publisher::Open({.queue = "payments"});
//   (*pub)->Publish(message);
//
// Each message is one SQS message (SendMessage; PublishBatch sends
// SendMessageBatch calls of up to 10): the payload as the body (base64 with
// the attribute "idem-body" = "base64" when it is not valid SQS text or is
// empty), and the message attributes
//   <id_attribute>          the message id (String; Binary when not text)
//   idem-producer-time-ms   Number, when the message has a producer time
//   idem-headers            Binary, the headers in order (when any)
// (doc/wire-format.md). On a FIFO queue ("*.fifo") also:
//   MessageDeduplicationId  from the message id (deduplicate_by_id): SQS
//                           drops a copy sent again within its 5-minute
//                           window (a producer retry); the Inbox catches
//                           the later ones
//   MessageGroupId          the Outgoing's key, else the message's header
//                           "idem-ordering-key", else Options::group_id,
//                           else a new random group per message (no order
//                           between messages)
//
// Publish returns once SQS answered: OK (stored); an error may or may not
// have stored it (kInDoubt when no answer came): publish again.
//
// Thread safety: Publish and PublishBatch may be called from many threads.
#ifndef IDEM_SQS_PUBLISHER_H_
#define IDEM_SQS_PUBLISHER_H_

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/message.h"
#include "idem/publisher.h"
#include "idem/result.h"
#include "idem/sqs/connect.h"
#include "idem/status.h"

namespace idem::sqs {

class Publisher : public ::idem::Publisher {
 public:
  struct Options {
    // The queue Publish writes to: a name or a queue URL (as
    // Source::Options::queue), looked up at Open. Empty: Publish is
    // kInvalidArgument and PublishBatch needs a destination per message.
    std::string queue{};
    ConnectOptions connect{};
    // As Source::Options::create_queue (for Options::queue). Default: false.
    bool create_queue = false;
    // The message attribute that carries the message id. Default: "idem-id".
    std::string id_attribute = "idem-id";
    // FIFO: the MessageGroupId of a message with no ordering key. Empty: a
    // new random group per message. Default: empty.
    std::string group_id{};
    // FIFO: the MessageDeduplicationId is the message id (the id itself
    // when it is 1-128 printable ASCII characters, else "sha256~" and the
    // hex of its SHA-256). false: a random one per send, so SQS stores every
    // copy (the Inbox still drops the repeats). Default: true.
    bool deduplicate_by_id = true;
  };

  // kInvalidArgument (bad options, credentials, region), kNotFound (no such
  // queue), kUnavailable, kBusy: as Source::Open.
  static Result<std::unique_ptr<Publisher>> Open(const Options& options);
  // Reads the URL of Source::ParseUrl: queue, create_queue, the connection keys,
  // id_attribute, group_id, deduplicate_by_id; the keys only a consumer uses
  // are checked and ignored.
  static Result<Options> ParseUrl(std::string_view url);

  // One SendMessage. kInvalidArgument for a message SQS cannot carry (an
  // invalid id, too large) or no queue; kRejected when SQS refuses it.
  Status Publish(const Message& message) override = 0;
  // SendMessageBatch calls of up to 10 entries per destination (a name or
  // a URL, looked up once and kept), each element answered by its own
  // entry's result. traits(): ordered_batch false, max_batch 1000 (split into calls of 10). Channel():
  // the queue of the options.
  std::vector<Status> PublishBatch(std::span<const Outgoing> batch) override = 0;
  std::string_view Kind() const override { return "sqs"; }
};

}  // namespace idem::sqs

#endif  // IDEM_SQS_PUBLISHER_H_
