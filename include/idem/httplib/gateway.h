// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::httplib::Gateway: a reverse proxy that gives an HTTP API the
// Idempotency-Key contract without a change to the API (doc/gateway.md;
// `idem gateway` is this type as a command). For the guarded methods and
// paths, a request with an Idempotency-Key is forwarded to the upstream at
// most once per (principal, key); a repeat gets the stored status, headers
// (Options::stored_headers) and body with `Idempotent-Replayed: true`.
// Everything else is forwarded as it is.
//
//   auto store = idem::sqlite::Store::Open({.path = "gateway.db"});
//   idem::Claims claims(*(*store)->claim_store());
//   auto gateway = idem::httplib::Gateway::Open(
//       {.upstream = "http://127.0.0.1:3000", .claims = &claims, .port = 8080});
//   if (!gateway.ok()) return gateway.status();
//   (*gateway)->Run();   // until Stop() (or SIGTERM with StopOnSignals(&(*gateway)->server()))
//
// The unknown-outcome rule: once a request was forwarded and its answer is
// lost (the upstream timed out or closed the connection, or the gateway
// died between forwarding and storing), the gateway never forwards that key
// again on its own: the key is completed with a 503 "outcome-unknown"
// problem, the answer to every repeat. With Options::upstream_honours_key
// the upstream deduplicates the forwarded Idempotency-Key itself, and the
// key is forwarded again (with the same key) instead. A request that never
// reached the upstream (the connection was refused) frees its key: 502.
//
// Answers of its own (application/problem+json, the middleware's,
// idem/http/idempotency.h): 400 key missing or malformed, 401 no principal
// header, 409 in progress (Retry-After), 410 response-not-stored (the first
// response was over max_stored_body), 413 body too large, 422 key reused
// with another request (method, path, body), 502 upstream unreachable, 503
// outcome-unknown, store-unavailable or spool-unavailable (a body over
// max_body_bytes could not be spooled: Options::max_spooled_body).
//
// Thread safety: Handle may run on every server thread at once; Stop may be
// called from any thread (and a signal handler, through the server).
#ifndef IDEM_HTTPLIB_GATEWAY_H_
#define IDEM_HTTPLIB_GATEWAY_H_

#include <httplib.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "idem/claims.h"
#include "idem/httplib/server.h"
#include "idem/observer.h"
#include "idem/result.h"

namespace idem::httplib {

class Gateway {
 public:
  struct Options {
    // Required: "http://host[:port][/base]" or "https://..." (the
    // certificate verified, chain and host name: ca_file, else ca_dir, else
    // the system's CAs).
    std::string upstream;
    // Required: where keys, leases and stored responses live; must outlive
    // the gateway. Their retention_ms is how long a key is replayed.
    Claims* claims = nullptr;
    // Where to listen. port 0: any free port (port()).
    std::string host = "127.0.0.1";
    int port = 0;
    // Methods guarded; others are forwarded as they are.
    std::set<std::string> methods = {"POST", "PATCH"};
    // Path prefixes guarded ("/v1/charges" guards it and "/v1/charges/..."):
    // empty, every path.
    std::vector<std::string> paths{};
    // The header whose value is the principal (keys are scoped by it). Only
    // its SHA-256 is kept. A guarded request without it gets 401.
    std::string principal_header = "Authorization";
    // A guarded request without a key: 400 (true), or forwarded unguarded.
    bool require_key = true;
    // The upstream deduplicates the Idempotency-Key it is forwarded: a key
    // whose outcome is unknown is forwarded again, with the same key.
    bool upstream_honours_key = false;
    // An upstream 5xx may come after the upstream acted (it failed on the way
    // out), so by default it is stored and replayed like any answer and the key
    // is not forwarded again. true: a 5xx is answered and its key freed, so a
    // retry is forwarded again (for an upstream whose 5xx means nothing was
    // done). With upstream_honours_key a 5xx is never stored either: the
    // retry is forwarded with the same key and the upstream deduplicates it.
    bool forward_again_after_5xx = false;
    // Responses with a larger body reach their first client but are not
    // stored: a repeat gets 410 response-not-stored. > 0.
    size_t max_stored_body = 1 << 20;
    // Keys one principal may hold stored at once (in progress or retained):
    // past it, a request with a new key gets 429 too-many-keys (its keys
    // already stored still replay). Counted from the store at most once a
    // second (a count of the principal's keys) plus this process's new keys
    // in between. 0: no limit, nothing counted. >= 0.
    int64_t max_keys_per_principal = 0;
    // Request bodies larger get 413 (unless spooled: max_spooled_body). > 0.
    size_t max_body_bytes = 1 << 20;
    // Larger request bodies, up to this, are not held in memory: a guarded
    // one is spooled to an unlinked temporary file in spool_dir ("":
    // $TMPDIR, else /tmp) while its fingerprint is computed (the SHA-256 of
    // its bytes as they are: JSON and form bodies are not canonicalised at
    // this size), then the key claimed and the body streamed to the
    // upstream from the file; an unguarded one is streamed straight
    // through. Over it: 413. 0 (or not above max_body_bytes): none.
    size_t max_spooled_body = 0;
    std::string spool_dir{};
    // Response headers stored and replayed (any case); never Set-Cookie
    // unless listed. The first client gets every header.
    // An upstream 4xx is answered but not stored: the key is free again and
    // a retry is forwarded again (the middleware's rule).
    std::vector<std::string> stored_headers = {"Content-Type",  "Content-Language", "Location", "ETag",
                                               "Last-Modified", "Cache-Control",    "Link"};
    // Upstream timeouts: connecting, and each read or write of a forwarded
    // request. A guarded request whose answer does not come in time has an
    // unknown outcome.
    int64_t connect_timeout_ms = 2'000;
    int64_t upstream_timeout_ms = 30'000;
    // How long a forwarded request holds its key before a repeat may find
    // its holder gone (then: the unknown-outcome rule). Must be more than
    // connect_timeout_ms + 2 * upstream_timeout_ms, so that a live gateway
    // always answers first.
    int64_t lease_ms = 90'000;
    std::string ca_file{};
    std::string ca_dir{};
    // GET on this path answers the Prometheus metrics (not forwarded). "":
    // none.
    std::string metrics_path = "/metrics";
    // Requests handled at once, the connection bounds, and the requests
    // served on one client connection before it is closed (Server::Options:
    // threads, max_connections, max_connections_per_client,
    // keep_alive_requests).
    int threads = 64;
    int max_connections = 1024;
    int max_connections_per_client = 256;
    int keep_alive_requests = 1000;
    // Behind load balancers: the proxies whose word about the client is
    // taken (addresses or CIDR blocks), so max_connections_per_client counts
    // the client they name, from X-Forwarded-For or, with proxy_protocol,
    // the PROXY header they start each connection with (Server::Options,
    // idem/httplib/server.h: the rule). The upstream's X-Forwarded-For gets
    // the PROXY header's client appended (the peer's otherwise).
    std::vector<std::string> trusted_proxies{};
    bool proxy_protocol = false;
    // Optional: one line per guarded request (method, path, key, outcome,
    // status), and per connection or request the trusted-proxy rule refused
    // or could not attribute; client text quoted and escaped.
    std::function<void(const std::string& line)> log{};

    // A repeat that arrives while its key's first request is at the
    // upstream waits up to this long for the answer, then gets it replayed
    // (or 409 with Retry-After when the bound passes first). 0: 409 at once.
    // >= 0. Each waiting request holds one of `threads`.
    int64_t wait_ms = 0;
    // While waiting: woken at once when the first request is answered by
    // this process; otherwise the key is read again every wait_poll_ms (a
    // gateway beside it on the same store). No store connection is held in
    // between. > 0.
    int64_t wait_poll_ms = 50;
    // Every purge_every_ms, the keys whose retention ended are deleted from
    // the store (PurgeExpired). 0: never (purge with `idem purge`).
    int64_t purge_every_ms = 0;
    // Optional: called once per guarded request when it is answered (the
    // structured form of `log`, for JSON lines: RequestLog's fields are
    // the client's text as it came; escape it where it is written). When
    // set, `log` gets no per-request lines, only the gateway's own (a purge
    // that failed).
    struct RequestLog {
      std::string_view method{}, path{};
      std::string_view key{};      // the key ("" without one; a malformed one as it came)
      std::string_view outcome{};  // as in the latency histogram: forwarded, replayed, ...
      int status = 0;
      double latency_seconds = 0;
    };
    std::function<void(const RequestLog&)> request_log{};
    // Optional: told each guarded request's claim events (kClaimStarted,
    // kClaimReplayed, ...: Idempotency::Options::observer; `idem gateway
    // --web`'s live view). Must outlive the gateway.
    Observer* observer = nullptr;
  };

  // kInvalidArgument naming the field (no claims, a bad upstream URL, a
  // bound or timeout out of range, lease_ms too short); kUnavailable when
  // host:port cannot be bound.
  static Result<std::unique_ptr<Gateway>> Open(const Options& options);
  ~Gateway();
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  // Serves on the bound address until Stop().
  Status Run();
  void Stop() noexcept;
  int port() const;
  // The server (for StopOnSignals, counters).
  Server& server();

  // One request, for a server of your own: the metrics, a guarded request,
  // or a plain forward.
  void Handle(const ::httplib::Request& req, ::httplib::Response& res);

  struct Counters {
    uint64_t forwarded = 0;        // guarded requests sent to the upstream
    uint64_t replayed = 0;         // repeats answered from the store
    uint64_t in_flight = 0;        // guarded requests at the upstream now
    uint64_t conflicts = 0;        // 422: a key reused with another request
    uint64_t in_progress = 0;      // 409: the key's first request still running
    uint64_t outcome_unknown = 0;  // keys whose outcome is unknown
    uint64_t not_stored = 0;       // responses over max_stored_body
    uint64_t passed = 0;           // requests forwarded unguarded
    uint64_t upstream_errors = 0;  // requests that did not reach the upstream
    uint64_t waiting = 0;          // repeats waiting now for their key's first request (wait_ms)
    uint64_t purged = 0;           // expired keys deleted (PurgeExpired, the timer's too)
    uint64_t purge_errors = 0;     // purges that failed (the store's error)
  };
  Counters counters() const;
  // The counters and the latency histograms (by outcome) in the Prometheus
  // text format.
  std::string Metrics() const;

  // Deletes the keys whose retention ended now (what purge_every_ms does on
  // a timer): in the claims' store, completed keys past their
  // retention_ms, and keys left in progress (a gateway died holding them)
  // retention_ms after their lease ended. Every scope of the store is
  // purged so, not only the gateway's. A purged key is new again: its next
  // request is forwarded. How many were deleted.
  Result<int64_t> PurgeExpired();

 private:
  struct Impl;
  explicit Gateway(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::httplib

#endif  // IDEM_HTTPLIB_GATEWAY_H_
