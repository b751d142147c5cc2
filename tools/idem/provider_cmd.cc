// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem provider: the seed's payment provider as an HTTP server.
#include <signal.h>

#include <cstdlib>
#include <iostream>
#include <mutex>

#include "commands.h"
#include "long_running.h"
#include "provider_server.h"

namespace idem::cli {

const Command& ProviderCommand() {
  static const Command c{
      "provider",
      "Run the seed's payment provider as an HTTP server. POST /charges with a JSON body\n"
      "{\"amount\": 4000, \"currency\": \"usd\", \"customer\": \"cus_1042\", \"description\": \"...\"} (amount in\n"
      "cents) and an Idempotency-Key header creates one charge per key and answers 201 with it; a repeat\n"
      "of the key replays that answer (Idempotent-Replayed: true). GET /charges/{id} and\n"
      "GET /charges?customer=... read charges back. Clients authenticate with Authorization: Bearer KEY.\n"
      "A body that is not a valid charge gets 400 before its key is claimed (the key stays free for the\n"
      "corrected request). Stripe's dialect, for Stripe's own client libraries: POST /v1/charges with a\n"
      "form body (amount, currency, customer, description; Idempotency-Key optional) answers 200 with a\n"
      "Stripe charge object and refuses in Stripe's error shape; GET /v1/charges/{id} and\n"
      "GET /v1/charges (limit, starting_after, customer) read them back.\n"
      "GET /metrics serves Prometheus counters (no authentication). --web HOST:PORT\n"
      "serves the live view: a page animating each key's first execution, replays and conflicts.\n"
      "Logs one line per request to stderr. Stops on SIGINT/SIGTERM.",
      "--api-key KEY:PRINCIPAL [--api-key ...] [--api-keys FILE] [--listen HOST:PORT] [--store URL]\n"
      "       [--retention DURATION] [--lease DURATION] [--wait DURATION] [--charge-delay DURATION] "
      "[--one-transaction] [--group-commit N]\n"
      "       [--committers C] [--threads T] [--fibers F] [--max-keys N] [--request-deadline DURATION]\n"
      "       [--max-connections N] [--max-connections-per-client N] [--web HOST:PORT] [--quiet]",
      {{"listen", "HOST:PORT", "127.0.0.1:8080", "address to serve on (loopback by default)"},
       {"store", "URL", "sqlite:idem-provider.db", "the provider's database: charges and idempotency records"},
       {"api-key", "KEY:PRINCIPAL", "", "an API key and the principal it authenticates (repeatable)", true},
       {"api-keys", "FILE", "", "a file of KEY:PRINCIPAL lines (# comments)"},
       {"retention", "DURATION", "24h", "how long a stored response is replayed"},
       {"lease", "DURATION", "30s", "how long a request may run before a retry may take its key over"},
       {"wait", "DURATION", "0s", "how long a duplicate waits for the first request before 409"},
       {"charge-delay", "DURATION", "0s",
        "how long each first execution of POST /charges works before its charge is\n"
        "          written, as a real provider's would (replays answer at once)"},
       {"one-transaction", "", "",
        "run POST /charges in one transaction with its idempotency record (one\n"
        "          commit per request; a duplicate waits for the first instead of 409)"},
       {"group-commit", "N", "0",
        "with --one-transaction: requests that arrive while a commit is under way share\n"
        "          the next transaction and its commit (one fsync), up to N (0: each its own)"},
       {"committers", "C", "1", "with --group-commit: transactions open at once (1 for SQLite; a few for PostgreSQL)"},
       {"threads", "T", "32",
        "threads that run requests (a connection waiting for its request's bytes holds\n"
        "          none)"},
       {"fibers", "F", "0",
        "with --group-commit: serve the connections and their requests as fibers on F\n"
        "          threads instead (a request gives its thread up while its group commits: fewer\n"
        "          thread switches on a machine with few cores)"},
       {"request-deadline", "DURATION", "10s",
        "how long a request's head and body may take to arrive in all; a connection\n"
        "          that misses it is closed unanswered (slow clients, slowloris)"},
       {"max-connections", "N", "1024", "open connections at most; one more is answered 503 and closed"},
       {"max-connections-per-client", "N", "256",
        "open connections at most from one client address (0: no such bound, behind a\n"
        "          proxy); one more is answered 503 and closed"},
       {"quiet", "", "", "no per-request log lines"},
       {"web", "HOST:PORT", "", "serve the live view on GET / (events on /events)"},
       {"max-keys", "N", "100000",
        "stored idempotency keys per principal and route before 429 (a client\n"
        "          cannot exhaust storage)"},
       {"lose-responses", "P", "0",
        "fault injection for tests and idem chaos: on this fraction of keys (chosen\n"
        "          by --seed) the first execution keeps the charge and its stored response\n"
        "          but drops the connection instead of answering, as a lost response would"},
       {"seed", "S", "1", "seed of --lose-responses"}}};
  return c;
}

int RunProvider(const Args& args) {
  const std::string cmd = "provider";
  auto keys = ParseApiKeys(args.GetAll("api-key"), args.Get("api-keys"));
  if (!keys.ok()) return Fail(cmd, keys.status());
  const auto host_port = ListenFlag(args);
  if (!host_port.ok()) return Fail(cmd, host_port.status());
  auto retention = ParseDurationMs(args.Get("retention"));
  auto lease = ParseDurationMs(args.Get("lease"));
  auto wait = ParseDurationMs(args.Get("wait"));
  auto charge_delay = ParseDurationMs(args.Get("charge-delay"));
  for (const auto* r : {&retention, &lease, &wait, &charge_delay})
    if (!r->ok()) return Fail(cmd, r->status());
  if (*lease <= 0) return Fail(cmd, Status::InvalidArgument("--lease must be more than 0"));
  if (*retention <= 0) return Fail(cmd, Status::InvalidArgument("--retention must be more than 0"));
  auto lose = args.GetDouble("lose-responses", 0, 1);
  if (!lose.ok()) return Fail(cmd, lose.status());
  const double lose_rate = *lose;
  auto seed = args.GetInt("seed");
  if (!seed.ok()) return Fail(cmd, seed.status());
  auto group = args.GetInt("group-commit");
  auto committers = args.GetInt("committers");
  auto threads = args.GetInt("threads");
  auto fibers = args.GetInt("fibers");
  auto max_connections = args.GetInt("max-connections");
  auto per_client = args.GetInt("max-connections-per-client");
  for (const auto* r : {&group, &committers, &threads, &fibers, &max_connections, &per_client})
    if (!r->ok()) return Fail(cmd, r->status());
  auto request_deadline = ParseDurationMs(args.Get("request-deadline"));
  if (!request_deadline.ok()) return Fail(cmd, request_deadline.status());
  if (*request_deadline <= 0) return Fail(cmd, Status::InvalidArgument("--request-deadline must be more than 0"));
  if (*max_connections < 1 || *max_connections > 1'000'000)
    return Fail(cmd, Status::InvalidArgument("--max-connections must be 1..1000000"));
  if (*per_client < 0 || *per_client > 1'000'000)
    return Fail(cmd, Status::InvalidArgument("--max-connections-per-client must be 0..1000000"));
  if (*group < 0 || *group > 10'000) return Fail(cmd, Status::InvalidArgument("--group-commit must be 0..10000"));
  if (*committers < 1 || *committers > 64) return Fail(cmd, Status::InvalidArgument("--committers must be 1..64"));
  if (*threads < 1 || *threads > 1024) return Fail(cmd, Status::InvalidArgument("--threads must be 1..1024"));
  if (*fibers < 0 || *fibers > 64) return Fail(cmd, Status::InvalidArgument("--fibers must be 0..64"));
  if (*fibers > 0 && *group <= 1)
    return Fail(cmd, Status::InvalidArgument(
                         "--fibers needs --group-commit (a request's only wait must be its group's commit)"));
  if (*group > 1 && !args.Bool("one-transaction"))
    return Fail(cmd, Status::InvalidArgument("--group-commit needs --one-transaction (it groups transactions)"));
  auto max_keys = args.GetInt("max-keys");
  if (!max_keys.ok()) return Fail(cmd, max_keys.status());
  if (*max_keys < 1) return Fail(cmd, Status::InvalidArgument("--max-keys must be at least 1"));

  // Signals go to this thread's sigwait, never to a server thread.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  ProviderServerOptions o;
  o.host = host_port->first;
  o.port = host_port->second;
  o.store_url = args.Get("store");
  o.api_keys = std::move(*keys);
  o.retention_ms = *retention;
  o.idempotency.max_keys_per_principal = *max_keys;
  o.lease_ms = *lease;
  o.wait_ms = *wait;
  o.charge_delay_ms = *charge_delay;
  o.one_transaction = args.Bool("one-transaction");
  o.idempotency.group_commit_max = static_cast<int>(*group);
  o.idempotency.group_committers = static_cast<int>(*committers);
  o.threads = static_cast<int>(*threads);
  o.fibers = static_cast<int>(*fibers);
  o.request_deadline_ms = *request_deadline;
  o.max_connections = static_cast<int>(*max_connections);
  o.max_connections_per_client = static_cast<int>(*per_client);
  if (!args.Bool("quiet")) {
    auto mu = std::make_shared<std::mutex>();
    o.log = [mu](const std::string& line) {
      std::lock_guard lock(*mu);
      std::cerr << "idem provider: " << line << "\n";
    };
  }
  if (lose_rate > 0) {
    // Which keys lose their first response is a function of the seed and
    // the key alone, so the same run loses the same responses.
    o.lose_response = [lose_rate, seed = static_cast<uint64_t>(*seed), log = o.log](const std::string& key) {
      uint64_t h = 1469598103934665603ULL ^ seed;
      for (unsigned char c : key) h = (h ^ c) * 1099511628211ULL;
      h ^= h >> 33;
      h *= 0xff51afd7ed558ccdULL;
      h ^= h >> 33;
      const bool lose = static_cast<double>(h >> 11) / 9007199254740992.0 < lose_rate;
      if (lose && log) log("key=" + key + " outcome=response-dropped (--lose-responses)");
      return lose;
    };
  }
  auto view = LiveView::Start(args, "idem provider", nullptr);
  if (!view.ok()) return Fail(cmd, view.status());
  if (*view) o.idempotency.observer = (*view)->observer();
  auto server = ProviderServer::Start(std::move(o));
  if (!server.ok()) return Fail(cmd, server.status());
  std::cerr << "idem provider: serving " << (*server)->url() << " (store " << args.Get("store") << ", retention "
            << *retention / 1000 << " s)\n";
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::cerr << "idem provider: stopping on signal " << sig << "\n";
  (*server)->Stop();
  return kExitOk;
}

}  // namespace idem::cli
