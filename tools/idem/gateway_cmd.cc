// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem gateway: idem::httplib::Gateway as a command (doc/gateway.md).
#include <atomic>
#include <chrono>
#include <iostream>
#include <mutex>
#include <sstream>

#include "commands.h"
#include "idem/claims.h"
#include "idem/httplib/gateway.h"
#include "idem/signals.h"
#include "long_running.h"

namespace idem::cli {
namespace {

// PostgreSQL connections the gateway opens at most by default (one per
// thread below this).
constexpr int64_t kDefaultMaxPool = 32;

// "a,b,,c" -> {"a", "b", "c"}; every value of a repeatable flag split so.
std::vector<std::string> SplitAll(const std::vector<std::string>& values) {
  std::vector<std::string> out;
  for (const std::string& v : values) {
    std::stringstream in(v);
    std::string item;
    while (std::getline(in, item, ','))
      if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace

const Command& GatewayCommand() {
  static const Command c{
      "gateway",
      "Stand in front of an HTTP API as a reverse proxy that gives it the Idempotency-Key contract.\n"
      "A guarded request (--methods, --paths) with an Idempotency-Key is forwarded to --upstream at most\n"
      "once per (principal, key); a repeat gets the stored status, headers and body with\n"
      "Idempotent-Replayed: true, a repeat while the first runs 409, the key with another request 422.\n"
      "Once a request was forwarded and its answer lost (the upstream timed out, or the gateway died),\n"
      "the key is never forwarded again: repeats get 503 outcome-unknown (unless --upstream-honours-key).\n"
      "Other requests are forwarded as they are. GET /metrics serves Prometheus metrics. Logs one line\n"
      "per guarded request to stderr. Stops on SIGINT/SIGTERM. See doc/gateway.md.",
      "--upstream URL [--listen HOST:PORT] [--store URL] [--methods M,...] [--paths P,...]\n"
      "       [--principal-header H] [--require-key|--pass-keyless] [--upstream-honours-key]\n"
      "       [--forward-again-after-5xx]\n"
      "       [--max-stored-body BYTES] [--max-body BYTES] [--max-spooled-body BYTES] [--spool-dir DIR]\n"
      "       [--max-keys-per-principal N]\n"
      "       [--lease DURATION] [--upstream-timeout DURATION]\n"
      "       [--connect-timeout DURATION] [--retention DURATION] [--ca-file F] [--ca-dir D] [--threads T]\n"
      "       [--keep-alive-requests N] [--trusted-proxy CIDR]... [--proxy-protocol]\n"
      "       [--json] [--quiet] [--wait-ms N] [--purge-every DURATION] [--web HOST:PORT]",
      {{"upstream", "URL", "", "the API behind: http://HOST:PORT[/base] or https://... (certificate verified)"},
       {"listen", "HOST:PORT", "127.0.0.1:8080", "address to serve on (loopback by default)"},
       {"store", "URL", "sqlite:idem-gateway.db",
        "keys and stored responses: sqlite:PATH or postgres://... (PostgreSQL: a connection per\n"
        "          thread, up to 32, unless the URL says ?idem_pool_size=N)"},
       {"methods", "M,...", "POST,PATCH", "methods guarded (repeatable)", true},
       {"paths", "P,...", "", "path prefixes guarded (repeatable; default: every path)", true},
       {"principal-header", "H", "Authorization", "the header that names the caller (hashed; 401 without it)"},
       {"require-key", "", "", "a guarded request without Idempotency-Key gets 400 (the default)"},
       {"pass-keyless", "", "", "forward a guarded request without Idempotency-Key unguarded"},
       {"upstream-honours-key", "", "",
        "the upstream deduplicates the forwarded Idempotency-Key itself: a key whose\n"
        "          outcome is unknown is forwarded again, with the same key"},
       {"forward-again-after-5xx", "", "",
        "an upstream 5xx frees its key (a retry is forwarded again); by default it is\n"
        "          stored and replayed, since the upstream may have acted before failing"},
       {"max-stored-body", "BYTES", "1048576",
        "larger responses reach their first client but are not stored (a repeat gets 410)"},
       {"max-body", "BYTES", "1048576", "larger request bodies get 413 (unless spooled: --max-spooled-body)"},
       {"max-spooled-body", "BYTES", "0",
        "request bodies over --max-body, up to this, are spooled to a temporary file (guarded)\n"
        "          or streamed straight through (unguarded) instead of held in memory; 0: none"},
       {"spool-dir", "DIR", "", "where spooled bodies go (default: $TMPDIR, else /tmp)"},
       {"max-keys-per-principal", "N", "0",
        "keys one principal may hold stored at once; a new key past it gets 429 (0: no limit)"},
       {"lease", "DURATION", "90s",
        "how long a forwarded request holds its key (more than connect-timeout + 2 x\n"
        "          upstream-timeout)"},
       {"upstream-timeout", "DURATION", "30s", "each read or write to the upstream"},
       {"connect-timeout", "DURATION", "2s", "connecting to the upstream"},
       {"retention", "DURATION", "24h", "how long a stored response is replayed"},
       {"ca-file", "F", "", "CAs trusted for an https upstream (default: the system's)"},
       {"ca-dir", "D", "", "a directory of CAs trusted for an https upstream"},
       {"threads", "T", "64", "requests handled at once"},
       {"keep-alive-requests", "N", "1000",
        "requests served on one client connection before it is closed (the client reconnects)"},
       {"trusted-proxy", "CIDR", "",
        "a load balancer's address or CIDR block (repeatable): the per-client connection bound\n"
        "          counts the client it names in X-Forwarded-For (or the PROXY header)",
        true},
       {"proxy-protocol", "", "", "trusted proxies start each connection with a PROXY header (v1 or v2)"},
       {"json", "", "", "one JSON object per guarded request (method, path, key, outcome, status, latency_ms)"},
       {"quiet", "", "", "no per-request log lines"},
       {"wait-ms", "N", "0",
        "a repeat while its key's first request is at the upstream waits up to N ms for\n"
        "          its answer (then 409 with Retry-After); 0: 409 at once"},
       {"purge-every", "DURATION", "10m", "delete keys whose retention ended this often (0: never)"},
       {"web", "HOST:PORT", "", "serve the live view on GET / (events on /events, the metrics on /metrics)"}}};
  return c;
}

int RunGateway(const Args& args) {
  const std::string cmd = "gateway";
  const bool json = args.Bool("json");
  if (args.Get("upstream").empty()) return Fail(cmd, Status::InvalidArgument("--upstream URL is required"));
  const auto host_port = ListenFlag(args);
  if (!host_port.ok()) return Fail(cmd, host_port.status());
  if (Status s = LiveView::Validate(args); !s.ok()) return Fail(cmd, s);
  if (args.Bool("require-key") && args.Bool("pass-keyless"))
    return Fail(cmd, Status::InvalidArgument("--require-key and --pass-keyless exclude each other"));
  auto lease = ParseDurationMs(args.Get("lease"));
  auto timeout = ParseDurationMs(args.Get("upstream-timeout"));
  auto connect = ParseDurationMs(args.Get("connect-timeout"));
  auto retention = ParseDurationMs(args.Get("retention"));
  auto purge_every = ParseDurationMs(args.Get("purge-every"));
  for (const auto* r : {&lease, &timeout, &connect, &retention, &purge_every})
    if (!r->ok()) return Fail(cmd, r->status());
  if (*retention <= 0) return Fail(cmd, Status::InvalidArgument("--retention must be more than 0"));
  auto stored = args.GetInt("max-stored-body", 1, int64_t{1} << 30);
  auto body = args.GetInt("max-body", 1, int64_t{1} << 30);
  auto spooled = args.GetInt("max-spooled-body", 0, int64_t{1} << 40);
  auto threads = args.GetInt("threads", 1, 1024);
  auto wait = args.GetInt("wait-ms", 0, 3'600'000);
  auto keep_alive = args.GetInt("keep-alive-requests", 1, 1'000'000'000);
  auto max_keys = args.GetInt("max-keys-per-principal", 0, int64_t{1} << 40);
  for (const auto* r : {&stored, &body, &spooled, &threads, &wait, &keep_alive, &max_keys})
    if (!r->ok()) return Fail(cmd, r->status());

  const std::vector<std::string> trusted = SplitAll(args.GetAll("trusted-proxy"));
  for (const std::string& t : trusted)
    if (!httplib::Server::Check({.trusted_proxies = {t}}).ok())
      return Fail(cmd, Status::InvalidArgument("--trusted-proxy: '" + t +
                                               "' is not an IP address or CIDR block (10.0.0.0/8, fd00::/8)"));
  if (args.Bool("proxy-protocol") && trusted.empty())
    return Fail(cmd, Status::InvalidArgument("--proxy-protocol needs --trusted-proxy (the proxies that send it)"));

  httplib::Gateway::Options o;
  o.trusted_proxies = trusted;
  o.proxy_protocol = args.Bool("proxy-protocol");
  o.upstream = args.Get("upstream");
  o.host = host_port->first;
  o.port = host_port->second;
  if (args.Has("methods")) {
    o.methods.clear();
    for (const std::string& m : SplitAll(args.GetAll("methods"))) o.methods.insert(m);
  }
  o.paths = SplitAll(args.GetAll("paths"));
  o.principal_header = args.Get("principal-header");
  o.require_key = !args.Bool("pass-keyless");
  o.upstream_honours_key = args.Bool("upstream-honours-key");
  o.forward_again_after_5xx = args.Bool("forward-again-after-5xx");
  o.max_stored_body = static_cast<size_t>(*stored);
  o.max_body_bytes = static_cast<size_t>(*body);
  o.max_spooled_body = static_cast<size_t>(*spooled);
  o.spool_dir = args.Get("spool-dir");
  o.max_keys_per_principal = *max_keys;
  o.lease_ms = *lease;
  o.upstream_timeout_ms = *timeout;
  o.connect_timeout_ms = *connect;
  o.ca_file = args.Get("ca-file");
  o.ca_dir = args.Get("ca-dir");
  o.threads = static_cast<int>(*threads);
  o.keep_alive_requests = static_cast<int>(*keep_alive);
  o.wait_ms = *wait;
  o.purge_every_ms = *purge_every;
  auto mu = std::make_shared<std::mutex>();
  const auto say = [mu, json](const std::string& line) {
    std::lock_guard lock(*mu);
    if (json) {
      const auto ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      std::cerr << Json().Add("ts_ms", static_cast<int64_t>(ms)).Add("msg", line).str() << "\n";
    } else {
      std::cerr << "idem gateway: " << line << "\n";
    }
  };
  if (!args.Bool("quiet")) o.log = say;
  if (json && !args.Bool("quiet"))  // one object per guarded request
    o.request_log = [mu](const httplib::Gateway::Options::RequestLog& r) {
      const auto ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      const std::string line = Json()
                                   .Add("ts_ms", static_cast<int64_t>(ms))
                                   .Add("method", std::string(r.method))
                                   .Add("path", std::string(r.path))
                                   .Add("key", std::string(r.key))
                                   .Add("outcome", std::string(r.outcome))
                                   .Add("status", r.status)
                                   .Add("latency_ms", r.latency_seconds * 1000)
                                   .str();
      std::lock_guard lock(*mu);
      std::cerr << line << "\n";
    };

  // The store last among the checks: flags are wrong before a store is
  // unreachable.
  // On PostgreSQL, a connection per thread up to 32: replays read on
  // pooled connections (8 make a quarter of 32's rate), while past 32 the
  // claims gain nothing (doc/gateway.md, "What it costs").
  int64_t pool = 0;
  const std::string store_url =
      WithDefaultPoolSize(args.Get("store"), std::min<int64_t>(*threads, kDefaultMaxPool), &pool);
  auto opened = OpenClaimStore(store_url);
  if (!opened.ok()) return Fail(cmd, opened.status());
  auto claims = Claims::Open(*opened->claims, {.retention_ms = *retention});
  if (!claims.ok()) return Fail(cmd, claims.status());
  o.claims = claims->get();
  // The live view's /metrics are the gateway's, once it is open.
  auto serving = std::make_shared<std::atomic<httplib::Gateway*>>(nullptr);
  auto view = LiveView::Start(args, "idem gateway", [serving] {
    httplib::Gateway* g = serving->load();
    return g != nullptr ? g->Metrics() : std::string();
  });
  if (!view.ok()) return Fail(cmd, view.status());
  if (*view) o.observer = (*view)->observer();
  auto gateway = httplib::Gateway::Open(o);
  if (!gateway.ok()) return Fail(cmd, gateway.status());
  serving->store(gateway->get());
  StopOnSignals(&(*gateway)->server());
  say("serving http://" + o.host + ":" + std::to_string((*gateway)->port()) + " in front of " + o.upstream +
      " (store " + opened->kind + (pool > 0 ? ", " + std::to_string(pool) + " connections" : "") +
      (o.upstream_honours_key ? ", upstream honours keys" : "") + ")");
  Status ran = (*gateway)->Run();
  StopOnSignals(nullptr);
  serving->store(nullptr);
  if (!ran.ok()) return Fail(cmd, ran);
  say("stopped");
  return kExitOk;
}

}  // namespace idem::cli
