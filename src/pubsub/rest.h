// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: Google Cloud Pub/Sub's REST API (v1) for idem::pubsub: where
// calls go (an endpoint= key, else $PUBSUB_EMULATOR_HOST, else
// https://pubsub.googleapis.com), the bearer access token the real service
// needs, and one caller that sends a JSON request over idem's keep-alive
// connections (src/http/pool.h), retries what a retry can mend (HTTP 429,
// 5xx, UNAVAILABLE, RESOURCE_EXHAUSTED, transport failures) with the backoff
// of src/core/backoff.h, and hands back the answer or the service's error
// (google.rpc.Status: {"error": {"code", "message", "status"}}).
//
// No error text carries the access token.
//
// Thread safety: a RestClient may be shared by any number of threads.
#ifndef IDEM_SRC_PUBSUB_REST_H_
#define IDEM_SRC_PUBSUB_REST_H_

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "idem/env.h"
#include "idem/result.h"
#include "idem/status.h"

namespace idem::pubsub_internal {

// The real service's endpoint.
inline constexpr std::string_view kServiceEndpoint = "https://pubsub.googleapis.com";

struct Endpoint {
  std::string url;     // "http://127.0.0.1:8085" or "https://pubsub.googleapis.com"
  std::string bearer;  // the access token ("" for an emulator)
  std::string where;   // where the URL came from, for messages
};

// Where calls go and with which token, as Google's client libraries decide:
// `endpoint` (the URL's endpoint= key or Options::endpoint), else
// $PUBSUB_EMULATOR_HOST ("host:port", plain HTTP, no token), else the real
// service, which needs an access token: `token`, else the first line of
// `token_file`, else $GOOGLE_OAUTH_ACCESS_TOKEN, else the first line of the
// file named by $GOOGLE_OAUTH_ACCESS_TOKEN_FILE. A token given with an
// explicit endpoint is sent there too. kInvalidArgument when the real
// service is meant and no token is found (the message says where it looked
// and that service-account keys are not exchanged here), or a token file
// cannot be read.
Result<Endpoint> FindEndpoint(std::string_view endpoint, std::string_view token, std::string_view token_file);

struct RestOptions {
  Endpoint endpoint;
  std::string ca_file;  // https: the CAs (default: the system's)
  int64_t connect_timeout_ms = 2'000;
  int64_t read_timeout_ms = 10'000;
  int pool_size = 16;
  // Tries per call, the first included, for retryable answers and transport
  // failures; backoff base * 2^(n-1), at most max, plus jitter.
  int max_attempts = 5;
  int64_t backoff_base_ms = 50;
  int64_t backoff_max_ms = 2'000;
  Env* env = nullptr;  // sleeps, jitter; default Env::Default()
};

// The service's answer to a call that failed (google.rpc.Status).
struct RestError {
  int http_status = 0;
  std::string status;  // "NOT_FOUND", "INVALID_ARGUMENT", ... ("" when the body had none)
  std::string message;
};

struct RestReply {
  nlohmann::json body;  // the 2xx answer ({} for an empty one)
  std::optional<RestError> error;
  int attempts = 0;
};

// HTTP 429 or 5xx, or status UNAVAILABLE, RESOURCE_EXHAUSTED, INTERNAL,
// ABORTED, DEADLINE_EXCEEDED.
bool Retryable(const RestError& e);

// The error as a Status, `what` first ("Pub/Sub pull from subscription 'S'"):
// NOT_FOUND → kNotFound; throttling (429, RESOURCE_EXHAUSTED) → kBusy;
// UNAUTHENTICATED / PERMISSION_DENIED → kInvalidArgument saying the token was
// refused; 5xx / UNAVAILABLE → kUnavailable; anything else → kInvalidArgument
// with the service's status and message.
Status ToStatus(const RestError& e, std::string_view what);

class RestClient {
 public:
  // kInvalidArgument for a bad endpoint URL or bad numbers. Connects lazily.
  static Result<std::unique_ptr<RestClient>> Open(const RestOptions& options);
  ~RestClient();

  // Sends `method` ("GET", "PUT", "POST", "DELETE") to `path` (below the
  // endpoint, e.g. "/v1/projects/P/subscriptions/S:pull") with `body` as
  // JSON (none for GET and DELETE). Retries Retryable errors and transport
  // failures up to max_attempts. Status errors only when no answer came:
  // kUnavailable (no attempt reached the server), kInDoubt (an attempt was
  // sent and not answered), kAborted (StopRequested on this thread).
  Result<RestReply> Call(std::string_view method, const std::string& path, const nlohmann::json* body = nullptr);

  // The endpoint calls go to, for messages (never the token).
  const std::string& endpoint() const;

 private:
  struct Impl;
  explicit RestClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::pubsub_internal

#endif  // IDEM_SRC_PUBSUB_REST_H_
