// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/store.h"

#include "idem/claims.h"

#include <cstdlib>
#include <string>

namespace idem {

int64_t Value::AsInt() const {
  if (auto* i = std::get_if<int64_t>(&v_)) return *i;
  if (auto* d = std::get_if<double>(&v_)) return static_cast<int64_t>(*d);
  if (auto* s = std::get_if<std::string>(&v_)) return std::strtoll(s->c_str(), nullptr, 10);
  return 0;
}

double Value::AsDouble() const {
  if (auto* i = std::get_if<int64_t>(&v_)) return static_cast<double>(*i);
  if (auto* d = std::get_if<double>(&v_)) return *d;
  if (auto* s = std::get_if<std::string>(&v_)) return std::strtod(s->c_str(), nullptr);
  return 0;
}

std::string Value::AsText() const {
  if (auto* i = std::get_if<int64_t>(&v_)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v_)) return std::to_string(*d);
  if (auto* s = std::get_if<std::string>(&v_)) return *s;
  if (auto* b = std::get_if<Blob>(&v_)) return b->bytes;
  return {};
}

Result<ClaimOutcome> StoreTransaction::ClaimInTransaction(const ClaimRequest&) {
  return Status::Internal("this store cannot claim inside a transaction");
}

Status StoreTransaction::CompleteInTransaction(const ClaimToken&, std::string_view, bool, int64_t) {
  return Status::Internal("this store cannot complete a claim inside a transaction");
}

std::vector<Result<ClaimOutcome>> StoreTransaction::ClaimManyInTransaction(std::span<const ClaimRequest> requests) {
  std::vector<Result<ClaimOutcome>> out;
  out.reserve(requests.size());
  for (const ClaimRequest& r : requests) out.push_back(ClaimInTransaction(r));
  return out;
}

std::vector<Status> StoreTransaction::CompleteManyInTransaction(std::span<const Completion> completions,
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
