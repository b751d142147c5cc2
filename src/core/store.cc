// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/store.h"

#include <string>

namespace idem {

Result<ClaimOutcome> TransactionalClaims::ClaimInTransaction(const ClaimRequest&) {
  return Status::Internal("this store cannot claim inside a transaction");
}

Status TransactionalClaims::CompleteInTransaction(const ClaimToken&, std::string_view, bool, int64_t) {
  return Status::Internal("this store cannot complete a claim inside a transaction");
}

std::vector<Result<ClaimOutcome>> TransactionalClaims::ClaimManyInTransaction(std::span<const ClaimRequest> requests) {
  std::vector<Result<ClaimOutcome>> out;
  out.reserve(requests.size());
  for (const ClaimRequest& r : requests) out.push_back(ClaimInTransaction(r));
  return out;
}

std::vector<Status> TransactionalClaims::CompleteManyInTransaction(std::span<const Completion> completions,
                                                                   int64_t retention_ms) {
  std::vector<Status> out;
  out.reserve(completions.size());
  for (const Completion& c : completions)
    out.push_back(CompleteInTransaction(*c.token, c.result, c.is_error, retention_ms));
  return out;
}

Result<std::vector<std::optional<Fingerprint>>> StoreTransaction::InsertMarkers(std::span<const Marker> markers) {
  std::vector<std::optional<Fingerprint>> out;
  out.reserve(markers.size());
  for (const Marker& m : markers) {
    IDEM_ASSIGN_OR_RETURN(auto r, InsertMarker(m));
    out.push_back(r);
  }
  return out;
}

}  // namespace idem
