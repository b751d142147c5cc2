// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem chaos: the oracle and the check. The oracle is DIR/oracle.log, kept
// outside every database under test: one line "<id> <payload>" per
// publication, written before the message is published (so it holds every
// message that may reach a consumer; a producer retry is a second line).
// After the run, CheckEffects counts the effects -- the effect rows in the
// store under test, the charges in the provider's store, the
// acknowledgements in the consumers' journals -- against it.
#ifndef IDEM_TOOLS_IDEM_CHAOS_ORACLE_H_
#define IDEM_TOOLS_IDEM_CHAOS_ORACLE_H_

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "chaos/config.h"
#include "idem/message.h"
#include "idem/result.h"
#include "idem/store.h"

namespace idem::cli::chaos {

// The oracle's writer: DIR/oracle.log, truncated when opened, flushed at
// every line.
class OracleLog {
 public:
  explicit OracleLog(const std::string& dir) : out_(dir + "/oracle.log") {}
  void Append(const Message& m) { out_ << m.id << " " << m.payload << "\n" << std::flush; }

 private:
  std::ofstream out_;
};

// What the check counted.
struct EffectCheck {
  int64_t published = 0, unique = 0, deliveries = 0, applied = 0, lost = 0, duplicated = 0, unexpected = 0;
  int64_t provider_charges = 0, provider_duplicated = 0, provider_unexpected = 0, provider_missing = 0;
  int64_t acked_not_committed = 0, effects_without_charge = 0, lost_acks = 0, stalls = 0, lost_responses = 0;
  int64_t effect_rows = 0, expected_cents = 0, charged_cents = 0;
  int64_t vfs_faults_fired = 0;       // I/O errors and full disks the fault VFS returned
  int64_t fenced = 0;                 // acks and lease renewals the source refused as lost (journal X)
  int64_t clock_jumps_seen = 0;       // clock offsets the consumers read (journal C)
  std::vector<std::string> examples;  // a few ids per problem, for the report

  // Every effect exactly once, in the store and at the provider.
  bool EffectsOk() const {
    return lost == 0 && duplicated == 0 && unexpected == 0 && provider_duplicated == 0 && provider_unexpected == 0 &&
           provider_missing == 0 && acked_not_committed == 0 && effects_without_charge == 0 && applied == unique &&
           effect_rows == unique && provider_charges == unique && charged_cents == expected_cents;
  }
};

// What the check of the two-stage pipeline counted: stage 2's effects
// against the stage-1 effects committed (each adds one outbox message),
// the order per key, the relays' journals (relay.h), the outbox at the end.
struct PipelineCheck {
  int64_t expected = 0;  // stage-1 messages with an effect: each owes one stage-2 effect
  int64_t effects = 0, applied = 0, lost = 0, duplicated = 0, unexpected = 0;
  // Per key, messages first handed over by the relays (all their lives, in
  // time order) with a lower seq than one handed before: the relay's order.
  int64_t relay_order_violations = 0;
  // Per key, first deliveries (the source's attempt 1, journal D) to the
  // one stage-2 consumer (its lives in turn) with a lower seq than one
  // delivered before; checked with one stage-2 consumer only
  // (order_checked). A first delivery a kill cut off before its journal
  // line is not counted: its redelivery is no first one.
  int64_t stage2_order_violations = 0;
  bool order_checked = false;
  // Per key, stage-2 effects applied after one of a higher seq (redeliveries
  // after a lease come back behind later messages; information only).
  int64_t stage2_reordered = 0;
  int64_t relay_handed = 0;       // hand-overs to the broker (journal P)
  int64_t relay_published = 0;    // distinct messages the broker confirmed (journal K)
  int64_t relay_republished = 0;  // hand-overs of a message handed over before
  int64_t relay_lives_stopped = 0, relay_stats_published = 0, relay_stats_republished = 0;  // journal T
  int64_t stage2_deliveries = 0;
  int64_t stage2_duplicates_absorbed = 0;  // deliveries acknowledged without the handler running in that life
  int64_t outbox_backlog = 0, outbox_dead_letters = 0;
  std::vector<std::string> examples;

  bool Ok() const {
    return lost == 0 && duplicated == 0 && unexpected == 0 && applied == expected && effects == expected &&
           relay_order_violations == 0 && stage2_order_violations == 0 && outbox_backlog == 0 &&
           outbox_dead_letters == 0;
  }
};

// Reads the stage-1 effect table in `store`, its outbox, stage 2's effect
// table in `store2`, DIR/journal2/* and DIR/relay/*, and counts.
Result<PipelineCheck> CheckPipeline(const Config& cfg, Store& store, Store& store2);

// Reads DIR/oracle.log, the effect table in `store`, the provider's charges
// (ProviderStore(cfg)), DIR/journal/* and DIR/provider.log, and counts.
Result<EffectCheck> CheckEffects(const Config& cfg, Store& store);

}  // namespace idem::cli::chaos

#endif  // IDEM_TOOLS_IDEM_CHAOS_ORACLE_H_
