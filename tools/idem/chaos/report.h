// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem chaos: the report -- a table for a person, or one JSON object
// (--json) for scripts and CTest; doc/cli.md says how to read both. The exit
// code is kExitOk only when every effect is there exactly once, the kills
// asked for were made and the run was not interrupted; kExitCheckFailed
// otherwise.
#ifndef IDEM_TOOLS_IDEM_CHAOS_REPORT_H_
#define IDEM_TOOLS_IDEM_CHAOS_REPORT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "chaos/config.h"
#include "chaos/oracle.h"

namespace idem::cli::chaos {

// What the supervisor counted while the run went on.
struct RunCounts {
  std::map<std::string, int64_t> kills;   // by kill point or "kill:timed"
  std::map<std::string, int64_t> faults;  // by kind
  int64_t total_kills = 0;
  int64_t consumer_errors = 0;  // consumer lives that exited with an error
  int64_t provider_restarts = 0;
  // Provider lives that exited at start with an error (its store unreachable
  // during a --fault-cmd): each is started again.
  int64_t provider_start_failures = 0;
  int64_t paused_ms = 0;  // the pauses' time, in all
  // What the paused consumers continued after a takeover (zombies) did with
  // each delivery they held: "fenced" (ack or renewal refused), "absorbed"
  // (acknowledged without running the handler: the takeover's effect was
  // there), "committed-first" (its own effect went in; the takeover's
  // attempt is the duplicate), "unfinished" (killed or given back first).
  std::map<std::string, int64_t> zombies;
};

// One run of --fault-cmd: what its "idem-fault" line said (kind, and the
// recovery it measured; -1: none said).
struct FaultRun {
  std::string kind;
  int64_t recovery_ms = -1;
  bool failed = false;  // it exited with an error (the faults stopped there)
};

// The run as the supervisor saw it (everything but the effects).
struct RunFacts {
  RunCounts counts;                         // faults include the network cuts of a PostgreSQL run
  std::vector<int64_t> provider_leases_ms;  // each provider life's --lease, in order
  int64_t publish_retries = 0;
  double seconds = 0;
  std::string source_kind;  // the source's Kind()
  bool postgres = false;    // the store under test is PostgreSQL
  std::string store_kind;   // "sqlite", "postgres", "dynamodb"
  bool kills_reached = false;
  std::vector<FaultRun> fault_runs;  // --fault-cmd's runs, in order
  bool faults_reached = true;        // every --faults run made (and each exited 0)
  bool interrupted = false;          // SIGINT or SIGTERM stopped the run
};

// `m` as one JSON object of counts.
std::string JsonCounts(const std::map<std::string, int64_t>& m);
// One line of the table on stdout: the name, padded, and the value; and the
// mark after a checked value.
void Row(const std::string& k, const std::string& v);
const char* Mark(bool good);

// Prints the report (cfg.json: the JSON object) to stdout; returns the exit
// code. `pipeline`: the two-stage pipeline's check, or null (one stage).
int Report(const Config& cfg, const RunFacts& run, const EffectCheck& c, const PipelineCheck* pipeline = nullptr);

}  // namespace idem::cli::chaos

#endif  // IDEM_TOOLS_IDEM_CHAOS_REPORT_H_
