// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::http::Idempotency: the Idempotency-Key middleware (IETF httpapi draft
// "The Idempotency-Key HTTP Header Field" -07, and Stripe's behaviour), on a
// request and answer of its own (idem/http/request.h): it includes no HTTP
// library. A client retries a POST with the same key; the first request
// runs, its response is stored; every repeat gets the stored response,
// byte-identical, with `Idempotent-Replayed: true`. On cpp-httplib mount it
// with idem/httplib/middleware.h; for another framework convert its request
// and response (doc/http.md).
//
//   idem::Claims claims(*store->claim_store());
//   auto idem = idem::http::Idempotency::Open(
//       {.claims = &claims, .authenticate = idem::http::BearerKeys({{"sk_test_1", "acct_1"}})});
//   auto charge = (*idem)->Wrap("/charges", {}, [&](const idem::http::Request& req, idem::http::Answer& ans) {
//     ... create the charge once ...
//   });
//   // per request: (*charge)(request, answer);
//
// Per request, in order: admit (each refusal an application/problem+json
// body, RFC 9457, saying whether to retry with the same key or a new one;
// another shape with RoutePolicy::refusals)
//   401  no principal (the authenticator said no)
//   413  body larger than max_body_bytes
//   400  Idempotency-Key missing (where required), empty, longer than 255, or
//        neither an RFC 8941 sf-string nor a bare token (see ParseKey)
//   4xx  the route's RoutePolicy::validate refused the request (its answer;
//        nothing claimed, the key stays free)
// then decide, by the route's kind (RouteKind), and answer:
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
// Nothing here throws: set-up mistakes are a Status from Open, Wrap,
// WrapInTransaction and AddRoute; a handler or validate that throws is a 500.
//
// Thread safety: routes and their handlers may serve every server thread at
// once; Open, AddRoute, Wrap and WrapInTransaction are for set-up (one thread).
#ifndef IDEM_HTTP_IDEMPOTENCY_H_
#define IDEM_HTTP_IDEMPOTENCY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "idem/claims.h"
#include "idem/http/request.h"
#include "idem/result.h"
#include "idem/transaction.h"

namespace idem {
class Store;
}  // namespace idem

namespace idem::http {

// Who is calling, or std::nullopt (401). The principal scopes the keys.
using Authenticator = std::function<std::optional<std::string>(const Request&)>;

// `Authorization: Bearer <key>` looked up in a table of key -> principal.
Authenticator BearerKeys(std::map<std::string, std::string> keys);

// A route's handler: writes the answer for a request the middleware let run.
using Handler = std::function<void(const Request&, Answer&)>;
// A transactional route's handler: writes its effect through `tx`, the
// transaction that also holds the key's record.
using TxHandler = std::function<void(const Request&, Answer&, Transaction& tx)>;
// Checks a request before anything is claimed (RoutePolicy::validate).
using Validator = std::function<bool(const Request&, Answer&)>;

// One of the middleware's own refusals (401, 400, 409, 422, 429, 5xx: the
// list above), for a RefusalWriter to put in the shape its clients parse.
struct Refusal {
  int status = 0;
  // The problem's name: "unauthenticated", "body-too-large",
  // "idempotency-key-missing", "idempotency-key-malformed",
  // "invalid-request", "idempotency-key-reused", "request-in-progress",
  // "lease-lost", "too-many-keys", "store-unavailable", "commit-failed",
  // "handler-failed", "stored-response-corrupt", "outcome-unknown",
  // "response-not-stored".
  std::string_view type{};
  std::string_view title{};  // a short human title ("Idempotency-Key reused")
  std::string detail{};      // what happened and what to do
  // Whether a retry can help: "same-key", "new-key" or "no".
  std::string_view retry{};
};
// Writes a refusal's body (and may change its status). The middleware has
// set the status, Retry-After where there is one, and
// Idempotency-Key-Retention already.
using RefusalWriter = std::function<void(const Refusal&, Answer&)>;
// The default: an application/problem+json body (RFC 9457) with type
// "<problem_base>/<type>", title, status, detail and retry.
RefusalWriter ProblemJson(std::string problem_base);
// Stripe's error shape, for routes that Stripe's own client libraries call:
// {"error":{"type":...,"code":...,"message":...}} as application/json, a
// reused key 400 "idempotency_error" (the client raises
// StripeIdempotencyError), 401 "invalid_request_error" (raised as
// StripeAuthenticationError), 429 "rate_limit_error", 5xx "api_error",
// 409 and the rest "invalid_request_error"; `Stripe-Should-Retry: true`
// where a retry with the same key can help (409, 503: the clients retry
// them), false elsewhere.
RefusalWriter StripeErrors();

// How a route decides, once a request is admitted. Chosen when the route is
// made, never per request.
enum class RouteKind {
  // The key's claim commits first (its own transaction), the handler runs
  // outside any transaction (it may call other services), and its response
  // is stored after. A duplicate while it runs gets 409 (or waits,
  // RoutePolicy::wait_ms); a handler past its lease loses the key to a retry.
  kTwoPhase,
  // The claim, the handler's writes and the stored response are one
  // transaction of the store that keeps the claims: one commit per request,
  // as the Inbox does for messages. A duplicate waits for that commit (then
  // replays). With Options::group_commit_max > 1, requests that arrive
  // while one commits run together in the next transaction (group commit).
  // Only for handlers whose whole effect is in this database.
  kTransactional,
};

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
  // the request is answered with what `validate` wrote into the answer (a
  // 4xx problem, say; a 400 problem if it wrote none), the handler does not
  // run, and the key stays free for a corrected request. It runs for
  // repeats too, before their stored response is looked up: keep it a
  // function of the request alone (what it let through once, it lets
  // through again). Checks that need no transaction belong here: a
  // handler's own 4xx comes after the claim, and under group commit it
  // rolls its group back to run again without it (Counters::group_reruns).
  Validator validate{};
  // Optional: the shape of the middleware's refusals on this route (see
  // StripeErrors). Default (empty): Options::problem_base's problem+json.
  RefusalWriter refusals{};
  // Two-phase routes: what a request does when it finds its key's earlier
  // holder gone (its lease ran out with nothing stored: the process died
  // after the handler's effect, or the handler outran its lease).
  //   kRunAgain        the handler runs again (fine when what it calls
  //                    honours the key itself, CallOnce's rule)
  //   kOutcomeUnknown  it never runs again for that key: the key is
  //                    completed with a 503 "outcome-unknown" problem, the
  //                    answer of this request and of every repeat
  enum class Takeover { kRunAgain, kOutcomeUnknown };
  Takeover takeover = Takeover::kRunAgain;
  // Response headers stored and replayed (names, any case). Empty: every
  // header but the connection's own. The first answer has them all.
  std::vector<std::string> stored_headers{};
  // Two-phase routes: a response whose body is larger is answered to its
  // request but not stored; the key is completed with a 410
  // "response-not-stored" problem, the answer of every repeat (the request
  // ran; it does not run again). 0: no bound.
  size_t max_stored_body = 0;
  // For a route that serves many paths (a proxy's): the keys' scope is the
  // principal and the route alone, and the fingerprint covers the method
  // and the request target (path and query) too, so one key stands for one
  // request: the key sent again with another method or path is 422.
  bool fingerprint_target = false;
  // Two-phase routes with wait_ms > 0: how the wait hears that the first
  // request finished. 0: the store's watch (on PostgreSQL a connection of
  // its own that LISTENs, held for the whole wait). > 0: this process's
  // wakeup when the first request finishes here, and otherwise one read of
  // the key every wait_poll_ms; no store connection is held in between, so
  // many waiting requests do not use up the store's connections.
  int64_t wait_poll_ms = 0;
};

// During a two-phase route's handler: its effect may have happened but its
// answer is lost (a call it made timed out, or the connection closed without
// an answer). On a kOutcomeUnknown route the key is completed with the 503
// "outcome-unknown" problem (this answer and every repeat's); on a
// kRunAgain route the key is released and the answer is a 503
// "outcome-unknown" problem asking to retry with the same key. `why` goes
// into the problem's detail.
void OutcomeUnknown(std::string why);

// During a two-phase route's handler: nothing was done (what it calls was
// never reached: the connection was refused, say). The key is released
// whatever the answer's status, even a 5xx on a route with store_5xx, so a
// retry with the same key runs.
void NotExecuted();

// During a route's handler: the claim it runs under (for handlers that fence
// their own writes with it). Null outside.
const ClaimToken* CurrentClaim();

class Idempotency {
 public:
  struct Options {
    // Required: the claims that keep the keys' records and stored responses;
    // must outlive the middleware. How long a stored response is replayed
    // is theirs (Claims::Options::retention_ms, default 24 h), and every
    // response advertises it in Idempotency-Key-Retention (seconds).
    Claims* claims = nullptr;
    // Required: who is calling (see BearerKeys).
    Authenticator authenticate{};
    // Larger bodies get 413 before anything is stored. Default: 1 MiB. The
    // body is read before the middleware runs: also give the server the
    // limit (cpp-httplib: set_payload_max_length) so that a larger
    // Content-Length is refused before its bytes are read.
    size_t max_body_bytes = 1 << 20;
    // Stored keys per principal and route before 429. Counted from the store
    // at most once a second per scope, by one request at a time (the others
    // answer from the last count), plus this process's new keys in between
    // (a count reads every key the principal holds on the route). 0: no
    // limit, nothing counted. >= 0. Default: 100,000.
    int64_t max_keys_per_principal = 100'000;
    // Where the problem types live ("<base>/idempotency-key-missing", ...).
    // Default: "https://idem.dev/problems".
    std::string problem_base = "https://idem.dev/problems";
    // Clock for the key-count cache. Default (null): Env::Default().
    Env* env = nullptr;
    // Group commit, for transactional routes: requests that arrive while a
    // transaction is being committed run together in the next one -- their
    // claims, effects and stored responses -- and share its commit (one
    // fsync on SQLite FULL or PostgreSQL), up to this many. A request whose
    // response is not stored, or that a store error stops, is taken out and
    // run in a transaction of its own, so the others never depend on it.
    // 0 or 1 (the default 0): every request commits on its own (on the
    // request's thread). Handlers of grouped routes run on the committer's
    // threads and one at a time per group: keep them short (they are
    // already local to the database). Must be >= 0.
    int group_commit_max = 0;
    // Transactions open at once for groups (their threads): 1 (the default)
    // suits SQLite's single writer; a few suit PostgreSQL. Must be >= 1.
    int group_committers = 1;
    // Optional: one line per request (method, path, key, outcome, status)
    // for logs. Client text in it is quoted and escaped (Printable).
    std::function<void(const std::string& line)> log{};
    // Optional: told each guarded request's outcome when it is answered
    // (idem/observer.h; consumer is the scope, message_id the key):
    // kClaimStarted then kClaimCompleted for a first execution stored,
    // kClaimReplayed, kClaimConflict, kClaimInProgress, kClaimFenced (its
    // lease was taken over), kClaimReleased (executed, not stored: the
    // status is not kept). Must outlive the Idempotency.
    Observer* observer = nullptr;
  };

  // kInvalidArgument (naming the field) for no claims, Claims whose options
  // cannot work, an empty authenticator, or a count
  // out of range. Nothing is started until a transactional route asks for
  // group commit.
  static Result<std::unique_ptr<Idempotency>> Open(const Options& options);
  ~Idempotency();
  Idempotency(const Idempotency&) = delete;
  Idempotency& operator=(const Idempotency&) = delete;

  // A guarded route, owned by the Idempotency (valid while it lives). Its
  // name scopes the keys (with principal and method) and is part of every
  // key's fingerprint; it is not matched against the request's path, so one
  // name may serve a pattern such as "/charges/:id/refunds". Two routes
  // given one name share their keys.
  class Route;

  // What a route's handler is given for one request: the request, the
  // answer to write, and (kTransactional) the transaction to write through;
  // null on kTwoPhase routes. Adapters build one per request around their
  // framework's own handler (idem/httplib/middleware.h).
  using Work = std::function<void(const Request&, Answer&, Transaction* tx)>;

  // Makes a route of `kind`. `store` (kTransactional only, null otherwise)
  // must be the database the Claims keep their records in, and must outlive
  // the route. kInvalidArgument for an empty name, lease_ms <= 0, wait_ms
  // < 0, or a store that is missing, unwanted or not the Claims' own.
  Result<const Route*> AddRoute(std::string name, RouteKind kind, RoutePolicy policy, Store* store = nullptr);

  // Runs one request through `route`: admit (authentication, size, key,
  // validation) -> decide (by the route's kind) -> answer, into `answer`.
  // `work` runs the handler (at most once; never for a refused request).
  // `validate`, when set, is used instead of the route's
  // RoutePolicy::validate (an adapter's, over its framework's types).
  void Serve(const Route& route, const Request& request, Answer& answer, const Work& work,
             const Validator& validate = nullptr);

  // AddRoute and Serve in one: the handler for a route, guarded, to call
  // with each request (from any thread).
  Result<Handler> Wrap(std::string route, RoutePolicy policy, Handler handler);
  // The same for a kTransactional route on `store`.
  Result<Handler> WrapInTransaction(std::string route, RoutePolicy policy, Store& store, TxHandler handler);

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
    // Two-phase routes: keys whose outcome is unknown (OutcomeUnknown, or a
    // takeover on a kOutcomeUnknown route), and responses answered but not
    // stored for being over RoutePolicy::max_stored_body.
    uint64_t outcome_unknown = 0, not_stored = 0;
    // Requests waiting now for their key's first request (RoutePolicy::wait_ms
    // with wait_poll_ms).
    uint64_t waiting = 0;
  };
  Counters counters() const;
  // The counters (idem_http_executed_total, ...) and the histogram of the
  // time from a request to its answer, idem_http_request_seconds, by
  // outcome: executed, replayed, conflict, in_progress, lease_lost,
  // executed_not_stored (the handler's 4xx/5xx, released), outcome_unknown,
  // rejected (refused before the decision: 401, 400, 413, 429, 503, ...)
  // and unguarded (a method the route leaves alone, or no key where none
  // is required); in the Prometheus text format (for a /metrics of yours,
  // or idem/httplib/metrics_endpoint.h's MountMetrics).
  std::string Metrics() const;

 private:
  struct Impl;  // the routes, the group committer and the counters (idempotency.cc)
  explicit Idempotency(const Options& options);
  std::unique_ptr<Impl> impl_;
};

// The key of an Idempotency-Key header value, 1 to 255 characters after
// trimming spaces and tabs around it: an RFC 8941 sf-string ("..." with \"
// and \\ escapes, printable ASCII), or a bare token as Stripe's client
// libraries send it (visible ASCII 0x21-0x7E but ", \ and comma, e.g. a
// UUID). The key is the unescaped text: "abc" and abc are one key.
// kInvalidArgument for anything else (an unterminated string, a bad
// escape, control or non-ASCII bytes, a bare value with a space, a list).
Result<std::string> ParseKey(std::string_view header_value);

}  // namespace idem::http

#endif  // IDEM_HTTP_IDEMPOTENCY_H_
