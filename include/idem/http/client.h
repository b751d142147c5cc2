// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::http::Client: POST with an Idempotency-Key that stays the same on
// every retry, so the server can recognise the repeat (a consumer passes
// DownstreamKey(message, "charge")). Retries connection errors, timeouts,
// 409 (another request with the key is running), 429 and 5xx, with
// exponential backoff and jitter, honouring Retry-After; never 422 (the key
// was used for another body: a bug in the caller, reported as such).
//
//   auto client = idem::http::Client::Create({.base_url = "http://127.0.0.1:8080", .bearer = "sk_test_1"});
//   auto r = (*client)->Post("/charges", R"({"amount":4000,"currency":"usd"})",
//                            idem::DownstreamKey(message, "charge"));
//   if (r.ok() && r->status == 201) ...   // r->replayed: the server answered from its store
//
// Thread safety: one Client per thread (it keeps one keep-alive connection).
#ifndef IDEM_HTTP_CLIENT_H_
#define IDEM_HTTP_CLIENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "idem/env.h"
#include "idem/result.h"

namespace idem::http {

struct ClientOptions {
  // "http://host:port" (loopback or your network). https is not supported.
  std::string base_url;
  // Sent as "Authorization: Bearer <bearer>" when not empty.
  std::string bearer;
  // Tries per request, the first included. Default: 6.
  int max_attempts = 6;
  // Backoff before retry n: base * 2^(n-1), at most max, plus up to 25%
  // jitter; a longer Retry-After (at most max) wins. Defaults: 50 ms, 2 s.
  int64_t backoff_base_ms = 50;
  int64_t backoff_max_ms = 2'000;
  int64_t connect_timeout_ms = 2'000;
  // A response not read within this is a lost response: retried.
  int64_t read_timeout_ms = 10'000;
  // Clock, sleeps and jitter. Default: Env::Default().
  Env* env = nullptr;
};

struct Response {
  int status = 0;
  std::multimap<std::string, std::string> headers;
  std::string body;
  int attempts = 0;       // requests sent, the answered one included
  bool replayed = false;  // Idempotent-Replayed: true
  // The first value of a header (names compared case-insensitively); "" if absent.
  std::string header(const std::string& name) const;
};

class Client {
 public:
  // kInvalidArgument for a URL that is not http://host[:port].
  static Result<std::unique_ptr<Client>> Create(ClientOptions options);
  ~Client();

  // POSTs `body` with Idempotency-Key `key` (sent as an RFC 8941 sf-string),
  // retrying as above. Returns the first response that is not retried (any
  // 2xx, 3xx or 4xx but 409/429), kConflict for 422, kUnavailable when the
  // tries run out (naming the last error).
  Result<Response> Post(std::string_view path, std::string_view body, std::string_view key,
                        std::string_view content_type = "application/json");
  // A GET, retried on connection errors and 5xx.
  Result<Response> Get(std::string_view path);

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// `key` as an RFC 8941 sf-string ("..." with \" and \\ escaped).
std::string QuoteKey(std::string_view key);

}  // namespace idem::http

#endif  // IDEM_HTTP_CLIENT_H_
