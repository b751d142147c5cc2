// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem chaos gateway: `idem gateway` processes on one store, broken while
// clients send keys through them, then checked against the upstream's own
// count of executions per key (doc/gateway.md, "Proof under failures").
//
//   clients ──(cut proxies: lost responses)──▶ G gateway processes ──▶ upstream
//     retry each key with the same key         SIGKILLed at random times    (this process: counts
//     until a final answer, then repeat it     and at http.before_complete / executions per key, each
//     and compare the bodies                   http.after_claim, restarted  answer's body unique)
//
// The same run drives a peer proxy instead (--peer-cmd): a command that
// listens on $PORT and proxies to $UPSTREAM, killed and restarted the same
// way (timed kills only), so that its duplicates are counted alike.
#ifndef IDEM_TOOLS_IDEM_CHAOS_GATEWAY_H_
#define IDEM_TOOLS_IDEM_CHAOS_GATEWAY_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cli.h"
#include "idem/result.h"

namespace idem::cli::chaos {

// The gateway run's broken mode: the gateways declared to face an upstream
// that deduplicates the forwarded key (--upstream-honours-key) while this
// one does not: the check must report the duplicates that follows.
inline constexpr const char* kBrokenHonoursKey = "upstream-honours-key";

struct GatewayConfig {
  std::string dir;
  std::string store;  // sqlite:DIR/gateway.db by default
  int gateways = 3;
  int64_t keys = 400;  // at least; more while the kills asked for are not made
  int clients = 8;
  int64_t kills = 10;
  uint64_t seed = 1;
  double lost_response_rate = 0.05;  // answers lost between client and gateway
  double upstream_lost_rate = 0.02;  // executions answered after the gateway's upstream timeout
  double twin_rate = 0.1;            // keys whose first request is sent twice at once
  int repeats = 2;                   // repeats after a 2xx, each compared
  int64_t upstream_delay_ms = 5;     // an execution takes 0..this
  int64_t lease_ms = 1'500, upstream_timeout_ms = 400, connect_timeout_ms = 200;
  int64_t key_timeout_ms = 30'000;  // a key without a final answer by then is unresolved
  int64_t hits = 6;                 // a kill point fires at a hit drawn from 1..hits
  std::string broken;               // "" or kBrokenHonoursKey
  std::string peer_cmd, peer_name;  // a peer proxy instead of idem gateway
  bool json = false;
};

// What the run saw and what the check found.
struct GatewayResult {
  std::string store_kind;
  int64_t keys = 0, requests = 0, twins = 0;
  int64_t answered_2xx = 0;     // keys a client got a 2xx for
  int64_t outcome_unknown = 0;  // keys answered 503 outcome-unknown (final)
  int64_t in_progress = 0;      // 409 answers (retried)
  int64_t transport_errors = 0;
  int64_t responses_lost = 0;     // cut by the proxies
  int64_t upstream_timeouts = 0;  // executions the upstream answered late on purpose
  int64_t executions = 0, executed_keys = 0;
  int64_t duplicated_keys = 0, duplicate_executions = 0;  // violations
  int64_t duplicated_twinned_keys = 0;                    // of duplicated_keys: keys sent twice at once
  int64_t replay_mismatches = 0;                          // violation: a 2xx then something else
  int64_t unexpected_bodies = 0;                          // violation: a 2xx body the upstream never made
  int64_t unexpected_statuses = 0;                        // violation: an answer no client expects
  int64_t unresolved = 0;                                 // violation: no final answer in time
  std::map<std::string, int64_t> kills_by_point, statuses;
  int64_t kills = 0, restarts = 0, start_failures = 0;
  double seconds = 0;
  std::vector<std::string> examples;
  bool kills_reached = false, interrupted = false;

  bool Ok() const {
    return duplicated_keys == 0 && replay_mismatches == 0 && unexpected_bodies == 0 && unexpected_statuses == 0 &&
           unresolved == 0 && kills_reached && !interrupted;
  }
};

// Runs the chaos (gateway_run.cc); progress on stderr.
Result<GatewayResult> RunGatewayChaos(const GatewayConfig& cfg);

}  // namespace idem::cli::chaos

#endif  // IDEM_TOOLS_IDEM_CHAOS_GATEWAY_H_
