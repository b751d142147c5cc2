// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem chaos gateway: the command (its flags, their checks) and its report.
#include "chaos/gateway.h"

#include <cstdio>
#include <filesystem>
#include <iostream>

#include "chaos/report.h"
#include "chaos/workdir.h"
#include "commands.h"
#include "components.h"

namespace idem::cli {

const Command& ChaosGatewayCommand() {
  static const Command c{
      "chaos gateway",
      "Prove idem gateway's at-most-once forwarding under failures: --gateways `idem gateway` processes on\n"
      "one store (several on PostgreSQL), in front of an upstream in this process that counts its\n"
      "executions per Idempotency-Key and answers each with a body of its own. Clients send each key and\n"
      "retry it with the same key until a final answer, through proxies that lose answers after the\n"
      "request was sent, while the gateways are SIGKILLed at random times and at the kill points\n"
      "http.before_complete (forwarded, answer not stored) and http.after_claim, and restarted. Then\n"
      "every key must have run at most once upstream, every client that got a 2xx must get the same body\n"
      "on every repeat, and every key must have had a final answer (a 2xx, or 503 outcome-unknown, which\n"
      "is counted). Exits 0 only then. --peer-cmd puts a peer proxy through the same run.",
      "[--store URL] [--gateways G] [--keys N] [--kills K] [--seed S] [--json]",
      {{"store", "URL", "sqlite:DIR/gateway.db", "the gateways' store: sqlite:PATH or postgres://..."},
       {"gateways", "G", "3 (PostgreSQL), 1 (SQLite)", "gateway processes on the store"},
       {"keys", "N", "400", "keys sent, at least (more while the kills asked for are not made)"},
       {"clients", "C", "8", "client threads"},
       {"kills", "K", "10", "at least this many SIGKILLs of gateways"},
       {"seed", "S", "1", "seed of the kills, losses and clients' choices"},
       {"dir", "DIR", "", "work directory: the gateways' logs, the SQLite store (default: a fresh temporary one)"},
       {"lost-response-rate", "P", "0.05", "share of answers lost between a client and a gateway"},
       {"upstream-lost-rate", "P", "0.02",
        "share of executions the upstream answers only after the gateways' upstream\n"
        "          timeout (their outcome unknown to the gateway)"},
       {"twin-rate", "P", "0.1", "share of keys whose first request is sent twice at once"},
       {"repeats", "N", "2", "repeats of a key after its 2xx, each compared with it"},
       {"upstream-delay-ms", "MS", "5", "an execution takes 0..MS"},
       {"lease", "DURATION", "1500", "the gateways' --lease"},
       {"upstream-timeout", "DURATION", "400", "the gateways' --upstream-timeout"},
       {"key-timeout", "DURATION", "30s", "a key with no final answer by then is unresolved (a failure)"},
       {"hits", "N", "6", "a kill point fires at a hit drawn from 1..N"},
       {"broken", "MODE", "",
        "upstream-honours-key: run the gateways with --upstream-honours-key in front of\n"
        "          this upstream, which does not deduplicate: the check must fail"},
       {"peer-cmd", "CMD", "",
        "instead of idem gateway, a shell command that serves a peer proxy on $PORT in\n"
        "          front of $UPSTREAM ($UPSTREAM_TIMEOUT_MS: its upstream timeout); killed at\n"
        "          random times only"},
       {"peer-name", "NAME", "peer", "the peer's name in the report"},
       {"json", "", "", "print one JSON object instead of the table"}}};
  return c;
}

namespace chaos {
namespace {

Status Parse(const Args& args, GatewayConfig& cfg) {
  auto integer = [&](const char* name, int64_t& out, int64_t lo, int64_t hi) -> Status {
    if (!args.Has(name)) return Status::OK();
    IDEM_ASSIGN_OR_RETURN(out, args.GetInt(name, lo, hi));
    return Status::OK();
  };
  auto fraction = [&](const char* name, double& out) -> Status {
    if (!args.Has(name)) return Status::OK();
    IDEM_ASSIGN_OR_RETURN(out, args.GetDouble(name, 0, 1));
    return Status::OK();
  };
  auto duration = [&](const char* name, int64_t& out) -> Status {
    if (!args.Has(name)) return Status::OK();
    IDEM_ASSIGN_OR_RETURN(out, ParseDurationMs(args.Get(name)));
    if (out <= 0) return Status::InvalidArgument("--" + std::string(name) + " must be more than 0");
    return Status::OK();
  };
  cfg.store = args.Has("store") ? args.Get("store") : "";
  int64_t gateways = cfg.store.empty() || !IsPostgresScheme(cfg.store) ? 1 : 3, clients = cfg.clients, seed = 1,
          repeats = cfg.repeats;
  IDEM_RETURN_IF_ERROR(integer("gateways", gateways, 1, 16));
  IDEM_RETURN_IF_ERROR(integer("keys", cfg.keys, 1, 10'000'000));
  IDEM_RETURN_IF_ERROR(integer("clients", clients, 1, 256));
  IDEM_RETURN_IF_ERROR(integer("kills", cfg.kills, 0, 1'000'000));
  IDEM_RETURN_IF_ERROR(integer("seed", seed, 0, INT64_MAX));
  IDEM_RETURN_IF_ERROR(integer("repeats", repeats, 0, 100));
  IDEM_RETURN_IF_ERROR(integer("upstream-delay-ms", cfg.upstream_delay_ms, 0, 60'000));
  IDEM_RETURN_IF_ERROR(integer("hits", cfg.hits, 1, 1'000'000));
  IDEM_RETURN_IF_ERROR(fraction("lost-response-rate", cfg.lost_response_rate));
  IDEM_RETURN_IF_ERROR(fraction("upstream-lost-rate", cfg.upstream_lost_rate));
  IDEM_RETURN_IF_ERROR(fraction("twin-rate", cfg.twin_rate));
  IDEM_RETURN_IF_ERROR(duration("lease", cfg.lease_ms));
  IDEM_RETURN_IF_ERROR(duration("upstream-timeout", cfg.upstream_timeout_ms));
  IDEM_RETURN_IF_ERROR(duration("key-timeout", cfg.key_timeout_ms));
  cfg.gateways = static_cast<int>(gateways);
  cfg.clients = static_cast<int>(clients);
  cfg.seed = static_cast<uint64_t>(seed);
  cfg.repeats = static_cast<int>(repeats);
  cfg.broken = args.Get("broken");
  if (!cfg.broken.empty() && cfg.broken != kBrokenHonoursKey)
    return Status::InvalidArgument("--broken must be upstream-honours-key, got '" + cfg.broken + "'");
  cfg.peer_cmd = args.Get("peer-cmd");
  cfg.peer_name = args.Get("peer-name");
  if (!cfg.peer_cmd.empty() && !cfg.broken.empty())
    return Status::InvalidArgument("--broken breaks idem gateway: not with --peer-cmd");
  if (cfg.peer_cmd.empty() && cfg.lease_ms <= cfg.connect_timeout_ms + 2 * cfg.upstream_timeout_ms)
    return Status::InvalidArgument("--lease must be more than 2 x --upstream-timeout + " +
                                   std::to_string(cfg.connect_timeout_ms) + " ms (the gateway's rule)");
  cfg.json = args.Bool("json");
  cfg.dir = args.Get("dir");
  IDEM_RETURN_IF_ERROR(MakeRunDir(cfg.dir));
  if (cfg.store.empty()) {
    cfg.store = "sqlite:" + cfg.dir + "/gateway.db";
    for (const char* suffix : {"", "-wal", "-shm"}) IDEM_RETURN_IF_ERROR(RemoveFile(cfg.dir + "/gateway.db" + suffix));
  }
  return Status::OK();
}

int GatewayReport(const GatewayConfig& cfg, const GatewayResult& r) {
  const std::string proxy = cfg.peer_cmd.empty() ? "idem-gateway" : cfg.peer_name;
  const double keys_per_s = r.seconds > 0 ? static_cast<double>(r.keys) / r.seconds : 0;
  const double requests_per_s = r.seconds > 0 ? static_cast<double>(r.requests) / r.seconds : 0;
  if (cfg.json) {
    Json j;
    j.Add("mode", "gateway")
        .Add("proxy", proxy)
        .Add("store", r.store_kind)
        .Add("gateways", cfg.gateways)
        .Add("keys", r.keys)
        .Add("clients", cfg.clients)
        .Add("requests", r.requests)
        .Add("twins", r.twins)
        .Add("kills", r.kills)
        .Add("kills_requested", cfg.kills)
        .AddRaw("kills_by_point", JsonCounts(r.kills_by_point))
        .Add("restarts", r.restarts)
        .Add("start_failures", r.start_failures)
        .Add("responses_lost", r.responses_lost)
        .Add("upstream_timeouts", r.upstream_timeouts)
        .AddRaw("statuses", JsonCounts(r.statuses))
        .Add("answered_2xx", r.answered_2xx)
        .Add("outcome_unknown", r.outcome_unknown)
        .Add("in_progress_answers", r.in_progress)
        .Add("transport_errors", r.transport_errors)
        .Add("executions", r.executions)
        .Add("executed_keys", r.executed_keys)
        .Add("duplicated_keys", r.duplicated_keys)
        .Add("duplicate_executions", r.duplicate_executions)
        .Add("duplicated_twinned_keys", r.duplicated_twinned_keys)
        .Add("replay_mismatches", r.replay_mismatches)
        .Add("unexpected_bodies", r.unexpected_bodies)
        .Add("unexpected_statuses", r.unexpected_statuses)
        .Add("unresolved", r.unresolved)
        .Add("seconds", r.seconds)
        .Add("keys_per_s", keys_per_s)
        .Add("requests_per_s", requests_per_s)
        .Add("broken", cfg.broken)
        .Add("interrupted", r.interrupted)
        .Add("ok", r.Ok())
        .Add("seed", static_cast<int64_t>(cfg.seed))
        .Add("dir", cfg.dir);
    std::cout << j.str() << "\n";
  } else {
    std::cout << "\nidem chaos gateway: seed " << cfg.seed << ", " << cfg.gateways << " x " << proxy << " on "
              << r.store_kind << (cfg.broken.empty() ? "" : ", broken: " + cfg.broken) << "\n\n";
    Row("keys / requests (retries, repeats, twins)", std::to_string(r.keys) + " / " + std::to_string(r.requests));
    Row("kills (SIGKILL)",
        std::to_string(r.kills) + " of " + std::to_string(cfg.kills) + " requested" + Mark(r.kills_reached));
    for (const auto& [k, v] : r.kills_by_point) Row("  " + k, std::to_string(v));
    Row("answers lost (client side) / upstream too late",
        std::to_string(r.responses_lost) + " / " + std::to_string(r.upstream_timeouts));
    Row("keys answered 2xx", std::to_string(r.answered_2xx));
    Row("keys answered outcome-unknown (503)", std::to_string(r.outcome_unknown));
    Row("upstream executions / keys executed", std::to_string(r.executions) + " / " + std::to_string(r.executed_keys));
    Row("keys executed more than once (of them sent twice at once)", std::to_string(r.duplicated_keys) + " (" +
                                                                         std::to_string(r.duplicated_twinned_keys) +
                                                                         ")" + Mark(r.duplicated_keys == 0));
    Row("repeats not answered as the first 2xx", std::to_string(r.replay_mismatches) + Mark(r.replay_mismatches == 0));
    Row("2xx bodies the upstream never made", std::to_string(r.unexpected_bodies) + Mark(r.unexpected_bodies == 0));
    Row("unexpected answers", std::to_string(r.unexpected_statuses) + Mark(r.unexpected_statuses == 0));
    Row("keys with no final answer", std::to_string(r.unresolved) + Mark(r.unresolved == 0));
    char line[64];
    std::snprintf(line, sizeof line, "%.1f s, %.0f keys/s", r.seconds, keys_per_s);
    Row("time", line);
    for (const auto& e : r.examples) std::cout << "  e.g. " << e << "\n";
    std::cout << (r.Ok() ? "  OK: every key executed at most once upstream, every 2xx replayed the same\n"
                         : "  FAILED\n")
              << "  files in " << cfg.dir << "\n";
  }
  return r.Ok() ? kExitOk : kExitCheckFailed;
}

}  // namespace
}  // namespace chaos

int RunChaosGateway(const Args& args) {
  using chaos::GatewayConfig;
  const std::string cmd = "chaos gateway";
  GatewayConfig cfg;
  if (Status s = chaos::Parse(args, cfg); !s.ok()) return Fail(cmd, s);
  std::cerr << "idem chaos gateway: seed " << cfg.seed << ", " << cfg.gateways << " "
            << (cfg.peer_cmd.empty() ? "gateways" : cfg.peer_name) << ", " << cfg.keys << " keys, " << cfg.kills
            << " kills; files in " << cfg.dir << "\n";
  auto r = chaos::RunGatewayChaos(cfg);
  if (!r.ok()) return Fail(cmd, r.status());
  return chaos::GatewayReport(cfg, *r);
}

}  // namespace idem::cli
