// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem chaos: the schedule of kills and faults. Every decision comes from
// the seed: consumer slot s draws its lives' kill points, hit counts and
// kill times from a generator seeded by (seed, s), the provider from (seed,
// provider). What the processes do between those decisions is up to the OS
// scheduler, so a seed replays the same schedule of faults, not the same
// interleaving.
#ifndef IDEM_TOOLS_IDEM_CHAOS_SCHEDULE_H_
#define IDEM_TOOLS_IDEM_CHAOS_SCHEDULE_H_

#include <array>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "chaos/config.h"

namespace idem::cli::chaos {

// Where a consumer life dies, or what breaks in it.
struct Plan {
  std::string kill_point;          // IDEM_KILL_AT value ("name:hit"), or ""
  std::string vfs;                 // IDEM_FAULT_VFS value, or ""
  std::string label;               // what the summary counts it as
  int64_t kill_after_ms = 0;       // a timed SIGKILL this long after start (0: none)
  int64_t terminate_after_ms = 0;  // PostgreSQL: terminate its backends this long after start (0: none)
  // A pause: kill_point ends in ":stop" (the process stops itself there,
  // holding work) and is continued this long after it stopped. Its timers
  // (kill_after_ms) wait while it is stopped.
  int64_t pause_ms = 0;
  // How much longer a paused consumer may wait for another one to receive
  // what it holds (0: continued after pause_ms whatever happened).
  int64_t takeover_wait_ms = 0;
  // CPU starvation: from starve_after_ms after start, for starve_for_ms,
  // stopped starve_stop_ms then running starve_run_ms, in turn.
  int64_t starve_after_ms = 0, starve_for_ms = 0, starve_stop_ms = 0, starve_run_ms = 0;
  // Clock jumps: at each first (ms after start) the life's clock offset
  // becomes second (ms).
  std::vector<std::pair<int64_t, int64_t>> clock_jumps;
};

class Schedule {
 public:
  // Without the fault VFS (a build without it), SQLite runs get neither the
  // kill inside the commit nor I/O errors.
  Schedule(const Config& cfg, bool postgres, bool have_vfs);

  // The next life of consumer `slot`, while the chaos lasts.
  Plan Next(int slot);

  // The next life of relay `slot` (the two-stage pipeline): killed at one
  // of the relay's kill points, at a random time, or given a fault.
  Plan NextRelay(int slot);

  // Relay `slot`'s last life was to die at a kill point and ended otherwise
  // (its timer killed it first because the outbox was idle, or it failed):
  // its next life planned at a point tries that point again, so every relay
  // point is hit however fast the outbox drains and however lives end.
  void RelayPointMissed(int slot);

  // The provider's next lease, drawn at each (re)start.
  int64_t NextProviderLeaseMs();

  // The provider's next life: it dies at one of its kill points, or (one
  // life in kProviderPauseEvery when pauses are on) stops at one and is
  // continued after `lease_ms` (its lease) and a little more.
  Plan NextProvider(int64_t lease_ms);

 private:
  bool NextHold(int slot, Plan& p);
  void Fault(int slot, Plan& p);

  const Config& cfg_;
  bool postgres_;
  bool dynamodb_;  // the store under test is DynamoDB
  bool sqlite_;    // ... SQLite (its fault VFS, its write lock, its commit points)
  bool faults_;
  std::vector<std::string> points_;
  std::vector<std::mt19937_64> rngs_;
  std::map<int, size_t> next_point_;
  std::map<int, int64_t> faults_given_;
  static constexpr int64_t kSweep = 150;
  std::mt19937_64 provider_rng_;
  // The pauses, starvation and clock jumps draw from generators of their
  // own, so the other draws of a seed stay what they were without them.
  std::vector<std::mt19937_64> hold_rngs_;
  std::map<int, size_t> next_pause_point_;
  std::map<int, int64_t> lives_;                    // the lives drawn per slot
  std::map<int, std::array<bool, 3>> holds_given_;  // pause, starve, clock: given to the slot yet
  int64_t provider_lives_ = 0;
  std::mt19937_64 provider_hold_rng_;
};

}  // namespace idem::cli::chaos

#endif  // IDEM_TOOLS_IDEM_CHAOS_SCHEDULE_H_
