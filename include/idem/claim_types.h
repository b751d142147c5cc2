// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The values of the two-phase mode (idem/claims.h): a claim's request, its
// outcome and token, a key's stored record. Shared by Claims (the user's
// front end), ClaimStore (idem/claim_store.h, what a store implements) and
// TransactionalClaims (idem/transactional_claims.h).
//
// Thread safety: plain values.
#ifndef IDEM_CLAIM_TYPES_H_
#define IDEM_CLAIM_TYPES_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "idem/message.h"

namespace idem {

// What a holder presents to finish or extend its claim.
struct ClaimToken {
  std::string scope{};
  std::string key{};
  int64_t fence = 0;           // the fencing token: higher wins
  int64_t lease_until_ms = 0;  // by the store's clock
};

struct ClaimRequest {
  // A namespace for keys ("charges", an HTTP route, a consumer's name).
  // 1..255 bytes.
  std::string scope{};
  // The idempotency key (a message id, an Idempotency-Key header). 1..255 bytes.
  std::string key{};
  // What the key stands for (FingerprintOf the request body). The same key
  // with another fingerprint is a conflict, on every path.
  Fingerprint fingerprint{};
  // How long the work may run before another claimer may take the key over.
  // Must be > 0.
  int64_t lease_ms = 30'000;
  // When another holder has the key: how long to wait for its result before
  // answering kInProgress. 0: answer at once.
  int64_t wait_ms = 0;
};

struct ClaimOutcome {
  enum class Kind {
    kStarted,     // the key is ours: do the work, then Complete or Fail
    kInProgress,  // another holder's lease is live: retry at retry_at_ms
    kCompleted,   // done before: `result` is the stored result (a replay)
    kConflict,    // the key is held or done for another fingerprint
  };
  Kind kind = Kind::kInProgress;
  ClaimToken token{};                // kStarted
  bool took_over = false;            // kStarted: after another holder's lease expired
  int64_t retry_at_ms = 0;           // kInProgress: the holder's lease end (store clock)
  std::string result{};              // kCompleted
  bool result_is_error = false;      // kCompleted: a failure stored by Fail(kStoreError)
  Fingerprint stored_fingerprint{};  // kConflict
};

// The kind's name in lower case ("started", "completed", ...), for logs.
std::string_view KindName(ClaimOutcome::Kind kind);

// A key's record, for inspection.
struct ClaimRecord {
  enum class State { kInProgress, kCompleted };
  std::string scope{};
  std::string key{};
  State state = State::kInProgress;
  Fingerprint fingerprint{};
  int64_t fence = 0;
  int64_t lease_until_ms = 0;  // kInProgress
  int64_t expires_at_ms = 0;   // kCompleted: may be purged from then on
  std::string result{};        // kCompleted
  bool result_is_error = false;
  int64_t updated_at_ms = 0;
};

// "in_progress" or "completed".
std::string_view StateName(ClaimRecord::State state);

// What Fail does with the key.
enum class FailPolicy {
  kRelease,     // forget the claim: the next call runs the work again
  kStoreError,  // store the error as the result: later calls replay it
};

// One completion of a CompleteMany.
struct Completion {
  const ClaimToken* token = nullptr;
  std::string_view result{};
  bool is_error = false;  // a failure stored as the result (FailPolicy::kStoreError)
};

}  // namespace idem

#endif  // IDEM_CLAIM_TYPES_H_
