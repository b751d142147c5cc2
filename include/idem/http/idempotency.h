// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::http::Idempotency: the Idempotency-Key middleware for cpp-httplib
// servers (IETF httpapi draft "The Idempotency-Key HTTP Header Field" -07,
// and Stripe's behaviour). A client retries a POST with the same key; the
// first request runs, its response is stored; every repeat gets the stored
// response, byte-identical, with `Idempotent-Replayed: true`.
//
//   idem::Claims claims(*store->claim_store());
//   idem::http::Idempotency idem(claims, idem::http::BearerKeys({{"sk_test_1", "acct_1"}}));
//   server.Post("/charges", idem.Wrap("/charges", {}, [&](const httplib::Request& req, httplib::Response& res) {
//     ... create the charge once ...
//   }));
//
// Per request, in order (each failure is an application/problem+json body,
// RFC 9457, saying whether to retry with the same key or a new one):
//   401  no principal (the authenticator said no)
//   413  body larger than max_body_bytes
//   400  Idempotency-Key missing (where required), empty, longer than 255, or
//        neither an RFC 8941 sf-string nor a bare token (see ParseKey)
//   4xx  the route's RoutePolicy::validate refused the request (its answer;
//        nothing claimed, the key stays free)
//   422  the key was used with another request (method, route, body)
//   409  the first request with the key is still running (Retry-After), unless
//        the route waits for it (RoutePolicy::wait_ms)
//   429  the principal has too many stored keys on the route
//   409  lease-lost: the handler ran past its lease and a retry took the key
//        over (the winner's stored response instead, once it is stored)
//   503  the store is unavailable, or the commit failed (retry, same key)
//   500  the handler threw, or a stored response cannot be read
// Keys are scoped by principal, method and route: a client never receives
// another principal's stored response, whatever key it sends.
//
// Thread safety: Wrap()'s handlers may run on every server thread at once.
#ifndef IDEM_HTTP_IDEMPOTENCY_H_
#define IDEM_HTTP_IDEMPOTENCY_H_

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "idem/claims.h"
#include "idem/message.h"
#include "idem/result.h"
#include "idem/store.h"

namespace idem::http {

// Who is calling, or std::nullopt (401). The principal scopes the keys.
using Authenticator = std::function<std::optional<std::string>(const httplib::Request&)>;

// `Authorization: Bearer <key>` looked up in a table of key -> principal.
Authenticator BearerKeys(std::map<std::string, std::string> keys);

struct RoutePolicy {
  // Methods whose requests the middleware handles; others pass through.
  std::set<std::string> methods = {"POST", "PATCH"};
  // Whether a request without Idempotency-Key is refused (400) or runs
  // unguarded.
  bool require_key = true;
  // How long a duplicate waits for the first request's response before 409.
  int64_t wait_ms = 0;
  // How long the handler may run before a retry may take the key over.
  int64_t lease_ms = 30'000;
  // 5xx responses: stored and replayed (true), or released so a retry with
  // the same key runs again (false).
  bool store_5xx = false;
  // 4xx responses of the handler are validation errors before execution:
  // not stored (the key is released) unless listed here (402 card declined,
  // say).
  std::set<int> stored_4xx = {};
  // Optional: checks a request before anything is claimed or stored, on the
  // request's own thread, after authentication and the key's checks. False:
  // the request is answered with what `validate` wrote into the response (a
  // 4xx problem, say), the handler does not run, and the key stays free for
  // a corrected request. It runs for repeats too, before their stored
  // response is looked up: keep it a function of the request alone (what
  // it let through once, it lets through again). Checks that need no
  // transaction belong here: a handler's own 4xx comes after the claim, and
  // under group commit it rolls its group back to run again without it
  // (Counters::group_reruns).
  std::function<bool(const httplib::Request&, httplib::Response&)> validate;
};

struct Options {
  // How long a stored response is replayed is the Claims' setting
  // (Claims::Options::retention_ms, default 24 h): it is what the store keeps,
  // and every response advertises it in Idempotency-Key-Retention (seconds).
  // Larger bodies get 413 before anything is stored. Default: 1 MiB. The
  // body is read before the middleware runs: also give the server the limit
  // (server.set_payload_max_length(max_body_bytes)) so that a larger
  // Content-Length is refused with 413 before its bytes are read.
  size_t max_body_bytes = 1 << 20;
  // Stored keys per principal and route before 429. Counted from the store
  // at most once a second per scope, plus this process's new keys in
  // between. Default: 100,000.
  int64_t max_keys_per_principal = 100'000;
  // Where the problem types live ("<base>/idempotency-key-missing", ...).
  std::string problem_base = "https://idem.dev/problems";
  // Clock for the key-count cache and waits. Default: Env::Default().
  Env* env = nullptr;
  // Group commit, for transactional routes (WrapInTransaction): requests
  // that arrive while a transaction is being committed run together in the
  // next one -- their claims, effects and stored responses -- and share its
  // commit (one fsync on SQLite FULL or PostgreSQL), up to this many. A
  // request whose response is not stored, or that a store error stops, is
  // taken out and run in a transaction of its own, so the others never
  // depend on it. 0 or 1: every request commits on its own (on the
  // server's thread). Handlers of grouped routes run on the committer's
  // threads and one at a time per group: keep them short (they are already
  // local to the database).
  int group_commit_max = 0;
  // Transactions open at once for groups (their threads): 1 suits SQLite's
  // single writer; a few suit PostgreSQL.
  int group_committers = 1;
};

// The stored form of a response.
struct StoredResponse {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};
std::string Encode(const StoredResponse& r);
Result<StoredResponse> Decode(std::string_view bytes);

// The key of an Idempotency-Key header value, 1 to 255 characters after
// trimming spaces and tabs around it: an RFC 8941 sf-string ("..." with \"
// and \\ escapes, printable ASCII), or a bare token as Stripe's client
// libraries send it (visible ASCII 0x21-0x7E but ", \ and comma, e.g. a
// UUID). The key is the unescaped text: "abc" and abc are one key.
// kInvalidArgument for anything else (an unterminated string, a bad
// escape, control or non-ASCII bytes, a bare value with a space, a list).
Result<std::string> ParseKey(std::string_view header_value);

// The request fingerprint: SHA-256 over method, route and body; a JSON body
// (that parses as JSON) is canonicalised first: object keys sorted, no
// insignificant whitespace.
Fingerprint RequestFingerprint(std::string_view method, std::string_view route, std::string_view body);
// The canonical JSON text, or std::nullopt when `body` is not JSON or nests
// arrays and objects more than 128 deep (fingerprinted as bytes then: a
// client must not crash the server with a deep body).
std::optional<std::string> CanonicalJson(std::string_view body);

// During a wrapped handler: the claim it runs under (for handlers that fence
// their own writes with it). Empty outside.
const ClaimToken* CurrentClaim();

class Idempotency {
 public:
  // `claims` must outlive the middleware. std::invalid_argument (at set-up,
  // never per request) for Claims whose options cannot work
  // or an empty Authenticator; Wrap and WrapInTransaction likewise for an
  // empty route name. Route names scope keys (with principal and method):
  // two routes given one name share their keys.
  Idempotency(Claims& claims, Authenticator authenticate, Options options = {});

  // The handler for a route, guarded: register it with the server for the
  // methods to guard. `route` names the scope (with the principal and the
  // method) and is part of every key's fingerprint; it is not matched
  // against the request's path, so one name may serve a pattern such as
  // "/charges/:id/refunds".
  httplib::Server::Handler Wrap(std::string route, RoutePolicy policy, httplib::Server::Handler handler);

  // A transactional route: the handler writes through `tx`, the transaction
  // that also holds the key's record, so the record, the effect and the
  // stored response commit together -- one commit per request, as the Inbox
  // does for messages. A concurrent request with the key waits for that
  // commit (then replays) instead of getting 409. Only for handlers whose
  // whole effect is in this database (no calls outside it). `store` must be
  // the database the Claims keep their records in (std::invalid_argument
  // otherwise) and must outlive the handler. A response that is not stored
  // (a 4xx, or a 5xx without store_5xx) rolls the effect back too.
  using TxHandler = std::function<void(const httplib::Request&, httplib::Response&, Transaction& tx)>;
  httplib::Server::Handler WrapInTransaction(std::string route, RoutePolicy policy, Store& store, TxHandler handler);

  ~Idempotency();
  Idempotency(const Idempotency&) = delete;
  Idempotency& operator=(const Idempotency&) = delete;

  struct Counters {
    uint64_t executed = 0, replayed = 0, conflicts = 0, in_progress = 0, rejected = 0;
    // Group commit: transactions committed for groups, the requests they
    // carried, and the requests waiting for the next group now.
    uint64_t group_commits = 0, grouped_requests = 0, group_queue = 0;
    // Groups rolled back and run again without one of their requests (its
    // response was not to be stored, or it was over its key limit).
    uint64_t group_reruns = 0;
    // Requests refused by RoutePolicy::validate (also counted in rejected).
    uint64_t invalid = 0;
  };
  Counters counters() const;

  // Optional: one line per request (key, outcome) for logs.
  std::function<void(const std::string& line)> log;

 private:
  void Handle(const std::string& route, const RoutePolicy& policy, const httplib::Server::Handler& handler,
              const httplib::Request& req, httplib::Response& res);
  void Handle(const std::string& route, const RoutePolicy& policy, const httplib::Server::Handler& handler,
              Store* store, const TxHandler* tx_handler, const httplib::Request& req, httplib::Response& res);
  // Answers `status` with a problem+json body; Retry-After when retry_after
  // is not empty.
  void Problem(httplib::Response& res, int status, std::string_view type, std::string_view title,
               std::string detail, std::string_view retry, const std::string& retry_after = "");
  // The Idempotency-Key-Retention header's value (seconds).
  std::string Retention() const;
  // Whether the scope may store one more key (429 otherwise).
  Result<bool> UnderLimit(const std::string& scope);
  // One more key stored in the scope by this process (until the next count).
  void CountNewKey(const std::string& scope);
  // Runs the route's handler for a started claim (as CurrentClaim), turning
  // an exception into a 500, and adds the retention header.
  void Execute(const ClaimToken& token, httplib::Response& res, const std::function<void()>& run);
  // Runs the application's `run` (a handler, a validate); if it throws,
  // `res` becomes a 500 problem ("<who> threw: ...") and the answer is true.
  bool Threw(std::string_view who, httplib::Response& res, const std::function<void()>& run);
  // Whether the route stores a response with this status.
  static bool Kept(const RoutePolicy& policy, int status);

  // Group commit (Options::group_commit_max): the queue, its threads, and
  // one request's passage through them.
  struct GroupJob;
  class Committer;
  void RunGroup(Store& store, const std::vector<GroupJob*>& group);
  std::unique_ptr<Committer> committer_;

  Claims& claims_;
  Authenticator authenticate_;
  Options options_;
  std::atomic<uint64_t> executed_{0}, replayed_{0}, conflicts_{0}, in_progress_{0}, rejected_{0};
  std::atomic<uint64_t> group_commits_{0}, grouped_requests_{0}, group_reruns_{0}, invalid_{0};
  struct KeyCount {
    int64_t counted_at_ms = -1;
    int64_t count = 0;
  };
  std::mutex counts_mu_;
  std::map<std::string, KeyCount> counts_;
};

}  // namespace idem::http

#endif  // IDEM_HTTP_IDEMPOTENCY_H_
