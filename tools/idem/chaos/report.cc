// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "chaos/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "cli.h"

namespace idem::cli::chaos {
namespace {

std::string JsonCounts(const std::map<std::string, int64_t>& m) {
  Json j;
  for (const auto& [k, v] : m) j.Add(k, v);
  return j.str();
}

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

}  // namespace

int Report(const Config& cfg, const RunFacts& run, const EffectCheck& c, const PipelineCheck* pipeline) {
  const RunCounts& counts = run.counts;
  const std::vector<int64_t>& leases_ms = run.provider_leases_ms;
  // SQLite faults count when the VFS returned them, not when armed (a life
  // may die or finish before its operation comes).
  int64_t faults = c.lost_acks + c.stalls + c.lost_responses + c.vfs_faults_fired;
  for (const auto& [k, v] : counts.faults)
    if (!k.starts_with("sqlite-") && k != "network-cut-connections-reset" && k != "starvation-stops" &&
        k != "pause-consumer-taken-over")
      faults += v;
  const bool effects_ok = c.EffectsOk();
  const bool interrupted = run.interrupted;
  const bool pipeline_ok = pipeline == nullptr || pipeline->Ok();
  const bool ok = effects_ok && pipeline_ok && run.kills_reached && run.faults_reached && !interrupted;
  const auto recoveries = Recoveries(run.fault_runs);
  const std::vector<int64_t> no_recoveries;
  const std::vector<int64_t>& recovered =
      recoveries.count("") ? recoveries.at("") : no_recoveries;  // every kind's, sorted
  // Kills by role (the two-stage pipeline's relays and stage 2).
  int64_t relay_kills = 0, stage2_kills = 0;
  for (const auto& [k, v] : counts.kills) {
    if (k.starts_with("relay ")) relay_kills += v;
    if (k.starts_with("stage2 ")) stage2_kills += v;
  }
  if (cfg.json) {
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
                  m["sqlite-faults-fired"] = c.vfs_faults_fired;
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
    if (!cfg.fault_cmd.empty()) {
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
    if (pipeline != nullptr) {
      const PipelineCheck& p = *pipeline;
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
    j.Add("seconds", run.seconds)
        .Add("source", run.source_kind)
        .Add("store", run.postgres ? "postgres" : "sqlite")
        .Add("interrupted", interrupted)
        .Add("ok", ok)
        .Add("seed", static_cast<int64_t>(cfg.seed))
        .Add("dir", cfg.dir);
    std::cout << j.str() << "\n";
  } else {
    auto row = [](const std::string& k, const std::string& v) {
      std::cout << "  " << k << std::string(k.size() < 46 ? 46 - k.size() : 1, ' ') << v << "\n";
    };
    auto mark = [](bool good) { return good ? "  ✓" : "  ✕"; };
    std::cout << "\nidem chaos: seed " << cfg.seed << ", " << cfg.consumers << " consumer processes on "
              << run.source_kind << " + " << (run.postgres ? "PostgreSQL" : "SQLite") << ", provider over HTTP\n\n";
    row("published (with producer retries)", std::to_string(c.published));
    row("unique messages", std::to_string(c.unique));
    row("deliveries seen by consumers", std::to_string(c.deliveries));
    row("kills (SIGKILL)", std::to_string(counts.total_kills) + " of " + std::to_string(cfg.kills) + " requested" +
                               mark(run.kills_reached));
    for (const auto& [k, v] : counts.kills) row("  " + k, std::to_string(v));
    row("faults injected", std::to_string(faults));
    for (const auto& [k, v] : counts.faults)
      row("  " + k + (k.starts_with("sqlite-") ? " (lives armed)" : ""), std::to_string(v));
    row("  lost acks", std::to_string(c.lost_acks));
    row("  stalls past the lease", std::to_string(c.stalls));
    row("  lost provider responses", std::to_string(c.lost_responses));
    if (!run.postgres) row("  SQLite I/O errors returned (of those armed)", std::to_string(c.vfs_faults_fired));
    row("  time paused (ms, all pauses)", std::to_string(counts.paused_ms));
    row("  clock jumps seen by the consumers", std::to_string(c.clock_jumps_seen));
    row("acks and renewals refused: lease lost (fenced)", std::to_string(c.fenced));
    row("zombies' deliveries (held when paused, taken over)", "");
    for (const auto& [k, v] : counts.zombies) row("  " + k, std::to_string(v));
    row("applied (distinct messages with an effect)", std::to_string(c.applied) + mark(c.applied == c.unique));
    row("lost (published, never applied)", std::to_string(c.lost) + mark(c.lost == 0));
    row("duplicated (applied twice: store/provider)", std::to_string(c.duplicated) + " / " +
                                                          std::to_string(c.provider_duplicated) +
                                                          mark(c.duplicated == 0 && c.provider_duplicated == 0));
    row("unexpected (applied, never published)",
        std::to_string(c.unexpected + c.provider_unexpected) + mark(c.unexpected + c.provider_unexpected == 0));
    row("acknowledged but not committed", std::to_string(c.acked_not_committed) + mark(c.acked_not_committed == 0));
    row("provider charges", std::to_string(c.provider_charges) + mark(c.provider_charges == c.unique));
    row("charged / expected (cents)", std::to_string(c.charged_cents) + " / " + std::to_string(c.expected_cents) +
                                          mark(c.charged_cents == c.expected_cents));
    if (pipeline != nullptr) {
      const PipelineCheck& p = *pipeline;
      row("two-stage: relays / stage-2 consumers",
          std::to_string(cfg.relays) + " / " + std::to_string(cfg.stage2_consumers));
      row("  relay kills / stage-2 kills", std::to_string(relay_kills) + " / " + std::to_string(stage2_kills));
      row("  relay hand-overs / published / republished", std::to_string(p.relay_handed) + " / " +
                                                              std::to_string(p.relay_published) + " / " +
                                                              std::to_string(p.relay_republished));
      row("  relay order violations (per key)",
          std::to_string(p.relay_order_violations) + mark(p.relay_order_violations == 0));
      row("  stage-2 applied / expected", std::to_string(p.applied) + " / " + std::to_string(p.expected) +
                                              mark(p.applied == p.expected && p.effects == p.expected));
      row("  stage-2 lost / duplicated / unexpected", std::to_string(p.lost) + " / " + std::to_string(p.duplicated) +
                                                          " / " + std::to_string(p.unexpected) +
                                                          mark(p.lost + p.duplicated + p.unexpected == 0));
      row("  stage-2 receipts out of order (per key)",
          p.order_checked ? std::to_string(p.stage2_order_violations) + mark(p.stage2_order_violations == 0)
                          : "not checked (several stage-2 consumers)");
      row("  stage-2 applied out of order (information)", std::to_string(p.stage2_reordered));
      row("  stage-2 duplicates absorbed by its Inbox", std::to_string(p.stage2_duplicates_absorbed));
      row("  outbox left / dead letters", std::to_string(p.outbox_backlog) + " / " +
                                              std::to_string(p.outbox_dead_letters) +
                                              mark(p.outbox_backlog == 0 && p.outbox_dead_letters == 0));
    }
    {
      std::string leases;
      int64_t over = 0;
      for (int64_t l : leases_ms) {
        if (!leases.empty()) leases += ' ';
        leases += std::to_string(l);
        over += l > ConsumerRetryBudgetMs() ? 1 : 0;
      }
      row("provider leases (ms, per life)", leases);
      row("  above the consumers' retry budget (" + std::to_string(ConsumerRetryBudgetMs()) + " ms)",
          std::to_string(over) + " of " + std::to_string(leases_ms.size()));
    }
    if (!cfg.fault_cmd.empty()) {
      row("--fault-cmd runs", std::to_string(run.fault_runs.size()) + " of " + std::to_string(cfg.faults) +
                                  " requested" + mark(run.faults_reached));
      for (const auto& [kind, v] : recoveries)
        row("  recovery " + (kind.empty() ? std::string("(all)") : kind) + ": p50 / p99 / max (ms)",
            std::to_string(Percentile(v, 0.5)) + " / " + std::to_string(Percentile(v, 0.99)) + " / " +
                std::to_string(v.back()) + " (" + std::to_string(v.size()) + " runs)");
      row("  provider starts refused by its store", std::to_string(counts.provider_start_failures));
    }
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f s", run.seconds);
    row("time", secs);
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
  return ok ? kExitOk : kExitCheckFailed;
}

}  // namespace idem::cli::chaos
