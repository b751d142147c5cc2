// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "chaos/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "cli.h"

namespace idem::cli::chaos {

std::string JsonCounts(const std::map<std::string, int64_t>& m) {
  Json j;
  for (const auto& [k, v] : m) j.Add(k, v);
  return j.str();
}

void Row(const std::string& k, const std::string& v) {
  std::cout << "  " << k << std::string(k.size() < 46 ? 46 - k.size() : 1, ' ') << v << "\n";
}
const char* Mark(bool good) { return good ? "  ✓" : "  ✕"; }

namespace {

// The nearest-rank percentile `p` (0..1] of `v` (sorted); -1 when empty.
int64_t Percentile(const std::vector<int64_t>& v, double p) {
  if (v.empty()) return -1;
  const auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

// --fault-cmd's recoveries: all of them, and per kind, each sorted.
std::map<std::string, std::vector<int64_t>> Recoveries(const std::vector<FaultRun>& runs) {
  std::map<std::string, std::vector<int64_t>> by;
  for (const FaultRun& r : runs) {
    if (r.recovery_ms < 0) continue;
    by[""].push_back(r.recovery_ms);
    if (!r.kind.empty()) by[r.kind].push_back(r.recovery_ms);
  }
  for (auto& [k, v] : by) std::sort(v.begin(), v.end());
  return by;
}

// What the report derives from the run before printing it.
struct Summary {
  int64_t faults = 0;  // injected, of every kind
  bool ok = false;
  std::map<std::string, std::vector<int64_t>> recoveries;  // --fault-cmd's, "" for every kind
  int64_t relay_kills = 0, stage2_kills = 0;               // the two-stage pipeline's
};

Summary Summarize(const Config& cfg, const RunFacts& run, const EffectCheck& c, const PipelineCheck* pipeline) {
  (void)cfg;
  Summary s;
  const RunCounts& counts = run.counts;
  // SQLite faults count when the VFS returned them, not when armed (a life
  // may die or finish before its operation comes).
  s.faults = c.lost_acks + c.stalls + c.lost_responses + c.vfs_faults_fired;
  for (const auto& [k, v] : counts.faults)
    if (!k.starts_with("sqlite-") && k != "network-cut-connections-reset" && k != "starvation-stops" &&
        k != "pause-consumer-taken-over")
      s.faults += v;
  const bool pipeline_ok = pipeline == nullptr || pipeline->Ok();
  s.ok = c.EffectsOk() && pipeline_ok && run.kills_reached && run.faults_reached && !run.interrupted;
  s.recoveries = Recoveries(run.fault_runs);
  // Kills by role (the two-stage pipeline's relays and stage 2).
  for (const auto& [k, v] : counts.kills) {
    if (k.starts_with("relay ")) s.relay_kills += v;
    if (k.starts_with("stage2 ")) s.stage2_kills += v;
  }
  return s;
}

// Every kind's recoveries, sorted (none: empty).
const std::vector<int64_t>& AllRecoveries(const Summary& s) {
  static const std::vector<int64_t> kNone;
  return s.recoveries.count("") ? s.recoveries.at("") : kNone;
}

void AddFaultCmdJson(const Config& cfg, const RunFacts& run, const Summary& s, Json& j) {
  const RunCounts& counts = run.counts;
  const auto& recoveries = s.recoveries;
  const std::vector<int64_t>& recovered = AllRecoveries(s);
  std::vector<std::string> each;
  for (const FaultRun& r : run.fault_runs) each.push_back(std::to_string(r.recovery_ms));
  Json by_kind;
  for (const auto& [kind, v] : recoveries) {
    if (kind.empty()) continue;
    Json k;
    k.Add("runs", static_cast<int64_t>(v.size()))
        .Add("p50_ms", Percentile(v, 0.5))
        .Add("p99_ms", Percentile(v, 0.99))
        .Add("max_ms", v.back());
    by_kind.AddRaw(kind, k.str());
  }
  j.Add("faults_requested", cfg.faults)
      .Add("fault_runs", static_cast<int64_t>(run.fault_runs.size()))
      .Add("fault_runs_failed", static_cast<int64_t>(std::count_if(run.fault_runs.begin(), run.fault_runs.end(),
                                                                   [](const FaultRun& r) { return r.failed; })))
      .Add("fault_recovery_p50_ms", Percentile(recovered, 0.5))
      .Add("fault_recovery_p99_ms", Percentile(recovered, 0.99))
      .Add("fault_recovery_max_ms", recovered.empty() ? -1 : recovered.back())
      .AddRaw("fault_recovery_by_kind", by_kind.str())
      .AddRaw("fault_recovery_ms", JsonArray(each))
      .Add("provider_start_failures", counts.provider_start_failures);
}

void AddPipelineJson(const Config& cfg, const PipelineCheck& p, const Summary& s, Json& j) {
  const int64_t relay_kills = s.relay_kills, stage2_kills = s.stage2_kills;
  j.Add("pipeline", cfg.pipeline)
      .Add("relays", static_cast<int64_t>(cfg.relays))
      .Add("relay_kills", relay_kills)
      .Add("stage2_kills", stage2_kills)
      .Add("stage2_expected", p.expected)
      .Add("stage2_applied", p.applied)
      .Add("stage2_lost", p.lost)
      .Add("stage2_duplicated", p.duplicated)
      .Add("stage2_unexpected", p.unexpected)
      .Add("relay_handed", p.relay_handed)
      .Add("relay_published", p.relay_published)
      .Add("relay_republished", p.relay_republished)
      .Add("relay_stats_published", p.relay_stats_published)
      .Add("relay_stats_republished", p.relay_stats_republished)
      .Add("relay_order_violations", p.relay_order_violations)
      .Add("stage2_order_checked", p.order_checked)
      .Add("stage2_order_violations", p.stage2_order_violations)
      .Add("stage2_reordered", p.stage2_reordered)
      .Add("stage2_deliveries", p.stage2_deliveries)
      .Add("stage2_duplicates_absorbed", p.stage2_duplicates_absorbed)
      .Add("outbox_backlog", p.outbox_backlog)
      .Add("outbox_dead_letters", p.outbox_dead_letters);
}

void PrintJson(const Config& cfg, const RunFacts& run, const EffectCheck& c, const PipelineCheck* pipeline,
               const Summary& s) {
  const RunCounts& counts = run.counts;
  const std::vector<int64_t>& leases_ms = run.provider_leases_ms;
  const int64_t faults = s.faults;
  Json j;
  j.Add("published", c.published)
      .Add("unique", c.unique)
      .Add("deliveries", c.deliveries)
      .Add("kills", counts.total_kills)
      .Add("kills_requested", cfg.kills)
      .AddRaw("kills_by_point", JsonCounts(counts.kills))
      .Add("faults", faults)
      .AddRaw("faults_by_kind", JsonCounts([&] {
                std::map<std::string, int64_t> m;
                for (const auto& [k, v] : counts.faults) m[k.starts_with("sqlite-") ? k + "-armed" : k] = v;
                m["lost-ack"] = c.lost_acks;
                m["lease-expiry-stall"] = c.stalls;
                m["lost-provider-response"] = c.lost_responses;
                if (run.store_kind == "sqlite") m["sqlite-faults-fired"] = c.vfs_faults_fired;
                return m;
              }()))
      .Add("paused_ms", counts.paused_ms)
      .Add("fenced", c.fenced)
      .AddRaw("zombies", JsonCounts(counts.zombies))
      .Add("clock_jumps_seen", c.clock_jumps_seen)
      .Add("applied", c.applied)
      .Add("lost", c.lost)
      .Add("duplicated", c.duplicated + c.provider_duplicated)
      .Add("unexpected", c.unexpected + c.provider_unexpected)
      .Add("acked_not_committed", c.acked_not_committed)
      .Add("provider_charges", c.provider_charges)
      .Add("provider_missing", c.provider_missing)
      .Add("consumer_errors", counts.consumer_errors)
      .Add("provider_restarts", counts.provider_restarts)
      .AddRaw("provider_lease_ms",
              [&] {
                std::vector<std::string> v;
                v.reserve(leases_ms.size());
                for (int64_t l : leases_ms) v.push_back(std::to_string(l));
                return JsonArray(v);
              }())
      .Add("provider_lease_range_ms",
           std::to_string(ProviderLeaseMinMs()) + ".." + std::to_string(ProviderLeaseMaxMs()))
      .Add("consumer_retry_budget_ms", ConsumerRetryBudgetMs())
      .Add("provider_leases_over_budget",
           static_cast<int64_t>(std::count_if(leases_ms.begin(), leases_ms.end(),
                                              [](int64_t l) { return l > ConsumerRetryBudgetMs(); })))
      .Add("publish_retries", run.publish_retries);
  if (!cfg.fault_cmd.empty()) AddFaultCmdJson(cfg, run, s, j);
  if (pipeline != nullptr) AddPipelineJson(cfg, *pipeline, s, j);
  const bool interrupted = run.interrupted, ok = s.ok;
  j.Add("seconds", run.seconds)
      .Add("source", run.source_kind)
      .Add("store", run.store_kind)
      .Add("interrupted", interrupted)
      .Add("ok", ok)
      .Add("seed", static_cast<int64_t>(cfg.seed))
      .Add("dir", cfg.dir);
  std::cout << j.str() << "\n";
}

void PipelineTable(const Config& cfg, const PipelineCheck& p, const Summary& s) {
  const int64_t relay_kills = s.relay_kills, stage2_kills = s.stage2_kills;
  Row("two-stage: relays / stage-2 consumers",
      std::to_string(cfg.relays) + " / " + std::to_string(cfg.stage2_consumers));
  Row("  relay kills / stage-2 kills", std::to_string(relay_kills) + " / " + std::to_string(stage2_kills));
  Row("  relay hand-overs / published / republished", std::to_string(p.relay_handed) + " / " +
                                                          std::to_string(p.relay_published) + " / " +
                                                          std::to_string(p.relay_republished));
  Row("  relay order violations (per key)",
      std::to_string(p.relay_order_violations) + Mark(p.relay_order_violations == 0));
  Row("  stage-2 applied / expected", std::to_string(p.applied) + " / " + std::to_string(p.expected) +
                                          Mark(p.applied == p.expected && p.effects == p.expected));
  Row("  stage-2 lost / duplicated / unexpected", std::to_string(p.lost) + " / " + std::to_string(p.duplicated) +
                                                      " / " + std::to_string(p.unexpected) +
                                                      Mark(p.lost + p.duplicated + p.unexpected == 0));
  Row("  stage-2 receipts out of order (per key)",
      p.order_checked ? std::to_string(p.stage2_order_violations) + Mark(p.stage2_order_violations == 0)
                      : "not checked (several stage-2 consumers)");
  Row("  stage-2 applied out of order (information)", std::to_string(p.stage2_reordered));
  Row("  stage-2 duplicates absorbed by its Inbox", std::to_string(p.stage2_duplicates_absorbed));
  Row("  outbox left / dead letters", std::to_string(p.outbox_backlog) + " / " + std::to_string(p.outbox_dead_letters) +
                                          Mark(p.outbox_backlog == 0 && p.outbox_dead_letters == 0));
}

// The provider's leases, and --fault-cmd's runs and recoveries.
void LeasesAndFaultsTable(const Config& cfg, const RunFacts& run, const Summary& s) {
  const std::vector<int64_t>& leases_ms = run.provider_leases_ms;
  const RunCounts& counts = run.counts;
  const auto& recoveries = s.recoveries;
  {
    std::string leases;
    int64_t over = 0;
    for (int64_t l : leases_ms) {
      if (!leases.empty()) leases += ' ';
      leases += std::to_string(l);
      over += l > ConsumerRetryBudgetMs() ? 1 : 0;
    }
    Row("provider leases (ms, per life)", leases);
    Row("  above the consumers' retry budget (" + std::to_string(ConsumerRetryBudgetMs()) + " ms)",
        std::to_string(over) + " of " + std::to_string(leases_ms.size()));
  }
  if (!cfg.fault_cmd.empty()) {
    Row("--fault-cmd runs", std::to_string(run.fault_runs.size()) + " of " + std::to_string(cfg.faults) + " requested" +
                                Mark(run.faults_reached));
    for (const auto& [kind, v] : recoveries)
      Row("  recovery " + (kind.empty() ? std::string("(all)") : kind) + ": p50 / p99 / max (ms)",
          std::to_string(Percentile(v, 0.5)) + " / " + std::to_string(Percentile(v, 0.99)) + " / " +
              std::to_string(v.back()) + " (" + std::to_string(v.size()) + " runs)");
    Row("  provider starts refused by its store", std::to_string(counts.provider_start_failures));
  }
}

void PrintTable(const Config& cfg, const RunFacts& run, const EffectCheck& c, const PipelineCheck* pipeline,
                const Summary& s) {
  const RunCounts& counts = run.counts;
  const int64_t faults = s.faults;
  const bool interrupted = run.interrupted, ok = s.ok;
  std::cout << "\nidem chaos: seed " << cfg.seed << ", " << cfg.consumers << " consumer processes on "
            << run.source_kind << " + " << run.store_kind << ", provider over HTTP\n\n";
  Row("published (with producer retries)", std::to_string(c.published));
  Row("unique messages", std::to_string(c.unique));
  Row("deliveries seen by consumers", std::to_string(c.deliveries));
  Row("kills (SIGKILL)",
      std::to_string(counts.total_kills) + " of " + std::to_string(cfg.kills) + " requested" + Mark(run.kills_reached));
  for (const auto& [k, v] : counts.kills) Row("  " + k, std::to_string(v));
  Row("faults injected", std::to_string(faults));
  for (const auto& [k, v] : counts.faults)
    Row("  " + k + (k.starts_with("sqlite-") ? " (lives armed)" : ""), std::to_string(v));
  Row("  lost acks", std::to_string(c.lost_acks));
  Row("  stalls past the lease", std::to_string(c.stalls));
  Row("  lost provider responses", std::to_string(c.lost_responses));
  if (run.store_kind == "sqlite")
    Row("  SQLite I/O errors returned (of those armed)", std::to_string(c.vfs_faults_fired));
  Row("  time paused (ms, all pauses)", std::to_string(counts.paused_ms));
  Row("  clock jumps seen by the consumers", std::to_string(c.clock_jumps_seen));
  Row("acks and renewals refused: lease lost (fenced)", std::to_string(c.fenced));
  Row("zombies' deliveries (held when paused, taken over)", "");
  for (const auto& [k, v] : counts.zombies) Row("  " + k, std::to_string(v));
  Row("applied (distinct messages with an effect)", std::to_string(c.applied) + Mark(c.applied == c.unique));
  Row("lost (published, never applied)", std::to_string(c.lost) + Mark(c.lost == 0));
  Row("duplicated (applied twice: store/provider)", std::to_string(c.duplicated) + " / " +
                                                        std::to_string(c.provider_duplicated) +
                                                        Mark(c.duplicated == 0 && c.provider_duplicated == 0));
  Row("unexpected (applied, never published)",
      std::to_string(c.unexpected + c.provider_unexpected) + Mark(c.unexpected + c.provider_unexpected == 0));
  Row("acknowledged but not committed", std::to_string(c.acked_not_committed) + Mark(c.acked_not_committed == 0));
  Row("provider charges", std::to_string(c.provider_charges) + Mark(c.provider_charges == c.unique));
  Row("charged / expected (cents)", std::to_string(c.charged_cents) + " / " + std::to_string(c.expected_cents) +
                                        Mark(c.charged_cents == c.expected_cents));
  if (pipeline != nullptr) PipelineTable(cfg, *pipeline, s);
  LeasesAndFaultsTable(cfg, run, s);
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f s", run.seconds);
  Row("time", secs);
  for (const auto& e : c.examples) std::cout << "  e.g. " << e << "\n";
  if (interrupted) std::cout << "  interrupted: the counts are of an unfinished run\n";
  if (!run.kills_reached)
    std::cout << "  the messages ran out before the kills did: raise --messages or lower --kills\n";
  if (!run.faults_reached) std::cout << "  --fault-cmd did not run --faults times, each exiting 0\n";
  if (pipeline != nullptr)
    for (const auto& e : pipeline->examples) std::cout << "  e.g. " << e << "\n";
  std::cout << (ok ? pipeline != nullptr
                         ? "  OK: every message's effect exactly once, in the store, at the provider and in stage 2\n"
                         : "  OK: every message's effect exactly once, in the store and at the provider\n"
                   : "  FAILED\n")
            << "  replay this schedule: idem chaos --seed " << cfg.seed << " (files in " << cfg.dir << ")\n";
}

}  // namespace

int Report(const Config& cfg, const RunFacts& run, const EffectCheck& c, const PipelineCheck* pipeline) {
  const Summary s = Summarize(cfg, run, c, pipeline);
  if (cfg.json) {
    PrintJson(cfg, run, c, pipeline, s);
  } else {
    PrintTable(cfg, run, c, pipeline, s);
  }
  return s.ok ? kExitOk : kExitCheckFailed;
}

}  // namespace idem::cli::chaos
