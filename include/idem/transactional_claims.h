// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// TransactionalClaims: claims (idem/claims.h) taken and completed inside a
// store's open transaction, so that the claim record's change commits, or
// rolls back, with the transaction's other writes. Used by idem::http's
// transactional routes; every StoreTransaction (idem/store.h) is one, and
// the SQL stores implement it. A handler never calls these.
//
// Thread safety: as the transaction's (one thread at a time).
#ifndef IDEM_TRANSACTIONAL_CLAIMS_H_
#define IDEM_TRANSACTIONAL_CLAIMS_H_

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "idem/claim_types.h"
#include "idem/result.h"
#include "idem/status.h"

namespace idem {

class TransactionalClaims {
 public:
  virtual ~TransactionalClaims() = default;

  // Claims inside this transaction: the record's change
  // commits, or rolls back, with the transaction's other writes (used by
  // idem::http's transactional routes). A concurrent claim of the same key
  // waits for this transaction. Default: Code::kInternal (not supported).
  virtual Result<ClaimOutcome> ClaimInTransaction(const ClaimRequest& request);
  virtual Status CompleteInTransaction(const ClaimToken& token, std::string_view result, bool is_error,
                                       int64_t retention_ms);
  // Many at once, each answered as the one-key call would; later requests
  // see earlier ones (the same key twice: the second finds the first in
  // progress). PostgreSQL sends the inserts, and the completions, in one
  // round trip each. Default: the one-key calls in turn.
  virtual std::vector<Result<ClaimOutcome>> ClaimManyInTransaction(std::span<const ClaimRequest> requests);
  virtual std::vector<Status> CompleteManyInTransaction(std::span<const Completion> completions, int64_t retention_ms);

 protected:
  TransactionalClaims() = default;
};

}  // namespace idem

#endif  // IDEM_TRANSACTIONAL_CLAIMS_H_
