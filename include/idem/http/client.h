// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::http::Client: POST with an Idempotency-Key that stays the same on
// every retry, so the server can recognise the repeat (a consumer passes
// DownstreamKey(message, "charge")). Retries connection errors, timeouts,
// 409 (another request with the key is running), 429 and 5xx, with
// exponential backoff and jitter, honouring Retry-After; never 422 (the key
// was used for another body: a bug in the caller, reported as such).
//
//   auto client = idem::http::Client::Open({.base_url = "https://api.example.com/v1", .bearer = "sk_test_1"});
//   auto r = (*client)->Post("/charges", R"({"amount":4000,"currency":"usd"})",
//                            idem::DownstreamKey(message, "charge"));
//   if (r.ok() && r->status == 201) ...   // r->replayed: the server answered from its store
//   if (r.status().code() == idem::Code::kInDoubt) ...  // may have been applied: retry later, same key
//
// Thread safety: one Client may be shared by any number of threads. Each
// request takes an idle keep-alive connection from the Client's pool, or
// opens a new one, and gives it back when answered. Cancel() may be called
// from any thread (it is one atomic store: async-signal-safe too).
#ifndef IDEM_HTTP_CLIENT_H_
#define IDEM_HTTP_CLIENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/env.h"
#include "idem/result.h"

namespace idem::http {

// Header fields in the order they are sent. A name is an RFC 9110 token
// (letters, digits, !#$%&'*+-.^_`|~); a value is printable ASCII, spaces and
// tabs (no CR, LF or other control byte, no byte above 0x7E). The Client
// sets Idempotency-Key, Content-Type, Content-Length, Transfer-Encoding,
// Host and Connection itself (and Authorization when `bearer` is set): those
// names are refused here.
using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct Response {
  int status = 0;
  std::multimap<std::string, std::string> headers{};
  std::string body{};
  int attempts = 0;       // requests sent, the answered one included
  bool replayed = false;  // Idempotent-Replayed: true
  // The first value of a header (names compared case-insensitively); "" if absent.
  std::string header(const std::string& name) const;
};

class Client {
 public:
  struct Options {
    // "http://host[:port][/base/path]" or "https://host[:port][/base/path]".
    // Ports default to 80 and 443. A base path is put in front of every
    // request's path: "http://127.0.0.1:8080/api/v1" and Post("/charges")
    // request /api/v1/charges. No query, fragment or user info.
    std::string base_url{};
    // Sent as "Authorization: Bearer <bearer>" when not empty.
    std::string bearer{};
    // Sent with every request (see HeaderList for what is refused at Open).
    // Default: none.
    HeaderList headers{};
    // https only: the server's certificate is always verified, chain and host
    // name (there is no option to turn that off). The CAs trusted: those of
    // `ca_file` (a PEM bundle) if set, else those of `ca_dir` (a directory of
    // hashed CA certificates, c_rehash) if set, else (the default) the
    // system's default CAs.
    std::string ca_file{};
    std::string ca_dir{};
    // Tries per request, the first included. Default: 6.
    int max_attempts = 6;
    // Backoff before retry n: base * 2^(n-1), at most max, plus up to 25%
    // jitter; a longer Retry-After (at most max) wins. Slept through `env` in
    // slices of at most 50 ms, checking for Cancel() and StopRequested()
    // between them. Defaults: 50 ms, 2 s.
    int64_t backoff_base_ms = 50;
    int64_t backoff_max_ms = 2'000;
    int64_t connect_timeout_ms = 2'000;
    // A response not read within this is a lost response: retried (and, if
    // the tries run out, reported as in doubt). Also the write timeout, and
    // the longest a request in flight delays Cancel(). Default: 10 s.
    int64_t read_timeout_ms = 10'000;
    // Idle keep-alive connections kept for reuse; a request that finds none
    // opens one, and one given back beyond this many is closed. Must be >= 0.
    // Default: 16.
    int pool_size = 16;
    // Clock, sleeps and jitter. Default: Env::Default().
    Env* env = nullptr;
  };

  // kInvalidArgument for a URL that is not as above, a header that
  // HeaderList refuses (the message names it), an unreadable `ca_file`,
  // max_attempts below 1, negative backoffs or timeouts, or pool_size
  // below 0. Connects lazily (the first request).
  static Result<std::unique_ptr<Client>> Open(const Options& options);
  ~Client();

  // POSTs `body` with Idempotency-Key `key` (sent as an RFC 8941 sf-string:
  // "..." with \" and \\ escaped), retrying as above. Returns the first
  // response that is not retried (any 2xx, 3xx or 4xx but 409/422/429).
  // Errors (each message names the key and the last error):
  //   kInvalidArgument  `key` is empty, longer than 255 bytes, or holds a
  //                     byte outside 0x20-0x7E (make keys with
  //                     idem::DownstreamKey); a path or header the request
  //                     line or a header cannot carry. Nothing sent.
  //   kConflict         422: the key was used with another body (a bug in
  //                     the caller). Never retried.
  //   kAborted          Cancel() was called, or StopRequested() is true on
  //                     this thread (a stopping Consumer's worker): checked
  //                     before every attempt and during backoff sleeps; a
  //                     request in flight ends within its timeouts first. If
  //                     an attempt may have reached the server the message
  //                     says so.
  // When the tries run out:
  //   kInProgress       the last answer was 409: the server still runs the
  //                     first request with the key. Retry later, same key.
  //   kInDoubt          an attempt sent the request and got no answer (read
  //                     timeout, connection closed or reset once the request
  //                     was being written) or a 5xx: the server may have
  //                     applied it. Retry later with the same key to learn
  //                     the outcome; never with a new key.
  //   kBusy             every answer was 429 (and any other attempt failed
  //                     to connect): refused, not applied.
  //   kUnavailable      no attempt can have reached the server: every one
  //                     failed to connect (refused, connect timeout, TLS
  //                     handshake). A certificate that fails verification
  //                     is kUnavailable at once, not retried (nothing was
  //                     sent; the message says "certificate verification
  //                     failed" and why).
  Result<Response> Post(std::string_view path, std::string_view body, std::string_view key,
                        std::string_view content_type = "application/json");
  // The same, with `headers` sent after Options::headers (checked as
  // HeaderList says: a bad one is kInvalidArgument, nothing sent).
  Result<Response> Post(std::string_view path, std::string_view body, std::string_view key, const HeaderList& headers,
                        std::string_view content_type = "application/json");
  // A GET, retried on connection errors and 5xx (a 409 is returned as it
  // is). kAborted as for Post; kUnavailable when the tries run out (a GET
  // changes nothing, so nothing is in doubt).
  Result<Response> Get(std::string_view path);

  // Makes every Post and Get of this Client, running or to come, return
  // kAborted at its next check (see Post). Permanent. Thread-safe.
  void Cancel() noexcept;

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// `key` as an RFC 8941 sf-string ("..." with \" and \\ escaped).
std::string QuoteKey(std::string_view key);

}  // namespace idem::http

#endif  // IDEM_HTTP_CLIENT_H_
