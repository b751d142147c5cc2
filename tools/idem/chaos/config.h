// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem chaos: what one run is given (the flags), and the settings derived
// from it that more than one part uses (the consumers' retries and the
// budget they add up to, the provider's lease range, the provider's store).
//
// The parts of the command:
//   config.h     this: the run's settings
//   workdir.h    the work directory and the embedded queue reset before a run
//   process.h    starting processes, free ports, the provider's health
//   schedule.h   the seeded schedule of kills and faults (Plan, Schedule)
//   clock.h      the clock a consumer life sees, jumped by the supervisor
//   journal.h    the consumer lives' journals (one line per event)
//   worker.h     one consumer life (the process the run starts and kills)
//   supervisor.h the parent: producer, oracle log, killer, restarts, drain
//   oracle.h     the check: effects counted against the oracle and journals
//   report.h     the table or the JSON object, and the exit code
//   gateway.h    idem chaos gateway: gateway processes killed while clients
//                retry keys through them, checked against the upstream's count
#ifndef IDEM_TOOLS_IDEM_CHAOS_CONFIG_H_
#define IDEM_TOOLS_IDEM_CHAOS_CONFIG_H_

#include <cstdint>
#include <string>

#include "idem/consumer.h"

namespace idem::cli::chaos {

// The consumer name under test and the effect table.
inline constexpr const char* kConsumer = "idem-chaos";
inline constexpr const char* kTable = "chaos_payments";
// The two-stage pipeline (--pipeline two-stage): stage 1 also adds one
// outbox message per payment, relays publish them to the second source,
// stage 2 applies each into its own table (outbox id, key, seq) with its own
// Inbox.
inline constexpr const char* kStage2Consumer = "idem-chaos-stage2";
inline constexpr const char* kStage2Table = "chaos_shipments";

// What a process of the run is.
enum class Role { kStage1, kStage2, kRelay };

struct Config {
  std::string dir, source, store;
  int64_t messages = 3'000;
  int consumers = 4;
  int64_t kills = 100;
  uint64_t seed = 1;
  double dup_rate = 0.05;
  double lost_ack_rate = 0.02;
  double stall_rate = 0.005;
  double lost_response_rate = 0.02;
  double fault_rate = 0.15;  // share of consumer lives given a fault instead of a kill point
  // Shares of consumer lives paused while they hold work (stopped at a kill
  // point past the lease, then continued; with any, the provider too, one
  // life in kProviderPauseEvery), starved of CPU (stopped and continued in a
  // duty cycle for a stretch) and given clock jumps (forward and back).
  double pause_rate = 0.03;
  double starve_rate = 0.02;
  double clock_jump_rate = 0.03;
  int64_t lease_ms = 400;
  // The producer keeps at most this many messages published and not yet
  // applied (0: no bound), as a bounded queue does: a delivery a paused
  // consumer holds comes back to the others behind at most this many, so
  // they take it over while its holder is still stopped.
  int64_t backlog = 200;
  int batch = 8;
  int64_t drain_timeout_ms = 60'000;
  // A kill point fires at its 1st..hits-th hit (drawn); timed kills come
  // within 10..(60 x hits) ms. Larger: longer lives, fewer process starts
  // per message (long runs).
  int64_t hits = 4;
  // A shell command that restarts the broker (or the database) under test,
  // run `restarts` times, evenly spread over the kills.
  std::string restart_cmd;
  int64_t restarts = 2;
  // A shell command that breaks something the run depends on (a database
  // failover, say) and returns once it is whole again, run `faults` times
  // one after another while the run goes on (nothing waits for it, unlike
  // restart_cmd); each run gets IDEM_CHAOS_FAULT=<its number, from 0> and may
  // report what it measured on a line "idem-fault kind=K recovery_ms=N".
  // Fault i starts in the middle of the i-th of faults + 1 parts of the
  // messages (FaultStartAt), and the producer goes on past `messages` until
  // the last fault is over: every fault meets traffic, however long the
  // faults before it took.
  std::string fault_cmd;
  int64_t faults = 2;
  bool json = false;
  // A deliberately broken consumer, to show the check catches what it
  // claims to: "" (the real one), "no-guard" (effect without the marker) or
  // "ack-before-commit" (the delivery acknowledged before the transaction)
  // or "unfenced" (the guard read in a transaction of its own, then the
  // effect written without checking it again: right under kills and lost
  // acks, wrong when two holders overlap, as a paused one does).
  std::string broken;
  // How the provider commits POST /charges: "two-phase" (claim committed,
  // charge, response committed) or "group-commit" (--one-transaction
  // --group-commit: claim, charge and response of many requests in one
  // transaction).
  std::string provider_mode = "two-phase";
  // The provider's own store; empty: sqlite:DIR/provider.db (synchronous=normal).
  std::string provider_store;
  // "" (one stage) or "two-stage".
  std::string pipeline;
  // How the consumers guard: "markers" (Inbox and Consumer) or "offset"
  // (Kafka's ordered-log mode: kafka::OffsetInbox, one record at a time).
  std::string inbox = "markers";
  int64_t keys = 20;         // ordering keys (aggregates) the payments are spread over
  int relays = 2;            // relay processes
  int stage2_consumers = 1;  // stage-2 consumer processes (one: its deliveries' order is checked)
  // The second source (default: embedded:DIR/queue2.db?queue=shipping) and
  // stage 2's store (default: the store under test on PostgreSQL,
  // sqlite:DIR/stage2.db on SQLite).
  std::string source2, stage2_store;
  // Worker mode (internal): this process is `slot` (stage-1 consumers
  // first, then stage-2 consumers, then relays), life `life`.
  Role role = Role::kStage1;
  int slot = -1;
  int64_t life = 0;
  std::string provider;
  std::string clock_file;  // this life's ShiftedClock file (clock.h), or ""
};

inline bool TwoStage(const Config& cfg) { return cfg.pipeline == "two-stage"; }
// The slots of a run: stage-1 consumers, stage-2 consumers, relays.
inline int ConsumerSlots(const Config& cfg) { return cfg.consumers + (TwoStage(cfg) ? cfg.stage2_consumers : 0); }
inline int AllSlots(const Config& cfg) { return ConsumerSlots(cfg) + (TwoStage(cfg) ? cfg.relays : 0); }
Role RoleOf(const Config& cfg, int slot);
const char* RoleName(Role role);
// A life's journal: DIR/journal/ (stage 1), DIR/journal2/ (stage 2),
// DIR/relay/ (relays), <slot>-<life>.log.
std::string JournalPath(const std::string& dir, Role role, int slot, int64_t life);
// The ordering key a payment's order belongs to ("o<i>": "k<i mod keys>").
std::string OrderKey(const Config& cfg, const std::string& order);

// How long past its pause a paused consumer may wait for another consumer
// to receive what it holds before it is continued anyway.
inline constexpr int64_t kTakeoverWaitMs = 5'000;

// With pauses, one provider life in this many is paused instead of killed.
inline constexpr int64_t kProviderPauseEvery = 16;

// Whether the --broken consumer writes effects without Inbox markers (the
// run's progress is then its effect rows).
inline bool BrokenWritesNoMarkers(const Config& cfg) { return cfg.broken == "no-guard" || cfg.broken == "unfenced"; }
// Kafka's offset mode: the last applied offset per partition, no markers.
inline bool OffsetMode(const Config& cfg) { return cfg.inbox == "offset"; }
// Whether the run's progress is its effect rows rather than its markers.
inline bool WritesNoMarkers(const Config& cfg) { return BrokenWritesNoMarkers(cfg) || OffsetMode(cfg); }

// The consumers' retries, in one place: what the workers run with and what
// the parent computes their budget from.
inline constexpr int kClientAttempts = 4;        // tries of one POST /charges (ProviderClient: backoff 2..100 ms)
inline constexpr int kClientBackoffMaxMs = 100;  // as ProviderClient sets it
// A call waits this long for the provider's answer, then tries again: a
// provider paused past its lease (--pause-rate) gets the retries queued
// while it is stopped, which take its claims over when it goes on.
inline constexpr int64_t kClientReadTimeoutMs = 1'000;
// Failures before a message is dead-lettered (a dead letter counts as lost).
// Kills and in-progress outcomes count none; what counts is the store's own
// errors (I/O faults, backends terminated), each its own failure.
inline constexpr int kConsumerMaxAttempts = 5;
inline constexpr int64_t kConsumerBackoffBaseMs = 5, kConsumerBackoffMaxMs = 100;

// The options a consumer life runs with (odd slots take batches).
Consumer::Options ChaosConsumerOptions(const Config& cfg);

// The longest a consumer keeps trying a message whose every try fails
// before it gives up on it (dead letter): max_attempts deliveries, each
// making kClientAttempts calls, and the consumer's backoff (with its +25%
// jitter) between the deliveries. Between the calls the client waits its
// longest backoff: a 409 carries Retry-After (whole seconds), which raises
// every wait to the client's backoff_max_ms. The time the requests
// themselves take is not counted (loopback, milliseconds): a lease above
// this outlasts the consumers' retries.
int64_t ConsumerRetryBudgetMs();

// The range the provider's lease is drawn from at each (re)start: from
// below the budget (a retry may take a key over while its first request
// still runs) to well above it (a key held by a killed provider stays in
// progress longer than any consumer retries: the consumers must keep
// redelivering it as in progress, never count it), short enough that a
// run still drains in CI time.
int64_t ProviderLeaseMinMs();
int64_t ProviderLeaseMaxMs();

// The provider's store URL: --provider-store, or sqlite:DIR/provider.db
// (synchronous=normal).
std::string ProviderStore(const Config& cfg);

// --fault-cmd: fault `i` (from 0) starts once this many messages are
// applied (and fault i - 1 is over): half of the i-th part of
// faults + 1 equal parts of --messages.
int64_t FaultStartAt(const Config& cfg, int64_t i);

// The steady clock in milliseconds.
int64_t SteadyMs();

}  // namespace idem::cli::chaos

#endif  // IDEM_TOOLS_IDEM_CHAOS_CONFIG_H_
