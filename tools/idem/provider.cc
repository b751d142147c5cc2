// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "provider.h"

#include "idem/sqlite/store.h"

namespace idem::cli {

Result<std::unique_ptr<Provider>> Provider::Open(const std::string& path) {
  // The provider keeps its data in a SQLite file of its own; the store gives
  // us transactions with BEGIN IMMEDIATE, so processes sharing it serialise.
  IDEM_ASSIGN_OR_RETURN(auto db, sqlite::Open({.path = path}));
  IDEM_ASSIGN_OR_RETURN(auto tx, db->Begin());
  IDEM_RETURN_IF_ERROR(tx->Exec("CREATE TABLE IF NOT EXISTS provider_charges("
                                " seq INTEGER PRIMARY KEY, idempotency_key TEXT NOT NULL UNIQUE,"
                                " order_id TEXT NOT NULL, cents INTEGER NOT NULL)")
                           .status());
  IDEM_RETURN_IF_ERROR(
      tx->Exec("CREATE TABLE IF NOT EXISTS provider_calls(n INTEGER NOT NULL)").status());
  IDEM_RETURN_IF_ERROR(tx->Exec("INSERT INTO provider_calls SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM provider_calls)")
                           .status());
  IDEM_RETURN_IF_ERROR(tx->Commit());
  return std::unique_ptr<Provider>(new Provider(std::move(db)));
}

Result<ChargeResult> Provider::Charge(const std::string& key, const std::string& order, int64_t cents,
                                      bool lose_response) {
  IDEM_ASSIGN_OR_RETURN(auto tx, db_->Begin());
  IDEM_RETURN_IF_ERROR(tx->Exec("UPDATE provider_calls SET n = n + 1").status());
  IDEM_ASSIGN_OR_RETURN(Rows seen,
                        tx->Query("SELECT seq, cents FROM provider_charges WHERE idempotency_key = $1", {key}));
  ChargeResult r;
  if (!seen.rows.empty()) {
    r.charge_id = "ch_" + seen.rows[0][0].AsText();
    r.cents = seen.rows[0][1].AsInt();
    r.replayed = true;
  } else {
    IDEM_ASSIGN_OR_RETURN(Rows ins, tx->Query("INSERT INTO provider_charges(idempotency_key, order_id, cents)"
                                              " VALUES ($1, $2, $3) RETURNING seq",
                                              {key, order, cents}));
    r.charge_id = "ch_" + ins.rows[0][0].AsText();
    r.cents = cents;
  }
  IDEM_RETURN_IF_ERROR(tx->Commit());
  if (lose_response) return Status::Unavailable("provider response lost (charge " + r.charge_id + " was made)");
  return r;
}

Result<std::pair<int64_t, int64_t>> Provider::Totals() {
  IDEM_ASSIGN_OR_RETURN(auto tx, db_->Begin());
  IDEM_ASSIGN_OR_RETURN(Rows r, tx->Query("SELECT count(*), coalesce(sum(cents), 0) FROM provider_charges"));
  return std::make_pair(r.rows[0][0].AsInt(), r.rows[0][1].AsInt());
}

Result<int64_t> Provider::Calls() {
  IDEM_ASSIGN_OR_RETURN(auto tx, db_->Begin());
  IDEM_ASSIGN_OR_RETURN(Rows r, tx->Query("SELECT n FROM provider_calls"));
  return r.rows[0][0].AsInt();
}

}  // namespace idem::cli
