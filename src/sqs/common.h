// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: what idem::sqs::Source and Publisher share: the client of the
// SQS JSON protocol (src/aws/client.h) opened from ConnectOptions, the
// queue lookup, the URL's keys, the wire format of a message (its body and
// message attributes) and the one table that turns SQS's errors into
// Statuses.
#ifndef IDEM_SRC_SQS_COMMON_H_
#define IDEM_SRC_SQS_COMMON_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "aws/client.h"
#include "idem/message.h"
#include "idem/result.h"
#include "idem/sqs/connect.h"
#include "idem/status.h"
#include "idem/url.h"

namespace idem::sqs_internal {

// The attributes of the wire format (doc/wire-format.md).
inline constexpr std::string_view kHeadersAttribute = "idem-headers";
inline constexpr std::string_view kBodyAttribute = "idem-body";
inline constexpr std::string_view kErrorHeader = "idem-error";
// SQS's limits.
inline constexpr int kMaxBatch = 10;
inline constexpr int64_t kMaxVisibilitySeconds = 43'200;
inline constexpr int kMaxWaitSeconds = 20;

// A queue, as Open found it.
struct Queue {
  std::string name;
  std::string url;
  bool fifo = false;
  int64_t retention_ms = 0;
};

// The client and the queue of an open Source or Publisher.
struct Connection {
  std::unique_ptr<aws_internal::JsonClient> client;
  Queue queue;  // empty url: none (a Publisher without a queue)
};

// Finds credentials and region, opens the client and (unless `queue` is
// empty) looks the queue up: GetQueueUrl for a name (kNotFound when it does
// not exist), then GetQueueAttributes (FifoQueue, MessageRetentionPeriod).
// `what` names the caller in errors ("SQS source").
// With `create`, a queue name that does not exist is created (CreateQueue;
// a name ending in ".fifo" makes a FIFO queue) instead.
Result<Connection> Connect(std::string_view what, const sqs::ConnectOptions& options, std::string_view queue,
                           bool create = false);

// Looks a queue (a name or a URL) up with `client`.
Result<Queue> LookUp(aws_internal::JsonClient& client, std::string_view queue, bool create = false);

// One call: the answer's body, or the error as a Status (ToStatus, and
// kLeaseLost for a receipt handle SQS no longer takes, when `receipt_call`).
Result<nlohmann::json> Call(aws_internal::JsonClient& client, std::string_view operation, const nlohmann::json& input,
                            std::string_view what, bool receipt_call = false, int64_t extra_wait_ms = 0);

// Whether SQS's error says a receipt handle is no longer valid (the message
// was received again, or deleted): ReceiptHandleIsInvalid,
// MessageNotInflight, InvalidParameterValue about the ReceiptHandle.
bool IsStaleReceipt(const aws_internal::ServiceError& e);
// The error as a Status (aws_internal::ToStatus, and kLeaseLost for a stale
// receipt when `receipt_call`).
Status ErrorStatus(const aws_internal::ServiceError& e, std::string_view what, bool receipt_call);

// The answer of a batch call (SendMessageBatch, DeleteMessageBatch) whose
// entries had the Ids "0" .. "n-1": per entry OK (Successful), `failed` of
// its error (Failed: Code, Message, SenderFault as a 4xx, else a 5xx), or
// kInDoubt when the answer names it nowhere.
std::vector<Status> BatchStatuses(const nlohmann::json& answer, size_t n, std::string_view what,
                                  const std::function<Status(const aws_internal::ServiceError&)>& failed);

// The URL's keys both ends read ("sqs://QUEUE?..." or "sqs://?queue_url=U"):
// the queue and the connection. `what`: "SQS URL".
struct UrlParts {
  std::string queue;
  bool create_queue = false;
  sqs::ConnectOptions connect;
  ParsedUrl url;
};
Result<UrlParts> ParseSqsUrl(std::string_view url);

// Whether `s` is text SQS carries as it is in a body or a String attribute:
// valid UTF-8 of #x9 #xA #xD #x20-#xD7FF #xE000-#xFFFD #x10000-#x10FFFF.
bool IsSqsText(std::string_view s);

// SendMessage's (and a batch entry's) MessageBody and MessageAttributes for
// `m` (and MessageDeduplicationId / MessageGroupId on a FIFO queue).
// kInvalidArgument for an invalid id.
struct EncodeOptions {
  std::string_view id_attribute;
  bool fifo = false;
  bool deduplicate_by_id = true;
  std::string_view key;       // the ordering key (FIFO: the group)
  std::string_view group_id;  // FIFO: the group when there is no key
};
Result<nlohmann::json> EncodeMessage(const Message& m, const EncodeOptions& o);

// A received message (ReceiveMessage's Messages[i]) as a Message.
Message DecodeMessage(const nlohmann::json& sqs_message, std::string_view id_attribute, bool message_id_fallback);

// Whole seconds for a duration in ms, rounded up, in [0, max_s].
int64_t Seconds(int64_t ms, int64_t max_s);

}  // namespace idem::sqs_internal

#endif  // IDEM_SRC_SQS_COMMON_H_
