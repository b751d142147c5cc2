// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: one AWS service spoken over its JSON protocol (SQS, DynamoDB):
// where the credentials and the region come from (the SDKs' order), and a
// client that signs each call (Signature Version 4, src/aws/sigv4.h), sends
// it over idem's keep-alive connections (src/http/pool.h), retries what a
// retry can mend, and hands back the answer or the service's error.
//
// No error text carries a secret key, a session token or a signature.
//
// Thread safety: a JsonClient may be shared by any number of threads.
#ifndef IDEM_SRC_AWS_CLIENT_H_
#define IDEM_SRC_AWS_CLIENT_H_

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "aws/sigv4.h"
#include "idem/env.h"
#include "idem/result.h"
#include "idem/status.h"

namespace idem::aws_internal {

// Where to look for credentials and the region, as the AWS SDKs do.
struct CredentialQuery {
  // Given in the URL or the options: used as they are when the key id is set
  // (the secret must be too).
  Credentials given;
  // The shared files' profile: this, else $AWS_PROFILE, else "default".
  std::string profile;
  // The files: these, else $AWS_SHARED_CREDENTIALS_FILE / $AWS_CONFIG_FILE,
  // else ~/.aws/credentials and ~/.aws/config.
  std::string credentials_file;
  std::string config_file;
};

// The first source that has them: `given`; the environment
// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN); the profile
// in the shared credentials file, then in the config file.
// kInvalidArgument when a source has a key id without its secret (named,
// with where it was found), kNotFound when none has any (the message lists
// where it looked).
Result<Credentials> FindCredentials(const CredentialQuery& query);

// `given`, else $AWS_REGION, else $AWS_DEFAULT_REGION, else the profile's
// `region` in the config file. kNotFound (saying where it looked) when none;
// kInvalidArgument for a region that is not lowercase letters, digits and
// dashes.
Result<std::string> FindRegion(std::string_view given, const CredentialQuery& query);

// One service's JSON protocol.
struct Service {
  std::string signing_name;   // "sqs", "dynamodb": the SigV4 scope's service, and the default host's prefix
  std::string target_prefix;  // "AmazonSQS", "DynamoDB_20120810": X-Amz-Target is "<prefix>.<Operation>"
  std::string content_type;   // "application/x-amz-json-1.0"
};

struct ClientOptions {
  std::string region;  // required
  // "http://127.0.0.1:4566" (an emulator) or "https://..." (a VPC endpoint);
  // empty: https://<signing_name>.<region>.amazonaws.com.
  std::string endpoint;
  Credentials credentials;  // required (FindCredentials)
  std::string ca_file;      // https: the CAs (default: the system's)
  int64_t connect_timeout_ms = 2'000;
  // A call unanswered within this (plus a long poll's own wait) is a lost
  // answer: retried, and in doubt if the tries run out.
  int64_t read_timeout_ms = 10'000;
  int pool_size = 16;
  // Tries per call, the first included, for throttling, 5xx and transport
  // failures; backoff base * 2^(n-1), at most max, plus jitter.
  int max_attempts = 5;
  int64_t backoff_base_ms = 50;
  int64_t backoff_max_ms = 2'000;
  Env* env = nullptr;  // clock (request dates), sleeps, jitter; default Env::Default()
};

// The service's answer to a call that failed.
struct ServiceError {
  int http_status = 0;
  // The error's type without its namespace: "ThrottlingException",
  // "ConditionalCheckFailedException", "QueueDoesNotExist",
  // "TransactionCanceledException".
  std::string type;
  std::string message;
  nlohmann::json body;  // the whole error document (CancellationReasons, ...)
};

// What a call returns: the 2xx answer's JSON, or the service's error.
struct Reply {
  nlohmann::json body;
  std::optional<ServiceError> error;
  int attempts = 0;  // requests sent, the answered one included
};

// Whether a retry can mend the error: throttling (ThrottlingException,
// ProvisionedThroughputExceededException, RequestLimitExceeded,
// TooManyRequestsException, RequestThrottled, ...), 5xx and
// InternalServerError / ServiceUnavailable.
bool Retryable(const ServiceError& e);

// The error as a Status, `what` first ("SQS ReceiveMessage on queue 'q'"):
// throttling → kBusy; a missing queue or table → kNotFound; refused
// credentials or signature, a wrong region → kInvalidArgument (the message
// says which); a 5xx → kUnavailable; anything else → kInvalidArgument with
// the service's type and message.
Status ToStatus(const ServiceError& e, std::string_view what);

class JsonClient {
 public:
  // kInvalidArgument for a bad endpoint URL (named), an empty region or
  // credentials, bad numbers. Connects lazily.
  static Result<std::unique_ptr<JsonClient>> Open(const Service& service, const ClientOptions& options);
  ~JsonClient();

  // POSTs `operation` ("ReceiveMessage") with `input`, signed. Retries
  // Retryable errors and transport failures with backoff, up to
  // max_attempts; a 2xx's body (or {} for an empty one) is Reply::body, any
  // other error (or the last retryable one) is Reply::error. Status errors
  // only when no answer came: kUnavailable (no attempt reached the server),
  // kInDoubt (an attempt was sent and not answered: it may have been
  // applied), kAborted (StopRequested on this thread, idem/consumer.h).
  // `extra_wait_ms`: added to the read timeout (a long poll's wait).
  Result<Reply> Call(std::string_view operation, const nlohmann::json& input, int64_t extra_wait_ms = 0);

  // The endpoint calls go to ("http://127.0.0.1:4566"), for messages.
  const std::string& endpoint() const;
  const std::string& region() const;

 private:
  struct Impl;
  explicit JsonClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::aws_internal

#endif  // IDEM_SRC_AWS_CLIENT_H_
