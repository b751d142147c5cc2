// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// ClaimStore: the storage contract of the two-phase mode (idem/claims.h),
// what a store implements. Users open one (idem::OpenClaimStore, a SQL
// store's Store::claim_store(), idem::redis::ClaimStore::Open) and hand it
// to idem::Claims; they do not call it directly.
//
// Fencing: every claim that starts the work gets a fencing token from a
// counter that only grows, store-wide (on Redis, per key: each new holder's
// token is above every earlier holder's; see redis/claim_store.h). When a
// holder's lease expires, the next claimer takes the key over with a higher
// token, and from then on the old holder's Complete, Release and Extend are
// refused with Code::kLeaseLost.
//
// Time: leases and expiry are judged by the store's clock (the server's on
// PostgreSQL and Redis; the machine's on SQLite, which is local), never by a
// client's own, so clients with skewed clocks agree on who holds a key.
//
// Thread safety: every ClaimStore may be used from many threads.
#ifndef IDEM_CLAIM_STORE_H_
#define IDEM_CLAIM_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/claim_types.h"
#include "idem/result.h"
#include "idem/status.h"

namespace idem {

// The storage contract for claims. Every operation is one atomic step on the
// store, judged by the store's clock. Implemented by the SQLite and
// PostgreSQL stores (Store::claim_store() of what idem::sqlite::Store::Open
// and idem::postgres::Store::Open return) and by idem::redis::ClaimStore.
class ClaimStore {
 public:
  virtual ~ClaimStore() = default;

  // One atomic attempt: starts, takes over, reports in progress, replays or
  // reports a conflict. Never waits.
  virtual Result<ClaimOutcome> TryClaim(const ClaimRequest& request) = 0;
  // Stores the result and marks the key completed until now + retention_ms.
  // kLeaseLost if the key was taken over or is no longer claimed; OK if the
  // same token completed it already (a retried Complete).
  virtual Status Complete(const ClaimToken& token, std::string_view result, bool is_error, int64_t retention_ms) = 0;
  // TryClaim and Complete for many keys at once, one answer each, in order:
  // each is still its own atomic step (a failure of one says nothing of the
  // others). The defaults take them one by one; Redis sends them in one
  // pipeline (one round trip), which is where a consumer's batch or many
  // calls in flight on one thread gain.
  virtual std::vector<Result<ClaimOutcome>> TryClaimMany(std::span<const ClaimRequest> requests);
  virtual std::vector<Status> CompleteMany(std::span<const Completion> completions, int64_t retention_ms);
  // Forgets the claim (FailPolicy::kRelease). kLeaseLost as for Complete.
  virtual Status Release(const ClaimToken& token) = 0;
  // Moves the lease end to now + lease_ms; returns the new end.
  virtual Result<int64_t> Extend(const ClaimToken& token, int64_t lease_ms) = 0;

  virtual Result<std::optional<ClaimRecord>> FindClaim(std::string_view scope, std::string_view key) = 0;
  // At most `limit` (>= 0; negative is kInvalidArgument), newest first; an
  // empty scope means every scope.
  virtual Result<std::vector<ClaimRecord>> ListClaims(std::string_view scope, int limit) = 0;
  // What TryClaim would answer without writing anything: a replay, a
  // conflict or in progress; std::nullopt when it would start or take over
  // (one read; the default always says std::nullopt).
  virtual Result<std::optional<ClaimOutcome>> Peek(const ClaimRequest& request);
  // How many records `scope` holds (in progress or completed, expired or
  // not). The default lists them; the SQL stores count.
  virtual Result<int64_t> CountClaims(std::string_view scope);
  // Deletes completed records whose retention ended and in-progress records
  // abandoned for longer than `abandoned_after_ms` past their lease, at most
  // `batch_size` per step. Returns how many were deleted.
  virtual Result<int64_t> PurgeClaims(std::string_view scope, int64_t abandoned_after_ms, int batch_size) = 0;
  // The store's clock, in ms since the Unix epoch.
  virtual Result<int64_t> NowMs() = 0;

  // A subscription to changes of one key, for bounded waits. Taken before
  // the key is read, so a change made after that read is never missed.
  class Watch {
   public:
    virtual ~Watch() = default;
    // Blocks (for real) until the key may have changed since the watch was
    // taken or last woke, or `max_wait_ms` passed. Spurious returns are fine.
    virtual void Wait(int64_t max_wait_ms) = 0;
  };
  // The default watch is woken by a Complete or Release made in this process
  // (other processes' are seen at the caller's next poll); PostgreSQL's is
  // woken by LISTEN/NOTIFY from any process.
  virtual std::unique_ptr<Watch> WatchKey(std::string_view scope, std::string_view key);

  // As Store::WriteLockId: the write lock a commit of this store takes when
  // other store objects can share it (a SQLite file); empty otherwise.
  virtual std::string WriteLockId() const { return {}; }

 protected:
  // Wakes this process's default watches of (scope, key).
  static void NotifyChanged(std::string_view scope, std::string_view key);
};

}  // namespace idem

#endif  // IDEM_CLAIM_STORE_H_
