// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: the rules every claim store applies to a record it read, the
// same on SQL and DynamoDB: what a record answers a claim without a write,
// and why a holder's write that changed nothing was refused.
#ifndef IDEM_SRC_CORE_CLAIM_RULES_H_
#define IDEM_SRC_CORE_CLAIM_RULES_H_

#include <cstdint>
#include <optional>
#include <string>

#include "idem/claim_types.h"
#include "idem/status.h"

namespace idem::internal {

inline std::string DescribeClaimToken(const ClaimToken& t) {
  return "key '" + t.key + "' in scope '" + t.scope + "' (fence " + std::to_string(t.fence) + ")";
}

// What `rec` answers `r` at `now` without a write, or std::nullopt when the
// key may be taken (the holder's lease ended, or the stored result expired).
inline std::optional<ClaimOutcome> DecideClaim(const ClaimRecord& rec, const ClaimRequest& r, int64_t now) {
  const bool completed = rec.state == ClaimRecord::State::kCompleted;
  if (completed && rec.expires_at_ms <= now) return std::nullopt;
  ClaimOutcome out;
  if (rec.fingerprint != r.fingerprint) {
    out.kind = ClaimOutcome::Kind::kConflict;
    out.stored_fingerprint = rec.fingerprint;
    return out;
  }
  if (completed) {
    out.kind = ClaimOutcome::Kind::kCompleted;
    out.result = rec.result;
    out.result_is_error = rec.result_is_error;
    return out;
  }
  if (rec.lease_until_ms > now) {
    out.kind = ClaimOutcome::Kind::kInProgress;
    out.retry_at_ms = rec.lease_until_ms;
    return out;
  }
  return std::nullopt;
}

// The outcome of a claim that starts (or takes over) the work.
inline ClaimOutcome StartedClaim(const ClaimRequest& r, int64_t fence, int64_t lease_until_ms, bool took_over) {
  ClaimOutcome out;
  out.kind = ClaimOutcome::Kind::kStarted;
  out.token = ClaimToken{r.scope, r.key, fence, lease_until_ms};
  out.took_over = took_over;
  return out;
}

// After a holder's conditioned write changed nothing: why `t` no longer
// holds its key, from the record as it is now (OK: a retried Complete, when
// `completed_ok`).
inline Status LeaseLostFor(const ClaimToken& t, const std::optional<ClaimRecord>& rec, bool completed_ok) {
  if (!rec.has_value())
    return Status::LeaseLost(DescribeClaimToken(t) +
                             ": no claim on the key any more (released, or expired and purged)");
  if (rec->fence != t.fence)
    return Status::LeaseLost(DescribeClaimToken(t) + ": the key was taken over by fence " + std::to_string(rec->fence) +
                             " after this lease expired");
  if (rec->state == ClaimRecord::State::kCompleted) {
    if (completed_ok) return Status::OK();  // a retried Complete
    return Status::LeaseLost(DescribeClaimToken(t) + ": the key is already completed");
  }
  return Status::Internal(DescribeClaimToken(t) + ": the claim is ours and in progress, yet the write changed nothing");
}

}  // namespace idem::internal

#endif  // IDEM_SRC_CORE_CLAIM_RULES_H_
