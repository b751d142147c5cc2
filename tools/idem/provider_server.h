// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The seed's payment provider as an HTTP server (`idem provider`, and the
// demo's provider on loopback): POST /charges requires an Idempotency-Key
// (idem::http::Idempotency on the claims of its own store), creates a charge
// once per key, and answers 201 with it; GET /charges/{id} and
// GET /charges?customer=... read charges back; GET /health.
//
// Thread safety: Start once; Stop from any thread.
#ifndef IDEM_TOOLS_IDEM_PROVIDER_SERVER_H_
#define IDEM_TOOLS_IDEM_PROVIDER_SERVER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "idem/http/idempotency.h"
#include "idem/httplib/server.h"
#include "idem/result.h"

namespace idem::cli {

struct ProviderServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port (see ProviderServer::port)
  // The provider's own database: charges and idempotency records.
  std::string store_url;
  // API key -> principal ("Authorization: Bearer <key>").
  std::map<std::string, std::string> api_keys;
  // The middleware's options (claims, authenticate and log are the
  // provider's own: set here, they are replaced).
  http::Idempotency::Options idempotency;
  // How long a stored response is replayed (Claims::Options::retention_ms).
  int64_t retention_ms = 24LL * 3600 * 1000;
  // How long POST /charges may run before a retry may take its key over,
  // and how long a duplicate waits for it before 409.
  int64_t lease_ms = 30'000;
  int64_t wait_ms = 0;
  // Threads that run requests (idem::httplib::Server::Options::threads); a
  // connection waiting for bytes holds none.
  int threads = 32;
  // Connections served as fibers on this many threads (idem::httplib::
  // Server::Options::fibers); 0: requests on `threads`. For group commit,
  // where a request's only wait is its group's commit.
  int fibers = 0;
  // Hostile clients (idem::httplib::Server::Options): how long a request's
  // head and body may take to arrive, open connections at most in all and
  // per client address (0: no per-address bound).
  int64_t request_deadline_ms = 10'000;
  int max_connections = 1024;
  int max_connections_per_client = 256;
  // POST /charges in one transaction with its idempotency record
  // (RouteKind::kTransactional: one commit per request; a duplicate
  // waits for the first instead of 409) instead of two-phase (claim
  // committed first, 409 while it runs, leases and takeover). Default: false.
  bool one_transaction = false;
  // One line per request (key, outcome) to this sink; none when empty.
  std::function<void(const std::string&)> log;
  // Fault injection (the demo): called after a charge is created; when it
  // answers true the provider keeps the charge (and the stored response) but
  // drops the connection instead of answering, as a lost response would.
  std::function<bool(const std::string& key)> lose_response;
  // Runs inside POST /charges before the charge is written (tests).
  std::function<void(const std::string& key)> before_charge;
  // How long each first execution of POST /charges takes before its charge
  // is written, as a real provider's work would (benchmarks: `idem bench
  // call-first`). A replay answers at once. Two-phase: the sleep holds no
  // transaction; --one-transaction: it runs inside the route's transaction.
  // Default: 0.
  int64_t charge_delay_ms = 0;
};

class ProviderServer {
 public:
  // Opens the store (creating the charges table), binds and starts serving
  // on a thread of its own. kUnavailable when the address cannot be bound.
  static Result<std::unique_ptr<ProviderServer>> Start(ProviderServerOptions options);
  ~ProviderServer();  // stops

  int port() const;
  std::string url() const;  // http://host:port
  void Stop();
  // Blocks until Stop() (from another thread or a signal).
  void Wait();
  http::Idempotency::Counters counters() const;
  // What the HTTP server did with connections (refused, closed at the deadline).
  idem::httplib::Server::Counters server_counters() const;

 private:
  struct Impl;
  explicit ProviderServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// "KEY:PRINCIPAL" pairs from flags and from a file of such lines (# comments).
Result<std::map<std::string, std::string>> ParseApiKeys(const std::vector<std::string>& pairs, const std::string& file);

}  // namespace idem::cli

#endif  // IDEM_TOOLS_IDEM_PROVIDER_SERVER_H_
