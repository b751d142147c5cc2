// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem chaos: the payments workload across processes, broken on purpose
// while it runs, then checked by counting effects against an oracle kept
// outside every database under test. This file is the command (its flags,
// their checks); the parts are in this directory, listed in config.h.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <utility>

#include "chaos/config.h"
#include "chaos/oracle.h"
#include "chaos/relay.h"
#include "chaos/report.h"
#include "chaos/supervisor.h"
#include "chaos/workdir.h"
#include "chaos/worker.h"
#include "commands.h"
#include "components.h"
#include "idem/url.h"

namespace idem::cli {

const Command& ChaosCommand() {
  static const Command c{
      "chaos",
      "Prove exactly-once effects by breaking the payments workload while it runs: consumer processes\n"
      "are SIGKILLed at random times and at every named kill point (before and after the marker,\n"
      "after the work, inside the commit, after the commit before the ack, after the ack, mid-batch)\n"
      "and restarted; the HTTP payment provider is killed while it holds a claim; faults are injected\n"
      "(lost acks, leases expiring under stalled consumers, lost provider responses, SQLite I/O errors\n"
      "through a fault VFS, PostgreSQL backends terminated); consumers and the provider are paused\n"
      "(SIGSTOP) while they hold work for longer than their lease and then continued, consumers are\n"
      "starved of CPU and their clock jumps forward and back. Then everything is drained and the\n"
      "effects are counted against an oracle journal kept outside every database: lost, duplicated\n"
      "(in the store or at the provider), unexpected, acknowledged-but-not-committed. Exits 0 only\n"
      "when all are 0 and every message's effect is there exactly once. Every run prints its seed;\n"
      "the same seed replays the same schedule of faults.",
      "[--source URL] [--store URL] [--messages N] [--consumers M] [--kills K] [--seed S] [--json]",
      {{"source", "URL", "embedded:DIR/queue.db",
        "the broker (see idem run --help); kafka-mock: runs the mock\n"
        "          cluster in this process for every consumer. An embedded queue\n"
        "          file is deleted first (the whole file, every queue in it); only\n"
        "          an embedded queue file or a path where nothing is is accepted:\n"
        "          anything else there (a store, another file, a directory) is\n"
        "          refused and left alone"},
       {"store", "URL", "sqlite:DIR/payments.db",
        "the store under test: sqlite:PATH, postgres://... or dynamodb://TABLE?endpoint=URL"},
       {"provider-store", "URL", "sqlite:DIR/provider.db",
        "the provider's store (its claims, charges and stored responses): sqlite:PATH\n"
        "          or postgres://...; emptied of charges and claims first"},
       {"messages", "N", "3000", "unique payment messages"},
       {"consumers", "M", "4", "consumer processes"},
       {"kills", "K", "100",
        "at least this many SIGKILLs (consumers and provider); the kills and faults go\n"
        "          on until every message is applied, so more messages mean more kills"},
       {"seed", "S", "1", "seed of the schedule of kills and faults"},
       {"dir", "DIR", "", "work directory (default: a fresh temporary directory)"},
       {"dup-rate", "P", "0.05", "fraction of messages the producer publishes twice"},
       {"backlog", "N", "200",
        "the producer keeps at most N messages published and not yet applied (0: no\n"
        "          bound), so what a paused consumer holds comes back to the others soon"},
       {"lost-ack-rate", "P", "0.02", "fraction of acks lost"},
       {"stall-rate", "P", "0.005", "fraction of receives that stall past the lease"},
       {"lost-response-rate", "P", "0.02", "fraction of keys whose first provider response is dropped"},
       {"fault-rate", "P", "0.15", "fraction of consumer lives given an I/O error or a terminated backend"},
       {"pause-rate", "P", "0.03",
        "fraction of consumer lives stopped (SIGSTOP) at a kill point while they hold\n"
        "          work, for longer than the lease, then continued (SIGCONT); when above 0,\n"
        "          one provider life in " +
            std::to_string(chaos::kProviderPauseEvery) + " is paused so while it holds a claim, past its lease"},
       {"starve-rate", "P", "0.02",
        "fraction of consumer lives starved of CPU for a stretch (stopped and\n"
        "          continued in a duty cycle)"},
       {"clock-jump-rate", "P", "0.03",
        "fraction of consumer lives whose clock (the Env their consumer, inbox and\n"
        "          source read) jumps forward, then back, past the lease"},
       {"hits", "N", "4",
        "a kill point fires at a hit drawn from 1..N (timed kills within 60*N ms):\n"
        "          larger means longer consumer lives, fewer process starts (long runs)"},
       {"restart-cmd", "CMD", "",
        "a shell command that restarts the broker (or database) under test, e.g.\n"
        "          'scripts/test-redis.sh pause S && scripts/test-redis.sh resume S'"},
       {"restarts", "N", "2", "how many times --restart-cmd runs, spread over the kills"},
       {"fault-cmd", "CMD", "",
        "a shell command that breaks what the run depends on (a database failover,\n"
        "          say) and returns once it is whole again; the run goes on meanwhile. Run\n"
        "          --faults times, one after another, with IDEM_CHAOS_FAULT=<0,1,...>, each\n"
        "          starting in the middle of one of --faults + 1 parts of the messages; more\n"
        "          than --messages are published when the faults take longer, until the\n"
        "          last one is over. Its output is DIR/fault/<n>.log; a line 'idem-fault kind=K\n"
        "          recovery_ms=N' there is counted (faults_by_kind, fault_recovery_*)"},
       {"faults", "N", "2", "how many times --fault-cmd runs"},
       {"lease-ms", "MS", "400", "the source's lease (visibility timeout) where it has one"},
       {"batch", "N", "8", "batch size of the odd-numbered consumers (the even ones take one at a time)"},
       {"drain-timeout", "DURATION", "60s",
        "how long without progress before the faults stop for a calm drain,\n"
        "          and then before what is missing is reported lost"},
       {"json", "", "", "print one JSON object instead of the table"},
       {"broken", "MODE", "",
        "run a deliberately broken consumer to see the check fail: no-guard (the\n"
        "          effect without its marker), ack-before-commit, or unfenced (the guard\n"
        "          read apart from the effect's transaction: only pauses catch it)"},
       {"inbox", "MODE", "markers",
        "how consumers guard: markers (the Inbox, one marker per message id) or\n"
        "          offset (Kafka only: kafka::OffsetInbox, the last applied offset per\n"
        "          partition, one record at a time; it deduplicates redeliveries of a\n"
        "          record, not a producer's second record, so --dup-rate is 0 there)"},
       {"provider-mode", "MODE", "two-phase",
        "how the provider commits a charge: two-phase (killed after a claim and\n"
        "          before a completion) or group-commit (one transaction for many\n"
        "          requests; killed before and after a group's commit)"},
       {"pipeline", "MODE", "",
        "two-stage: each payment's handler also adds one message to the store's outbox\n"
        "          (key: its order's aggregate, --keys), relay processes (--relays) publish\n"
        "          them to --source2, stage-2 consumers apply them with their own Inbox; the\n"
        "          relays are killed at their kill points and at random times too, and the\n"
        "          check adds stage 2: each outbox message's effect exactly once, the order\n"
        "          per key, the outbox empty"},
       {"keys", "N", "20", "two-stage: the ordering keys (aggregates) the orders are spread over"},
       {"relays", "N", "2", "two-stage: relay processes"},
       {"stage2-consumers", "N", "1",
        "two-stage: stage-2 consumer processes (with one, the order of its first\n"
        "          receipts per key is checked)"},
       {"source2", "URL", "embedded:DIR/queue2.db?queue=shipping", "two-stage: where the relays publish"},
       {"stage2-store", "URL", "sqlite:DIR/stage2.db (PostgreSQL: --store)", "two-stage: stage 2's store"},
       {"worker", "SLOT", "", "(internal) run as consumer SLOT"},
       {"worker-mode", "MODE", "consumer", "(internal) consumer, stage2 or relay"},
       {"life", "N", "0", "(internal) the consumer's life number"},
       {"provider", "URL", "", "(internal) the provider's URL"},
       {"clock-file", "PATH", "", "(internal) the file of the consumer's clock offset"}}};
  return c;
}

namespace {

// The numbers and the plain settings of the flags, checked.
Status ParseNumbers(const Args& args, chaos::Config& cfg) {
  auto integer = [&](const char* name, int64_t& out, int64_t min, int64_t max = INT64_MAX) -> Status {
    if (!args.Has(name)) return Status::OK();
    IDEM_ASSIGN_OR_RETURN(out, args.GetInt(name));
    if (out < min)
      return Status::InvalidArgument("--" + std::string(name) + " must be at least " + std::to_string(min));
    if (out > max) return Status::InvalidArgument("--" + std::string(name) + " must be at most " + std::to_string(max));
    return Status::OK();
  };
  auto fraction = [&](const char* name, double& out) -> Status {
    if (!args.Has(name)) return Status::OK();
    char* end = nullptr;
    const std::string v = args.Get(name);
    out = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !(out >= 0 && out <= 1))
      return Status::InvalidArgument("--" + std::string(name) + " must be a fraction 0..1, got '" + v + "'");
    return Status::OK();
  };
  int64_t consumers = cfg.consumers, seed = 1, batch = cfg.batch, slot = -1, relays = cfg.relays,
          stage2_consumers = cfg.stage2_consumers;
  Status s = integer("messages", cfg.messages, 1);
  if (s.ok()) s = integer("consumers", consumers, 1);
  if (s.ok()) s = integer("kills", cfg.kills, 0);
  if (s.ok()) s = integer("seed", seed, 0);
  if (s.ok()) s = integer("batch", batch, 1);
  // (Bounded above: the schedule multiplies them.)
  if (s.ok()) s = integer("lease-ms", cfg.lease_ms, 50, 3'600'000);
  if (s.ok()) s = integer("hits", cfg.hits, 1, 1'000'000);
  if (s.ok()) s = integer("restarts", cfg.restarts, 0);
  if (s.ok()) s = integer("faults", cfg.faults, 0, 1'000'000);
  if (s.ok()) s = integer("backlog", cfg.backlog, 0);
  if (s.ok()) s = integer("keys", cfg.keys, 1);
  if (s.ok()) s = integer("relays", relays, 1, 16);
  if (s.ok()) s = integer("stage2-consumers", stage2_consumers, 1, 64);
  cfg.restart_cmd = args.Has("restart-cmd") ? args.Get("restart-cmd") : "";
  cfg.fault_cmd = args.Has("fault-cmd") ? args.Get("fault-cmd") : "";
  if (s.ok() && !cfg.fault_cmd.empty() && cfg.messages < 2 * (cfg.faults + 1))
    s = Status::InvalidArgument(
        "--messages must be at least 2 x (--faults + 1): each fault starts in the middle "
        "of a part of the messages");
  if (s.ok()) s = integer("worker", slot, 0);
  if (s.ok()) s = integer("life", cfg.life, 0);
  for (auto [name, out] : {std::pair<const char*, double*>{"dup-rate", &cfg.dup_rate},
                           {"lost-ack-rate", &cfg.lost_ack_rate},
                           {"stall-rate", &cfg.stall_rate},
                           {"lost-response-rate", &cfg.lost_response_rate},
                           {"fault-rate", &cfg.fault_rate},
                           {"pause-rate", &cfg.pause_rate},
                           {"starve-rate", &cfg.starve_rate},
                           {"clock-jump-rate", &cfg.clock_jump_rate}})
    if (s.ok()) s = fraction(name, *out);
  if (s.ok() && args.Has("drain-timeout")) {
    auto d = ParseDurationMs(args.Get("drain-timeout"));
    s = d.status();
    if (d.ok()) cfg.drain_timeout_ms = *d;
  }
  IDEM_RETURN_IF_ERROR(s);
  if (consumers > 64) return Status::InvalidArgument("--consumers must be at most 64");
  cfg.consumers = static_cast<int>(consumers);
  cfg.seed = static_cast<uint64_t>(seed);
  cfg.batch = static_cast<int>(std::min<int64_t>(batch, 1000));
  cfg.slot = static_cast<int>(slot);
  cfg.json = args.Bool("json");
  // The defaults in --help name files in the work directory.
  cfg.dir = args.Has("dir") ? args.Get("dir") : "";
  cfg.source = args.Has("source") ? args.Get("source") : "";
  cfg.store = args.Has("store") ? args.Get("store") : "";
  cfg.provider = args.Get("provider");
  cfg.relays = static_cast<int>(relays);
  cfg.stage2_consumers = static_cast<int>(stage2_consumers);
  return Status::OK();
}

// The modes (pipeline, role, broken consumer, provider, inbox), checked
// against one another.
Status ParseModes(const Args& args, chaos::Config& cfg) {
  cfg.pipeline = args.Has("pipeline") ? args.Get("pipeline") : "";
  if (!cfg.pipeline.empty() && cfg.pipeline != "two-stage")
    return Status::InvalidArgument("--pipeline must be two-stage, got '" + cfg.pipeline + "'");
  const std::string worker_mode = args.Has("worker-mode") ? args.Get("worker-mode") : "consumer";
  cfg.role = worker_mode == "relay"    ? chaos::Role::kRelay
             : worker_mode == "stage2" ? chaos::Role::kStage2
                                       : chaos::Role::kStage1;
  cfg.broken = args.Has("broken") ? args.Get("broken") : "";
  if (!cfg.broken.empty() && cfg.broken != "no-guard" && cfg.broken != "ack-before-commit" &&
      cfg.broken != "unfenced" && cfg.broken != chaos::kBrokenRelay)
    return Status::InvalidArgument(
        "--broken must be no-guard, ack-before-commit, unfenced or relay-ack-before-confirm, got '" + cfg.broken + "'");
  if (cfg.broken == chaos::kBrokenRelay && !chaos::TwoStage(cfg))
    return Status::InvalidArgument("--broken relay-ack-before-confirm needs --pipeline two-stage");
  cfg.clock_file = args.Has("clock-file") ? args.Get("clock-file") : "";
  cfg.provider_mode = args.Get("provider-mode");
  cfg.provider_store = args.Has("provider-store") ? args.Get("provider-store") : "";
  if (cfg.provider_mode != "two-phase" && cfg.provider_mode != "group-commit")
    return Status::InvalidArgument("--provider-mode must be two-phase or group-commit, got '" + cfg.provider_mode +
                                   "'");
  cfg.inbox = args.Get("inbox");
  if (cfg.inbox != "markers" && cfg.inbox != "offset")
    return Status::InvalidArgument("--inbox must be markers or offset, got '" + cfg.inbox + "'");
  if (chaos::OffsetMode(cfg)) {
    if (!cfg.source.starts_with("kafka")) {
      return Status::InvalidArgument(
          "--inbox offset is Kafka's ordered-log mode: it needs a kafka:// or "
          "kafka-mock: --source, not '" +
          RedactUrl(cfg.source) + "'");
    }
    if (chaos::TwoStage(cfg) || !cfg.broken.empty())
      return Status::InvalidArgument("--inbox offset runs without --pipeline and --broken");
    if (!args.Has("dup-rate")) cfg.dup_rate = 0;
    if (cfg.dup_rate > 0)
      return Status::InvalidArgument(
          "--inbox offset deduplicates redeliveries of a record, not a producer's second record "
          "of a message (another offset): --dup-rate must be 0");
  }
  return Status::OK();
}

// The work directory (a fresh temporary one without --dir), the defaults
// that name files in it, and the embedded queues emptied.
Status PrepareWorkDir(const Args& args, chaos::Config& cfg) {
  if (Status st = chaos::MakeRunDir(cfg.dir); !st.ok()) return st;
  if (cfg.source.empty()) cfg.source = "embedded:" + cfg.dir + "/queue.db?queue=payments";
  if (cfg.store.empty()) cfg.store = "sqlite:" + cfg.dir + "/payments.db";
  cfg.source2 = args.Has("source2") ? args.Get("source2") : "embedded:" + cfg.dir + "/queue2.db?queue=shipping";
  cfg.stage2_store = args.Has("stage2-store")      ? args.Get("stage2-store")
                     : IsPostgresScheme(cfg.store) ? cfg.store
                                                   : "sqlite:" + cfg.dir + "/stage2.db";
  if (cfg.source.starts_with("embedded:")) {
    if (Status st = chaos::ResetEmbeddedQueue(cfg.source); !st.ok()) return st;
  }
  if (chaos::TwoStage(cfg) && cfg.source2.starts_with("embedded:")) {
    if (Status st = chaos::ResetEmbeddedQueue(cfg.source2); !st.ok()) return st;
  }
  return Status::OK();
}

}  // namespace

int RunChaos(const Args& args) {
  const std::string cmd = "chaos";
  chaos::Config cfg;
  if (Status s = ParseNumbers(args, cfg); !s.ok()) return Fail(cmd, s);
  if (Status s = ParseModes(args, cfg); !s.ok()) return Fail(cmd, s);
  if (cfg.slot >= 0) return chaos::RunWorker(cfg);
  if (Status s = PrepareWorkDir(args, cfg); !s.ok()) return Fail(cmd, s);
  if (!cfg.json)
    std::cout << "idem chaos: seed " << cfg.seed << ", " << cfg.messages << " messages, " << cfg.consumers
              << " consumers, "
              << (chaos::TwoStage(cfg) ? std::to_string(cfg.relays) + " relays, " +
                                             std::to_string(cfg.stage2_consumers) + " stage-2 consumers, "
                                       : "")
              << cfg.kills << " kills; files in " << cfg.dir << "\n"
              << std::flush;
  chaos::Supervisor run(cfg, /*have_vfs=*/true);
  if (Status st = run.Prepare(); !st.ok()) return Fail(cmd, st);
  if (Status st = run.Go(); !st.ok()) return Fail(cmd, st);
  auto checked = chaos::CheckEffects(cfg, run.store());
  if (!checked.ok()) return Fail(cmd, checked.status());
  if (!chaos::TwoStage(cfg)) return chaos::Report(cfg, run.Facts(), *checked);
  auto pipeline = chaos::CheckPipeline(cfg, run.store(), run.store2());
  if (!pipeline.ok()) return Fail(cmd, pipeline.status());
  return chaos::Report(cfg, run.Facts(), *checked, &*pipeline);
}

}  // namespace idem::cli
