// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "chaos/supervisor.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "chaos/clock.h"
#include "chaos/oracle.h"
#include "chaos/workdir.h"
#include "chaos/worker.h"
#include "cli.h"
#include "components.h"
#include "payments.h"
#if IDEM_HAVE_KAFKA
#include "idem/kafka/offset_inbox.h"
#endif

namespace idem::cli::chaos {
namespace {

// SIGINT or SIGTERM stops the run, its processes and reports.
std::atomic<bool> g_interrupted{false};

std::string WithParam(const std::string& url, const std::string& kv) {
  return url + (url.find('?') == std::string::npos ? "?" : "&") + kv;
}

// --fault-cmd's output, run `n`.
std::string FaultLog(const std::string& dir, const std::string& n) { return dir + "/fault/" + n + ".log"; }

// What a --fault-cmd run said on its last "idem-fault k=v ..." line.
FaultRun ReadFaultRun(const std::string& log) {
  FaultRun run;
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("idem-fault ")) continue;
    run = FaultRun{};
    std::istringstream words(line.substr(11));
    for (std::string w; words >> w;) {
      if (w.starts_with("kind=")) run.kind = w.substr(5);
      if (w.starts_with("recovery_ms=")) run.recovery_ms = std::strtoll(w.c_str() + 12, nullptr, 10);
    }
  }
  return run;
}

}  // namespace

Supervisor::Supervisor(const Config& cfg, bool have_vfs)
    : cfg_(cfg), postgres_(IsPostgresScheme(cfg.store)), have_vfs_(have_vfs), schedule_(cfg, postgres_, have_vfs) {}

Status Supervisor::Prepare() {
  IDEM_RETURN_IF_ERROR(PrepareWorkDir(cfg_.dir));
  // The producer's side of the source. A Kafka group member the parent
  // never polls would hold partitions, so that one goes (elsewhere the
  // publisher is the source itself, or the source holds nothing).
  IDEM_ASSIGN_OR_RETURN(producer_, OpenSource(cfg_.source, {.lease_ms = cfg_.lease_ms, .consumer = "chaos-producer"}));
  if (producer_.kind.starts_with("kafka")) producer_.source.reset();
  source_url_ = producer_.shared_url;
  // The store: the effect table and the markers start empty.
  IDEM_ASSIGN_OR_RETURN(store_, OpenStore(cfg_.store, true, 2));
  IDEM_RETURN_IF_ERROR(ResetPayments(*store_, kTable));
  IDEM_RETURN_IF_ERROR(ForgetFailures(*store_, kConsumer));
  IDEM_RETURN_IF_ERROR(store_->Purge(kConsumer, INT64_MAX, 10'000).status());
#if IDEM_HAVE_KAFKA
  if (OffsetMode(cfg_)) {
    // Offset mode's record of what was applied starts empty too: the mock
    // cluster's topic starts at offset 0 again.
    IDEM_ASSIGN_OR_RETURN(auto offsets, kafka::OffsetInbox::Open(*store_, {.consumer = kConsumer}));
    IDEM_ASSIGN_OR_RETURN(auto tx, store_->Begin());
    IDEM_RETURN_IF_ERROR(tx->Exec("DELETE FROM idem_kafka_offsets WHERE consumer = $1", {kConsumer}).status());
    IDEM_RETURN_IF_ERROR(tx->Commit());
  }
#endif
  if (TwoStage(cfg_)) {
    // The outbox starts empty (the store under test is the run's), and so
    // do stage 2's effects and markers.
    {
      IDEM_ASSIGN_OR_RETURN(auto tx, store_->Begin());
      for (const char* table : {"idem_outbox", "idem_outbox_sent", "idem_outbox_dead"})
        IDEM_RETURN_IF_ERROR(tx->Exec(std::string("DELETE FROM ") + table).status());
      IDEM_RETURN_IF_ERROR(tx->Commit());
    }
    IDEM_ASSIGN_OR_RETURN(store2_, OpenStore(cfg_.stage2_store, true, 2));
    IDEM_ASSIGN_OR_RETURN(auto tx, store2_->Begin());
    IDEM_RETURN_IF_ERROR(tx->Exec(std::string("DROP TABLE IF EXISTS ") + kStage2Table).status());
    IDEM_RETURN_IF_ERROR(tx->Exec(CreateShipmentsSql()).status());
    for (const char* table : {"idem_failures", "idem_dead_letters"})
      IDEM_RETURN_IF_ERROR(
          tx->Exec(std::string("DELETE FROM ") + table + " WHERE consumer = $1", {kStage2Consumer}).status());
    IDEM_RETURN_IF_ERROR(tx->Commit());
    IDEM_RETURN_IF_ERROR(store2_->Purge(kStage2Consumer, INT64_MAX, 10'000).status());
  }
  if (!cfg_.provider_store.empty()) {  // (the default's files are gone already)
    IDEM_ASSIGN_OR_RETURN(auto provider, OpenStore(cfg_.provider_store, true, 1));
    IDEM_ASSIGN_OR_RETURN(auto tx, provider->Begin());
    IDEM_RETURN_IF_ERROR(tx->Exec("DROP TABLE IF EXISTS provider_charges").status());
    // Only this run's principal: other users of the database keep theirs.
    IDEM_RETURN_IF_ERROR(
        tx->Exec("DELETE FROM idem_claims WHERE substr(scope, 1, length($1)) = $1", {std::string(kPrincipal) + "|"})
            .status());
    IDEM_RETURN_IF_ERROR(tx->Commit());
  }
  consumer_store_ = cfg_.store;
  stage2_store_ = cfg_.stage2_store;
  if (postgres_) {
    // Each host of the URL (a multi-host URL names several: a failover's
    // candidates) through a proxy of its own.
    IDEM_ASSIGN_OR_RETURN(consumer_store_,
                          RouteEachThrough(cfg_.store, [this](const std::string& host, int target) -> Result<int> {
                            IDEM_ASSIGN_OR_RETURN(auto proxy, CutProxy::Start(host, target));
                            proxies_.push_back(std::move(proxy));
                            return proxies_.back()->port();
                          }));
    std::string host;
    int target = 0;
    if (TwoStage(cfg_) && IsPostgresScheme(cfg_.stage2_store) && RouteThrough(cfg_.store, 1, host, target).ok()) {
      // Stage 2 on the same server: through the proxy too.
      std::string host2;
      int target2 = 0;
      auto routed = RouteThrough(cfg_.stage2_store, proxies_[0]->port(), host2, target2);
      if (routed.ok() && host2 == host && target2 == target) stage2_store_ = *routed;
    }
    net_rng_.seed(cfg_.seed * 1'000'003ULL + 424'242ULL);
  }
  IDEM_ASSIGN_OR_RETURN(provider_port_, FreePort());
  provider_url_ = "http://127.0.0.1:" + std::to_string(provider_port_);
  next_life_.assign(static_cast<size_t>(AllSlots(cfg_)), 0);
  slot_busy_.assign(static_cast<size_t>(AllSlots(cfg_)), false);
  slot_ready_ms_.assign(static_cast<size_t>(AllSlots(cfg_)), 0);
  return Status::OK();
}

Status Supervisor::StartProvider(bool chaos) {
  // Drawn for every life, chaos or not, so a seed gives the same leases.
  const int64_t lease_ms = schedule_.NextProviderLeaseMs();
  provider_leases_ms_.push_back(lease_ms);
  std::vector<std::string> argv = {
      exe_, "provider", "--listen", "127.0.0.1:" + std::to_string(provider_port_), "--store", ProviderStore(cfg_),
      "--api-key", std::string(kApiKey) + ":" + kPrincipal, "--lease", std::to_string(lease_ms) + "ms",
      "--lose-responses", std::to_string(cfg_.lost_response_rate), "--seed", std::to_string(cfg_.seed), "--max-keys",
      // (Every key of the run: with --fault-cmd the run may go past --messages.)
      std::to_string(cfg_.fault_cmd.empty() ? std::max<int64_t>(100'000, 2 * cfg_.messages) : int64_t{1'000'000'000})};
  if (cfg_.provider_mode == "group-commit") argv.insert(argv.end(), {"--one-transaction", "--group-commit", "64"});
  Life l;
  l.life = provider_lives_++;
  if (chaos) l.plan = schedule_.NextProvider(lease_ms);
  std::vector<std::string> env;
  if (!l.plan.kill_point.empty()) env.push_back("IDEM_KILL_AT=" + l.plan.kill_point);
  IDEM_ASSIGN_OR_RETURN(l.pid, Spawn(argv, env, cfg_.dir + "/provider.log"));
  l.started_ms = SteadyMs();
  // It serves within a moment; until then the consumers' calls fail and are
  // retried, which is part of the test.
  lives_[l.pid] = l;
  provider_up_ = true;
  bool healthy = false;
  for (int i = 0; i < 100 && !(healthy = ProviderHealthy(provider_port_)); ++i) {
    int st = 0;
    if (::waitpid(l.pid, &st, WNOHANG | WUNTRACED) == l.pid) {
      if (WIFSTOPPED(st)) {
        // Paused at its kill point by a consumer's call: the pause begins.
        Stopped(l.pid);
        return Status::OK();
      }
      // Killed at its kill point by a consumer's first call, before it
      // answered the health check: a death like any other (restarted).
      if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
        Ended(l.pid, st);
        return Status::OK();
      }
      lives_.erase(l.pid);
      provider_up_ = false;
      if (!cfg_.fault_cmd.empty()) {
        // A fault may leave its store unreachable for a while (no primary
        // yet): started again in a moment, for up to --drain-timeout.
        const int64_t now = SteadyMs();
        if (provider_failing_since_ms_ == 0) provider_failing_since_ms_ = now;
        if (now - provider_failing_since_ms_ < cfg_.drain_timeout_ms) {
          ++counts_.provider_start_failures;
          provider_ready_ms_ = now + 200;
          return Status::OK();
        }
      }
      return Status::Unavailable("the provider exited at start; see " + cfg_.dir + "/provider.log");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (healthy) provider_failing_since_ms_ = 0;
  return Status::OK();
}

Status Supervisor::StartConsumer(int slot, bool chaos) {
  Life l;
  l.slot = slot;
  l.role = RoleOf(cfg_, slot);
  l.life = next_life_[static_cast<size_t>(slot)]++;
  if (chaos) l.plan = l.role == Role::kRelay ? schedule_.NextRelay(slot) : schedule_.Next(slot);
  // Stage 1 and the relays on the store under test (the relays publish to
  // the second source); stage 2 from the second source to its store.
  std::string store = l.role == Role::kStage2 ? stage2_store_ : consumer_store_;
  const std::string& source = l.role == Role::kStage1 ? source_url_ : cfg_.source2;
  if (IsPostgresScheme(store)) {
    store = WithParam(store, "application_name=idem-chaos-" + std::to_string(slot) + "-" + std::to_string(l.life));
  } else if (!l.plan.vfs.empty()) {
    store = WithParam(store, "vfs=idem-fault");
  }
  std::vector<std::string> argv = {exe_,
                                   "chaos",
                                   "--worker",
                                   std::to_string(slot),
                                   "--life",
                                   std::to_string(l.life),
                                   "--dir",
                                   cfg_.dir,
                                   "--worker-mode",
                                   RoleName(l.role),
                                   "--source",
                                   source,
                                   "--store",
                                   store,
                                   "--provider",
                                   provider_url_,
                                   "--seed",
                                   std::to_string(cfg_.seed),
                                   "--batch",
                                   std::to_string(cfg_.batch),
                                   "--lease-ms",
                                   std::to_string(cfg_.lease_ms),
                                   "--lost-ack-rate",
                                   std::to_string(cfg_.lost_ack_rate),
                                   "--stall-rate",
                                   std::to_string(cfg_.stall_rate)};
  if (!cfg_.broken.empty()) argv.insert(argv.end(), {"--broken", cfg_.broken});
  if (OffsetMode(cfg_)) argv.insert(argv.end(), {"--inbox", cfg_.inbox});
  if (TwoStage(cfg_)) argv.insert(argv.end(), {"--pipeline", cfg_.pipeline, "--keys", std::to_string(cfg_.keys)});
  if (!l.plan.clock_jumps.empty()) {
    l.clock_file = cfg_.dir + "/clock/" + std::to_string(slot) + "-" + std::to_string(l.life);
    argv.insert(argv.end(), {"--clock-file", l.clock_file});
  }
  std::vector<std::string> env;
  if (!l.plan.kill_point.empty()) env.push_back("IDEM_KILL_AT=" + l.plan.kill_point);
  if (!l.plan.vfs.empty()) env.push_back("IDEM_FAULT_VFS=" + l.plan.vfs);
  IDEM_ASSIGN_OR_RETURN(l.pid,
                        Spawn(argv, env, cfg_.dir + "/" + RoleName(l.role) + "-" + std::to_string(slot) + ".log"));
  l.started_ms = SteadyMs();
  if (l.plan.label.starts_with("fault:"))
    ++counts_.faults[(l.role == Role::kRelay ? "relay-" : "") + l.plan.label.substr(6)];
  slot_busy_[static_cast<size_t>(slot)] = true;
  lives_[l.pid] = l;
  return Status::OK();
}

// Collects the processes that ended and counts how.
void Supervisor::Reap() {
  int st = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &st, WNOHANG | WUNTRACED)) > 0) {
    if (pid == fault_pid_) {
      if (!WIFSTOPPED(st)) FaultEnded(st);
    } else if (WIFSTOPPED(st)) {
      Stopped(pid);
    } else {
      Ended(pid, st);
    }
  }
}

void Supervisor::Stopped(pid_t pid) {
  auto it = lives_.find(pid);
  if (it == lives_.end()) return;
  Life& l = it->second;
  // The stops of its starvation are the supervisor's own.
  if (l.plan.pause_ms > 0 && !l.paused) {
    l.paused = true;
    l.stopped_at_ms = SteadyMs();
    if (l.slot < 0) {
      l.taken_over = true;  // the provider: continued after its pause, retries queued meanwhile
      return;
    }
    // What it holds: received, neither acknowledged nor lost.
    std::ifstream in(JournalOf(l));
    for (std::string line; std::getline(in, line);) {
      l.journal_at_stop += static_cast<int64_t>(line.size()) + 1;
      if (line.size() < 3) continue;
      if (line[0] == 'R') l.held.insert(line.substr(2));
      if (line[0] == 'A' || line[0] == 'L') l.held.erase(line.substr(2));
    }
    for (const auto& [pid2, other] : lives_) {
      if (other.slot < 0 || pid2 == pid) continue;
      std::error_code ec;
      const auto size = std::filesystem::file_size(JournalOf(other), ec);
      l.read_from[JournalOf(other)] = ec ? 0 : static_cast<int64_t>(size);
    }
    if (l.held.empty()) l.taken_over = true;  // nothing to take over (cannot be: it stopped holding work)
  }
}

std::string Supervisor::JournalOf(const Life& l) const { return JournalPath(cfg_.dir, l.role, l.slot, l.life); }

bool Supervisor::TakenOver(Life& l) {
  for (const auto& [pid, other] : lives_) {
    if (other.slot < 0 || other.pid == l.pid) continue;
    const std::string path = JournalOf(other);
    int64_t& from = l.read_from[path];  // a life started since: from its start
    std::ifstream in(path);
    in.seekg(from);
    for (std::string line; std::getline(in, line);) {
      if (in.eof()) break;  // a line still being written: read it next time
      from += static_cast<int64_t>(line.size()) + 1;
      if (line.size() >= 3 && line[0] == 'R' && l.held.count(line.substr(2))) return true;
    }
  }
  return false;
}

void Supervisor::Hold(Life& l, int64_t now) {
  if (l.stopped_at_ms > 0) {
    if (now - l.stopped_at_ms < l.plan.pause_ms) return;
    if (!l.taken_over) l.taken_over = TakenOver(l);
    if (!l.taken_over && now - l.stopped_at_ms < l.plan.pause_ms + l.plan.takeover_wait_ms) return;
    // Continued past its lease: it finishes what it held, as a zombie.
    ::kill(l.pid, SIGCONT);
    ++counts_.faults[l.slot < 0 ? "pause-provider" : "pause-consumer"];
    if (l.slot >= 0 && l.taken_over && !l.held.empty()) {
      ++counts_.faults["pause-consumer-taken-over"];
      l.zombie = true;
    }
    counts_.paused_ms += now - l.stopped_at_ms;
    l.started_ms += now - l.stopped_at_ms;  // its timers waited
    l.stopped_at_ms = 0;
    return;
  }
  const Plan& p = l.plan;
  if (p.starve_for_ms > 0) {
    const int64_t t = now - l.started_ms;
    const bool in_stretch = t >= p.starve_after_ms && t < p.starve_after_ms + p.starve_for_ms;
    if (in_stretch && !l.starving) {
      l.starving = true;
      l.next_toggle_ms = now;
      ++counts_.faults["starvation"];
    }
    if (l.starving && !in_stretch) {
      l.starving = false;
      if (l.starved_stopped) ::kill(l.pid, SIGCONT);
      l.starved_stopped = false;
    }
    if (l.starving && now >= l.next_toggle_ms) {
      l.starved_stopped = !l.starved_stopped;
      ::kill(l.pid, l.starved_stopped ? SIGSTOP : SIGCONT);
      if (l.starved_stopped) ++counts_.faults["starvation-stops"];
      l.next_toggle_ms = now + (l.starved_stopped ? p.starve_stop_ms : p.starve_run_ms);
    }
  }
  while (l.next_jump < p.clock_jumps.size() && now - l.started_ms >= p.clock_jumps[l.next_jump].first) {
    const int64_t offset = p.clock_jumps[l.next_jump++].second;
    if (WriteClockOffset(l.clock_file, offset).ok())
      ++counts_.faults[offset > l.clock_offset_ms ? "clock-jump-forward" : "clock-jump-back"];
    l.clock_offset_ms = offset;
  }
}

void Supervisor::CountZombie(const Life& l) {
  if (!l.zombie) return;
  // Its journal from where it stopped: per delivery it held, what it did.
  std::set<std::string> handled, done, fenced;
  std::ifstream in(JournalOf(l));
  int64_t at = 0;
  for (std::string line; std::getline(in, line);) {
    const bool after = at >= l.journal_at_stop;
    at += static_cast<int64_t>(line.size()) + 1;
    if (line.size() < 3 || !l.held.count(line.substr(2))) continue;
    const std::string id = line.substr(2);
    if (line[0] == 'H') handled.insert(id);  // in this life, before the stop or after
    if (after && (line[0] == 'A' || line[0] == 'L')) done.insert(id);
    if (after && line[0] == 'X') fenced.insert(id);
  }
  for (const std::string& id : l.held) {
    if (fenced.count(id)) {
      ++counts_.zombies["fenced"];  // its ack or renewal refused: the lease had passed on
    } else if (done.count(id)) {
      // Acknowledged after the takeover: with no handler run, the inbox
      // found the takeover's effect (absorbed as a duplicate); with one, its
      // own commit went in first and the takeover's is the duplicate.
      ++counts_.zombies[handled.count(id) ? "committed-first" : "absorbed"];
    } else {
      ++counts_.zombies["unfinished"];  // killed, or given back, before it finished
    }
  }
}

// Counts how a process of the run ended (its status from waitpid).
void Supervisor::Ended(pid_t pid, int st) {
  auto it = lives_.find(pid);
  if (it == lives_.end()) return;
  const Life l = it->second;
  lives_.erase(it);
  CountZombie(l);
  if (l.slot < 0) {
    provider_up_ = false;
  } else {
    slot_busy_[static_cast<size_t>(l.slot)] = false;
  }
  const bool killed = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
  // A relay life that ended before its kill point (killed by its timer,
  // failed, or stopped) hands the point to the slot's next point life, so
  // each point is hit however the lives end.
  if (l.role == Role::kRelay && l.plan.label.starts_with("kill:relay.") && (!killed || l.killed_by_us))
    schedule_.RelayPointMissed(l.slot);
  if (killed) {
    ++counts_.total_kills;
    // Killed by the schedule's timer, or by itself at its kill point.
    std::string what = l.killed_by_us
                           ? (l.plan.label.starts_with("fault:") ? l.plan.label + " (then killed)" : "kill:timed")
                           : l.plan.label;
    if (l.slot < 0) what = "provider " + what;
    if (l.slot >= 0 && l.role != Role::kStage1) what = std::string(RoleName(l.role)) + " " + what;
    ++counts_.kills[what.empty() ? "kill:unplanned" : what];
  } else if (l.slot >= 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
    ++counts_.consumer_errors;
    // Failed at once (its store refused it: no primary during a failover):
    // the slot starts again in a moment, not in a tight loop.
    const int64_t now = SteadyMs();
    if (now - l.started_ms < 1'000) slot_ready_ms_[static_cast<size_t>(l.slot)] = now + 200;
  }
}

Status Supervisor::StartFault() {
  const std::string n = std::to_string(faults_started_);
  IDEM_ASSIGN_OR_RETURN(fault_pid_,
                        Spawn({"/bin/sh", "-c", cfg_.fault_cmd}, {"IDEM_CHAOS_FAULT=" + n}, FaultLog(cfg_.dir, n)));
  ++faults_started_;
  return Status::OK();
}

void Supervisor::FaultEnded(int st) {
  const std::string n = std::to_string(fault_runs_.size());
  fault_pid_ = 0;
  FaultRun run = ReadFaultRun(FaultLog(cfg_.dir, n));
  run.failed = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  ++counts_.faults[run.kind.empty() ? "fault-cmd" : run.kind];
  fault_runs_.push_back(run);
  if (run.failed && fault_failure_.ok()) {
    // No more: the run drains and reports, the faults short.
    fault_failure_ = Status::Unavailable("--fault-cmd run " + n + " failed (wait status " + std::to_string(st) +
                                         "); see " + FaultLog(cfg_.dir, n));
    std::cerr << "idem chaos: " << fault_failure_.message() << "\n";
    faults_off_ = true;
  }
  ++faults_done_;
}

void Supervisor::WaitForFault() {
  if (fault_pid_ == 0) return;
  // It puts back what it broke (the check reads the store); interrupted,
  // it is asked to stop.
  if (g_interrupted) ::kill(fault_pid_, SIGTERM);
  const int64_t deadline = SteadyMs() + 180'000;
  int st = 0;
  while (::waitpid(fault_pid_, &st, WNOHANG) == 0) {
    if (SteadyMs() > deadline) {
      ::kill(fault_pid_, SIGKILL);
      ::waitpid(fault_pid_, &st, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  FaultEnded(st);
}

void Supervisor::Produce() {
  std::mt19937_64 rng(cfg_.seed);
  OracleLog oracle(cfg_.dir);
  // In the oracle before it is published: the oracle holds every message
  // that may reach a consumer. A failed publication (a broker restarting) is
  // retried as a producer would, on a fresh connection: when the first
  // attempt's outcome was unknown, that is a producer duplicate.
  auto publish = [&](const Message& m) -> Status {
    Status s;
    // For 2 minutes, however long a reopening waits for the broker.
    const int64_t deadline = SteadyMs() + 120'000;
    for (int attempt = 0; (attempt == 0 || SteadyMs() < deadline) && !g_interrupted; ++attempt) {
      oracle.Append(m);
      s = producer_.publish(m);
      if (s.ok()) {
        ++published_;
        return s;
      }
      ++publish_retries_;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      auto reopened = OpenSource(cfg_.source, {.lease_ms = cfg_.lease_ms, .consumer = "chaos-producer"});
      if (reopened.ok()) {
        if (reopened->kind.starts_with("kafka")) reopened->source.reset();
        producer_ = std::move(*reopened);  // only this thread uses it until the run ends
      }
    }
    return s.WithContext("publishing " + m.id + " failed for 2 minutes");
  };
  // The window (--backlog): at most that many published and not applied
  // (with --fault-cmd: nor acknowledged).
  auto window_open = [this](int64_t i) {
    while (cfg_.backlog > 0 && i - std::max<int64_t>(last_applied_, last_acked_) >= cfg_.backlog) {
      if (stop_producing_ || g_interrupted) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  };
  std::vector<Message> again;
  // With --fault-cmd, past --messages until the last fault is over: each
  // fault measures its recovery on the traffic after it.
  auto more = [this](int64_t i) {
    return i < cfg_.messages || (!cfg_.fault_cmd.empty() && !faults_off_ && faults_done_ < cfg_.faults);
  };
  int64_t made = 0;
  for (int64_t i = 0; more(i) && produce_status_.ok(); ++i, made = i) {
    if (!window_open(i)) {
      if (!g_interrupted)
        produce_status_ =
            Status::Unavailable("the producer stopped after " + std::to_string(i) + " of " +
                                std::to_string(cfg_.messages) + " messages: the consumers stopped applying them");
      break;
    }
    const int64_t cents = 100 + static_cast<int64_t>(rng() % 99'900);
    std::string order = "o";  // (built in steps: g++ 12 warns falsely on "o" + to_string)
    order += std::to_string(i);
    Message m = PaymentMessage("pay-" + std::to_string(cfg_.seed) + "-" + std::to_string(i), order, cents);
    produce_status_ = publish(m);
    if (std::uniform_real_distribution<double>(0, 1)(rng) < cfg_.dup_rate) again.push_back(m);
  }
  // The producer's retries: the same facts published again.
  for (const Message& m : again) {
    if (!produce_status_.ok()) break;
    produce_status_ = publish(m);
  }
  produced_unique_ = made;
  produced_ = true;
}

// Progress: the markers (a plain read, which never waits for the consumers'
// write lock on SQLite), or, for a consumer that writes none (a broken one,
// Kafka's offset mode), the effect rows.
Result<int64_t> Supervisor::Applied() {
  if (!WritesNoMarkers(cfg_)) return store_->CountMarkers(kConsumer);
  IDEM_ASSIGN_OR_RETURN(std::vector<PaymentRow> rows, ReadPayments(*store_, kTable));
  std::unordered_set<std::string> ids;
  for (const PaymentRow& row : rows) ids.insert(row.message_id);
  return static_cast<int64_t>(ids.size());
}

int64_t Supervisor::CountAcked() {
  auto journals = ListDir(cfg_.dir + "/journal");
  if (!journals.ok()) return static_cast<int64_t>(acked_.size());
  for (const auto& path : *journals) {
    int64_t& from = ack_read_from_[path.string()];
    std::error_code ec;
    if (static_cast<int64_t>(std::filesystem::file_size(path, ec)) <= from || ec) continue;
    std::ifstream in(path);
    in.seekg(from);
    for (std::string line; std::getline(in, line);) {
      if (in.eof()) break;  // a line still being written: read it next time
      from += static_cast<int64_t>(line.size()) + 1;
      if (line.size() >= 3 && line[0] == 'A') acked_.insert(line.substr(2));
    }
  }
  return static_cast<int64_t>(acked_.size());
}

Result<int64_t> Supervisor::Applied2() { return store2_->CountMarkers(kStage2Consumer); }

Result<bool> Supervisor::OutboxEmpty() {
  if (store_->outbox_store() == nullptr) return Status::InvalidArgument("the store under test has no outbox");
  IDEM_ASSIGN_OR_RETURN(OutboxStats st, store_->outbox_store()->Stats());
  return st.backlog == 0;
}

void Supervisor::TerminateBackends(const Life& l) {
  auto tx = store_->Begin();
  if (!tx.ok()) return;
  (void)(*tx)->Query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
                     {"idem-chaos-" + std::to_string(l.slot) + "-" + std::to_string(l.life)});
}

void Supervisor::StopAll() {
  for (auto& [pid, l] : lives_) {
    ::kill(pid, SIGTERM);
    ::kill(pid, SIGCONT);  // a paused or starved one handles it only when running
  }
  const int64_t deadline = SteadyMs() + 10'000;
  while (!lives_.empty() && SteadyMs() < deadline) {
    int st = 0;
    pid_t pid = ::waitpid(-1, &st, WNOHANG);
    if (pid > 0) {
      if (auto it = lives_.find(pid); it != lives_.end()) CountZombie(it->second);
      lives_.erase(pid);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  for (auto& [pid, l] : lives_) {
    ::kill(pid, SIGKILL);
    int st = 0;
    ::waitpid(pid, &st, 0);
    CountZombie(l);
  }
  lives_.clear();
}

Status Supervisor::Go() {
  const int64_t started = SteadyMs();
  IDEM_RETURN_IF_ERROR(StartProvider(/*chaos=*/true));
  std::thread producer([this] { Produce(); });
  Progress progress("chaos", cfg_.messages);
  bool chaos = true;
  int64_t last_poll = 0, last_progress_ms = SteadyMs();
  // The progress, counted on a thread of its own: a count may wait on a
  // lock a stopped consumer holds (a broken consumer's progress is read in a
  // transaction), and this loop is what continues it.
  std::atomic<int64_t> counted{-1}, counted2{-1};
  std::atomic<bool> outbox_empty{false};
  std::atomic<bool> stop_counting{false};
  std::thread counter([&] {
    while (!stop_counting) {
      const int64_t t = SteadyMs();
      if (auto applied = Applied(); applied.ok()) counted = *applied;
      if (!cfg_.fault_cmd.empty()) last_acked_ = CountAcked();
      if (TwoStage(cfg_)) {
        // (The outbox first: empty, then every stage-2 effect counted, is
        // drained.)
        auto empty = OutboxEmpty();
        if (auto applied2 = Applied2(); applied2.ok()) counted2 = *applied2;
        outbox_empty = empty.ok() && *empty;
      }
      // Counting a million markers takes a while: at most 10% of the time,
      // but every second at least (a count that waited on a lock is no
      // reason to wait longer; the producer's window and the drain go by it).
      const int64_t wait_ms = std::clamp<int64_t>(10 * (SteadyMs() - t), 200, 1'000);
      for (int64_t w = 0; w < wait_ms && !stop_counting; w += 10)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  struct JoinCounter {
    std::atomic<bool>& stop;
    std::thread& t;
    ~JoinCounter() {
      stop = true;
      if (t.joinable()) t.join();
    }
  } join_counter{stop_counting, counter};
  Status failure;
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_interrupted = true; };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  while (!g_interrupted) {
    Reap();
    const int64_t now = SteadyMs();
    if (!provider_up_ && now >= provider_ready_ms_) {
      ++counts_.provider_restarts;
      if (Status s = StartProvider(chaos); !s.ok()) {
        failure = s;
        break;
      }
    }
    for (int slot = 0; slot < AllSlots(cfg_); ++slot) {
      if (slot_busy_[static_cast<size_t>(slot)] || now < slot_ready_ms_[static_cast<size_t>(slot)]) continue;
      if (Status s = StartConsumer(slot, chaos); !s.ok()) {
        failure = s;
        break;
      }
    }
    if (!failure.ok()) break;
    for (auto& [pid, l] : lives_) {
      Hold(l, now);
      if (l.stopped_at_ms > 0) continue;  // paused: its timers wait
      if (l.plan.kill_after_ms > 0 && !l.killed_by_us && now - l.started_ms >= l.plan.kill_after_ms) {
        ::kill(pid, SIGKILL);
        l.killed_by_us = true;
      }
      if (l.plan.terminate_after_ms > 0 && !l.terminated && now - l.started_ms >= l.plan.terminate_after_ms) {
        l.terminated = true;
        TerminateBackends(l);
      }
    }
    if (chaos && !cfg_.restart_cmd.empty() && restarts_done_ < cfg_.restarts &&
        counts_.total_kills >= (restarts_done_ + 1) * cfg_.kills / (cfg_.restarts + 1)) {
      // A broker (or database) restart; the consumers see it go and come
      // back. The run pauses meanwhile (nothing is reaped or killed).
      ++restarts_done_;
      const int rc = std::system(cfg_.restart_cmd.c_str());
      if (rc != 0) {
        failure = Status::Unavailable("--restart-cmd failed (status " + std::to_string(rc) + "): " + cfg_.restart_cmd);
        break;
      }
      ++counts_.faults["restart"];
    }
    if (chaos && !faults_off_ && fault_pid_ == 0 && !cfg_.fault_cmd.empty() && faults_started_ < cfg_.faults &&
        last_applied_ >= FaultStartAt(cfg_, faults_started_)) {
      // A fault of the caller's (a failover, say); the run goes on meanwhile.
      if (Status s = StartFault(); !s.ok()) {
        failure = s;
        break;
      }
    }
    if (!proxies_.empty() && chaos && now >= next_cut_ms_) {
      // A network cut between the consumers and PostgreSQL: every
      // connection reset, new ones refused for a moment.
      if (next_cut_ms_ > 0) {
        const int64_t outage_ms = 50 + static_cast<int64_t>(net_rng_() % 350);
        for (auto& proxy : proxies_) proxy->Cut(outage_ms);
      }
      next_cut_ms_ = now + 300 + static_cast<int64_t>(net_rng_() % 1'200);
    }
    if (now - last_poll >= 200) {
      last_poll = now;
      if (const int64_t applied = counted; applied >= 0) {
        if (applied != last_applied_) last_progress_ms = now;
        last_applied_ = applied;
        progress.Update(applied);
      }
      if (const int64_t applied2 = counted2; applied2 >= 0) {
        if (applied2 != last_applied2_) last_progress_ms = now;
        last_applied2_ = applied2;
      }
      const bool stage2_drained = !TwoStage(cfg_) || (outbox_empty && last_applied2_ >= produced_unique_);
      // (A fault in progress is waited for: it ends with the store whole.)
      if (fault_pid_ != 0) last_progress_ms = now;
      // Every effect is in. Under fire, the lives go on until the kills asked
      // for are made (idle lives end on their timers), within the drain
      // timeout below; a shortfall then is reported.
      if (produced_ && last_applied_ >= produced_unique_ && stage2_drained && fault_pid_ == 0 &&
          (!chaos || counts_.total_kills >= cfg_.kills)) {
        drained_ = true;
        break;
      }
      if (now - last_progress_ms > cfg_.drain_timeout_ms) {
        if (!chaos) break;  // what is missing is reported as lost
        // No progress under fire: stop breaking things and drain calmly
        // (lives already armed still end as planned).
        chaos = false;
        faults_off_ = true;
        last_progress_ms = now;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  progress.Done();
  stop_counting = true;
  counter.join();
  kills_reached_ = counts_.total_kills >= cfg_.kills;
  faults_off_ = true;
  WaitForFault();
  StopAll();
  stop_producing_ = true;
  producer.join();
  seconds_ = static_cast<double>(SteadyMs() - started) / 1000.0;
  IDEM_RETURN_IF_ERROR(failure);
  return produce_status_;
}

RunFacts Supervisor::Facts() const {
  RunFacts f;
  f.counts = counts_;
  if (!proxies_.empty()) {
    f.counts.faults["network-cut"] = proxies_[0]->cuts();  // (every proxy is cut at once)
    int64_t reset = 0;
    for (const auto& proxy : proxies_) reset += proxy->connections_reset();
    f.counts.faults["network-cut-connections-reset"] = reset;
  }
  f.fault_runs = fault_runs_;
  f.faults_reached = cfg_.fault_cmd.empty() || (faults_done_ >= cfg_.faults && fault_failure_.ok());
  f.provider_leases_ms = provider_leases_ms_;
  f.publish_retries = publish_retries_.load();
  f.seconds = seconds_;
  f.source_kind = producer_.kind;
  f.postgres = postgres_;
  f.store_kind = postgres_ ? "postgres" : UrlScheme(cfg_.store) == "dynamodb" ? "dynamodb" : "sqlite";
  f.kills_reached = kills_reached_;
  f.interrupted = g_interrupted;
  return f;
}

}  // namespace idem::cli::chaos
