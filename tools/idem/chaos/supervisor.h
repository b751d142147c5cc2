// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem chaos: the supervisor, the parent process of a run.
//
//   supervisor ──publishes──▶ source ──▶ M consumer processes ──HTTP──▶ provider process
//     │ oracle.log (every publication)      │ journal/<slot>-<life>.log (R/S/L/A/F)
//     └ killer: SIGKILLs consumers at random times and arms kill points in
//       each new consumer life (IDEM_KILL_AT), injects faults (I/O errors in
//       SQLite through the fault VFS, PostgreSQL backends terminated, network
//       cuts to PostgreSQL, lost acks, leases expiring under stalled
//       consumers, lost provider responses, broker restarts), pauses
//       consumers and the provider while they hold work (SIGSTOP at a kill
//       point, SIGCONT past the lease once another consumer took over what
//       it holds, or Plan::takeover_wait_ms later), starves consumers (SIGSTOP/SIGCONT in
//       a duty cycle), jumps their clocks (DIR/clock/<slot>-<life>), and
//       restarts whatever died; then drains.
//
// What it kills and breaks, and when, comes from the Schedule; what it saw is
// RunFacts (report.h); the effects are counted by CheckEffects (oracle.h).
#ifndef IDEM_TOOLS_IDEM_CHAOS_SUPERVISOR_H_
#define IDEM_TOOLS_IDEM_CHAOS_SUPERVISOR_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "chaos/config.h"
#include "chaos/process.h"
#include "chaos/report.h"
#include "chaos/schedule.h"
#include "cut_proxy.h"
#include "idem/store.h"
#include "sources.h"

namespace idem::cli::chaos {

class Supervisor {
 public:
  // `have_vfs`: this build has the fault VFS (SQLite faults and the kill
  // inside the commit).
  Supervisor(const Config& cfg, bool have_vfs);

  // The work directory, the producer's side of the source, the store (the
  // effect table and the markers emptied), the provider's store, the proxy
  // of a PostgreSQL run, the provider's port.
  Status Prepare();
  // Runs the chaos until every message is applied (or no progress for
  // --drain-timeout twice, or SIGINT/SIGTERM), then stops every process.
  Status Go();

  // The store under test (after Prepare).
  Store& store() { return *store_; }
  // Stage 2's store (the two-stage pipeline, after Prepare).
  Store& store2() { return *store2_; }
  // What the run saw (after Go).
  RunFacts Facts() const;

 private:
  // One process of the run.
  struct Life {
    int slot = -1;  // -1: the provider
    Role role = Role::kStage1;
    int64_t life = 0;
    pid_t pid = 0;
    Plan plan;
    int64_t started_ms = 0;
    bool killed_by_us = false;
    bool terminated = false;
    int64_t stopped_at_ms = 0;  // a pause: when it stopped at its kill point (0: running)
    bool paused = false;        // its pause came (one per life)
    // While paused: what it held (received, not acknowledged, from its
    // journal), how far the other lives' journals were read, and whether
    // another life has received something it held (a takeover).
    std::set<std::string> held;
    std::map<std::string, int64_t> read_from;
    bool taken_over = false;
    int64_t journal_at_stop = 0;  // its journal's length when it stopped
    bool zombie = false;          // continued after another life took what it held
    bool starved_stopped = false, starving = false;
    int64_t next_toggle_ms = 0;
    size_t next_jump = 0;
    int64_t clock_offset_ms = 0;
    std::string clock_file;
  };

  Status StartConsumer(int slot, bool chaos);
  Status StartProvider(bool chaos);
  void Reap();
  void Ended(pid_t pid, int status);
  // A process of the run stopped (waitpid's WIFSTOPPED): a planned pause
  // begins.
  void Stopped(pid_t pid);
  // Pauses, starvation and clock jumps due at `now` (the supervisor's loop).
  void Hold(Life& l, int64_t now);
  // Whether a life other than `l` has received a delivery `l` holds since
  // it stopped (reads the other journals on from where it left off).
  bool TakenOver(Life& l);
  std::string JournalOf(const Life& l) const;
  // A zombie's outcome per delivery it held, from its journal (once it
  // ended): RunCounts::zombies.
  void CountZombie(const Life& l);
  void Produce();
  Result<int64_t> Applied();
  // --fault-cmd: the distinct messages the stage-1 consumers acknowledged
  // (their journals' A lines, each journal read on from where the last call
  // left off; the counting thread's own). The producer's window goes by it
  // too when it is ahead of the effects, as a bounded queue would: an effect
  // a fault took after its ack (a failover with asynchronous replication)
  // never applies, yet the queue has let its message go.
  int64_t CountAcked();
  // The two-stage pipeline's progress: stage 2's markers, and whether the
  // outbox is empty.
  Result<int64_t> Applied2();
  Result<bool> OutboxEmpty();
  void TerminateBackends(const Life& l);
  // --fault-cmd: starts the next run when it is due; FaultEnded counts one.
  Status StartFault();
  void FaultEnded(int status);
  // Waits for a run still in progress at the end (it puts back what it broke).
  void WaitForFault();
  void StopAll();

  const Config& cfg_;
  const bool postgres_;
  const bool have_vfs_;
  Schedule schedule_;
  std::string exe_ = SelfExe();
  std::string source_url_;  // what the consumers open
  std::string provider_url_;
  int provider_port_ = 0;
  OpenedSource producer_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Store> store2_;  // stage 2's (the two-stage pipeline)
  std::string stage2_store_;       // what the stage-2 consumers open
  // PostgreSQL: the consumers reach the server through a proxy (one per
  // host of a multi-host URL), which cuts the network to it now and then.
  std::vector<std::unique_ptr<CutProxy>> proxies_;
  std::string consumer_store_;
  std::mt19937_64 net_rng_;
  int64_t next_cut_ms_ = 0;
  int64_t restarts_done_ = 0;
  // --fault-cmd: the run in progress (0: none), how many started and ended,
  // what each said; once the chaos stops, no more start and the producer
  // stops at --messages.
  pid_t fault_pid_ = 0;
  int64_t faults_started_ = 0;
  std::atomic<int64_t> faults_done_{0};
  std::atomic<bool> faults_off_{false};
  std::vector<FaultRun> fault_runs_;
  Status fault_failure_;
  // A slot whose life exited with an error at once (its store unreachable:
  // a failover) starts again only after a moment; the provider likewise.
  std::vector<int64_t> slot_ready_ms_;
  int64_t provider_ready_ms_ = 0, provider_failing_since_ms_ = 0;
  std::map<pid_t, Life> lives_;
  std::vector<int64_t> next_life_;
  std::vector<bool> slot_busy_;
  bool provider_up_ = false;
  int64_t provider_lives_ = 0;
  std::vector<int64_t> provider_leases_ms_;  // each provider life's --lease, in order
  RunCounts counts_;
  std::atomic<bool> produced_{false};
  std::atomic<int64_t> produced_unique_{0};  // the messages made (--messages, or more with --fault-cmd)
  std::atomic<int64_t> published_{0};
  std::atomic<int64_t> publish_retries_{0};
  Status produce_status_;
  double seconds_ = 0;
  std::atomic<int64_t> last_applied_{0};
  std::atomic<int64_t> last_acked_{0};
  std::map<std::string, int64_t> ack_read_from_;
  std::unordered_set<std::string> acked_;
  int64_t last_applied2_ = 0;  // the loop's last count, read by the producer's window
  std::atomic<bool> stop_producing_{false};
  bool kills_reached_ = false;
  bool drained_ = false;
};

}  // namespace idem::cli::chaos

#endif  // IDEM_TOOLS_IDEM_CHAOS_SUPERVISOR_H_
