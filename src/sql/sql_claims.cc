// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Claims (two-phase mode) on SQL stores. Every step is one atomic write: an
// INSERT for a new key, or a compare-and-set UPDATE that names the fence and
// state it saw, so a decision made on a read that went stale changes nothing
// and is made again.
#include <algorithm>
#include <string>

#include "core/claim_rules.h"
#include "sql/sql_store.h"

namespace idem::sql_internal {
namespace {

constexpr int kInProgress = 0;
constexpr int kCompleted = 1;
// Reads and compare-and-set writes racing with others: each lost race means
// another claimer made progress, so a few rounds settle it.
constexpr int kMaxRounds = 16;

ClaimRecord ToRecord(const std::vector<Value>& r) {
  ClaimRecord c;
  c.scope = r[0].AsText();
  c.key = r[1].AsText();
  c.state = r[2].AsInt() == kCompleted ? ClaimRecord::State::kCompleted : ClaimRecord::State::kInProgress;
  c.fingerprint = ToFingerprint(r[3]);
  c.fence = r[4].AsInt();
  c.lease_until_ms = r[5].AsInt();
  c.expires_at_ms = r[6].AsInt();
  c.result = r[7].AsText();
  c.result_is_error = r[8].AsInt() != 0;
  c.updated_at_ms = r[9].AsInt();
  return c;
}

// The parameters of the claims SQL's insert and complete (see ClaimsSql).
std::vector<Value> InsertParams(const ClaimRequest& r, const Value& now) {
  return {r.scope, IdBlob(r.key), FingerprintBlob(r.fingerprint), r.lease_ms, now};
}
std::vector<Value> CompleteParams(const ClaimToken& t, std::string_view result, bool is_error, int64_t retention_ms,
                                  const Value& now) {
  return {t.scope, IdBlob(t.key), t.fence, Blob{std::string(result)}, is_error ? 1 : 0, retention_ms, now};
}

ClaimOutcome Started(const ClaimRequest& r, int64_t fence, int64_t lease_until_ms, bool took_over) {
  return internal::StartedClaim(r, fence, lease_until_ms, took_over);
}

}  // namespace

Result<std::optional<std::pair<int64_t, int64_t>>> SqlStore::FencedWrite(Connection* in_tx, const char* sql,
                                                                         std::span<const Value> params) {
  Rows rows;
  if (in_tx != nullptr) {  // the caller's transaction: it commits
    IDEM_ASSIGN_OR_RETURN(rows, FencedQuery(*in_tx, sql, params));
  } else if (dialect_.claims->bump_fence == nullptr) {
    IDEM_ASSIGN_OR_RETURN(Lease c, Take());
    IDEM_ASSIGN_OR_RETURN(rows, c->Query(sql, params));  // one statement, its own transaction
  } else {
    IDEM_ASSIGN_OR_RETURN(rows, FencedAlone(sql, std::vector<Value>(params.begin(), params.end())));
  }
  if (rows.rows.empty()) return std::optional<std::pair<int64_t, int64_t>>();
  return std::optional<std::pair<int64_t, int64_t>>({rows.rows[0][0].AsInt(), rows.rows[0][1].AsInt()});
}

Result<Rows> SqlStore::FencedQuery(Connection& c, std::string_view sql, std::span<const Value> params) {
  if (dialect_.claims->bump_fence != nullptr) IDEM_RETURN_IF_ERROR(c.Exec(dialect_.claims->bump_fence, {}).status());
  return c.Query(sql, params);
}

Result<Rows> SqlStore::FencedAlone(std::string_view sql, std::vector<Value> params) {
  IDEM_ASSIGN_OR_RETURN(Lease c, Take());
  IDEM_RETURN_IF_ERROR(c->Script(dialect_.begin));
  Result<Rows> rows = FencedQuery(*c, sql, params);
  if (!rows.ok() || rows->rows.empty()) {
    (void)c->Script("ROLLBACK");
    return rows;
  }
  IDEM_RETURN_IF_ERROR(c->Commit());
  return rows;
}

Result<ClaimOutcome> SqlStore::TryClaim(const ClaimRequest& r) { return ClaimOn(nullptr, r); }

Result<Rows> SqlStore::QueryAlone(std::string_view sql, std::vector<Value> params) {
  IDEM_ASSIGN_OR_RETURN(Lease c, Take());
  return c->Query(sql, params);
}

// What the record in `row` (the select's columns) answers without a write, or
// std::nullopt when the key may be taken (lease ended, result expired).
static std::optional<ClaimOutcome> Decide(const std::vector<Value>& row, const ClaimRequest& r) {
  ClaimRecord rec;
  rec.state = row[0].AsInt() == kCompleted ? ClaimRecord::State::kCompleted : ClaimRecord::State::kInProgress;
  rec.fingerprint = ToFingerprint(row[1]);
  rec.lease_until_ms = row[3].AsInt();
  rec.expires_at_ms = row[4].AsInt();
  rec.result = row[5].AsText();
  rec.result_is_error = row[6].AsInt() != 0;
  return internal::DecideClaim(rec, r, /*now=*/row[8].AsInt());
}

Result<std::optional<ClaimOutcome>> SqlStore::Peek(const ClaimRequest& r) {
  if (dialect_.claims == nullptr) return Status::Internal("this store has no claims");
  IDEM_ASSIGN_OR_RETURN(Lease c, Take());
  Value p[] = {r.scope, IdBlob(r.key), ClaimNow()};
  IDEM_ASSIGN_OR_RETURN(Rows rows, c->Query(dialect_.claims->select, p));
  if (rows.rows.empty()) return std::optional<ClaimOutcome>();
  return Decide(rows.rows[0], r);
}

void SqlStore::NoteClaimFound(bool found) {
  // A lost update between racing claimers only delays a switch.
  const int v = claims_found_.load(std::memory_order_relaxed);
  claims_found_.store(std::clamp(v + (found ? 1 : -1), -16, 16), std::memory_order_relaxed);
}

Result<ClaimOutcome> SqlStore::ClaimOn(Connection* in_tx, const ClaimRequest& r, bool inserted) {
  if (dialect_.claims == nullptr) return Status::Internal("this store has no claims");
  const ClaimsSql& q = *dialect_.claims;
  auto started = [&](std::pair<int64_t, int64_t> fence_lease, bool took_over) -> Result<ClaimOutcome> {
    // Committed on its own: counted once the store counts it durable (in a
    // caller's transaction, that transaction's commit decides).
    if (in_tx == nullptr) IDEM_RETURN_IF_ERROR(Durable("claimed"));
    return Started(r, fence_lease.first, fence_lease.second, took_over);
  };
  for (int round = 0; round < kMaxRounds; ++round) {
    const Value now = ClaimNow();
    if (in_tx != nullptr && round == 0 && !inserted) {
      // Inside a transaction the caller has usually just seen the key absent
      // (Peek): insert first; a row already there answers nothing, and the
      // read below decides.
      IDEM_ASSIGN_OR_RETURN(auto w, FencedWrite(in_tx, q.insert, InsertParams(r, now)));
      if (w.has_value()) return started(*w, false);
    }
    Rows rows;
    // Outside a transaction, where most keys have been new lately: insert
    // first, and read in the same round trip.
    const bool alone = in_tx == nullptr && round == 0;
    if (alone && q.insert_or_read != nullptr && claims_found_.load(std::memory_order_relaxed) <= 0) {
      IDEM_ASSIGN_OR_RETURN(rows, QueryAlone(q.insert_or_read, InsertParams(r, now)));
      if (rows.rows.empty()) continue;  // another claimer inserted it just now: look again
      const bool inserted = rows.rows[0][9].AsInt() != 0;
      NoteClaimFound(!inserted);
      if (inserted) return started({rows.rows[0][2].AsInt(), rows.rows[0][3].AsInt()}, false);
    } else {
      Value p[] = {r.scope, IdBlob(r.key), now};
      if (in_tx != nullptr) {
        IDEM_ASSIGN_OR_RETURN(rows, in_tx->Query(q.select, p));
      } else {
        IDEM_ASSIGN_OR_RETURN(Lease c, Take());
        IDEM_ASSIGN_OR_RETURN(rows, c->Query(q.select, p));
        if (alone) NoteClaimFound(!rows.rows.empty());
      }
    }
    if (rows.rows.empty()) {
      IDEM_ASSIGN_OR_RETURN(auto w, FencedWrite(in_tx, q.insert, InsertParams(r, now)));
      if (w.has_value()) return started(*w, false);
      continue;  // another claimer inserted it first: look again
    }
    const auto& row = rows.rows[0];
    if (auto answered = Decide(row, r)) return std::move(*answered);
    const int state = static_cast<int>(row[0].AsInt());
    const int64_t fence = row[2].AsInt();
    // Free to take: the holder's lease ended, or the stored result expired.
    Value p[] = {r.scope, IdBlob(r.key), FingerprintBlob(r.fingerprint), r.lease_ms, now, fence, state};
    IDEM_ASSIGN_OR_RETURN(auto w, FencedWrite(in_tx, q.take_over, p));
    if (w.has_value()) return started(*w, state == kInProgress);
  }
  return Status::Busy("claim of key '" + r.key + "' in scope '" + r.scope + "' lost " + std::to_string(kMaxRounds) +
                      " races in a row; retry");
}

std::vector<Result<ClaimOutcome>> SqlStore::ClaimManyOn(Connection& tx, std::span<const ClaimRequest> requests) {
  std::vector<Result<ClaimOutcome>> out;
  out.reserve(requests.size());
  const ClaimsSql* q = dialect_.claims;
  if (q == nullptr || requests.size() < 2 || (q->bump_fence != nullptr && q->reserve_fences == nullptr)) {
    for (const ClaimRequest& r : requests) out.push_back(ClaimOn(&tx, r));
    return out;
  }
  const Value now = ClaimNow();
  if (q->bump_fence != nullptr) {
    // A counter row (SQLite): the call's fences in one update, then one
    // insert per key with its own. A key that has a record leaves its fence
    // unused; fences only have to be unique and growing.
    Value n[] = {static_cast<int64_t>(requests.size())};
    Result<Rows> top = tx.Query(q->reserve_fences, n);
    if (!top.ok() || top->rows.empty()) {
      const Status failed = top.ok() ? Status::Internal("the claims' fence counter is missing") : top.status();
      out.assign(requests.size(), failed);
      return out;
    }
    int64_t fence = top->rows[0][0].AsInt() - static_cast<int64_t>(requests.size());
    for (const ClaimRequest& r : requests) {
      std::vector<Value> p = InsertParams(r, now);
      p.push_back(++fence);
      Result<Rows> rows = tx.Query(q->insert_fenced, p);
      if (!rows.ok()) {
        out.push_back(rows.status());
      } else if (rows->rows.empty()) {
        out.push_back(ClaimOn(&tx, r, /*inserted=*/true));  // the key has a record: read it, decide
      } else {
        out.push_back(Started(r, rows->rows[0][0].AsInt(), rows->rows[0][1].AsInt(), /*took_over=*/false));
      }
    }
    return out;
  }
  std::vector<std::vector<Value>> params;
  params.reserve(requests.size());
  for (const ClaimRequest& r : requests) params.push_back(InsertParams(r, now));
  Result<std::vector<Rows>> inserted = tx.QueryMany(dialect_.claims->insert, params);
  for (size_t i = 0; i < requests.size(); ++i) {
    const ClaimRequest& r = requests[i];
    if (!inserted.ok()) {
      out.push_back(inserted.status());
    } else if ((*inserted)[i].rows.empty()) {
      out.push_back(ClaimOn(&tx, r, /*inserted=*/true));  // the key has a record: read it, decide
    } else {
      const auto& row = (*inserted)[i].rows[0];
      out.push_back(Started(r, row[0].AsInt(), row[1].AsInt(), /*took_over=*/false));
    }
  }
  return out;
}

std::vector<Status> SqlStore::CompleteManyOn(Connection& tx, std::span<const Completion> completions,
                                             int64_t retention_ms) {
  std::vector<Status> out;
  out.reserve(completions.size());
  if (dialect_.claims == nullptr || completions.size() < 2) {
    for (const Completion& c : completions)
      out.push_back(CompleteOn(&tx, *c.token, c.result, c.is_error, retention_ms));
    return out;
  }
  const Value now = ClaimNow();
  std::vector<std::vector<Value>> params;
  params.reserve(completions.size());
  for (const Completion& c : completions)
    params.push_back(CompleteParams(*c.token, c.result, c.is_error, retention_ms, now));
  Result<std::vector<Rows>> done = tx.QueryMany(dialect_.claims->complete, params);
  for (size_t i = 0; i < completions.size(); ++i) {
    const ClaimToken& t = *completions[i].token;
    if (!done.ok()) {
      out.push_back(done.status());
    } else if ((*done)[i].rows.empty()) {
      out.push_back(LeaseLost(t, /*completed_ok=*/true));
    } else {
      NotifyChanged(t.scope, t.key);
      out.push_back(Status::OK());
    }
  }
  return out;
}

Status SqlStore::LeaseLost(const ClaimToken& t, bool completed_ok) {
  IDEM_ASSIGN_OR_RETURN(auto rec, FindClaim(t.scope, t.key));
  return internal::LeaseLostFor(t, rec, completed_ok);
}

Status SqlStore::Complete(const ClaimToken& t, std::string_view result, bool is_error, int64_t retention_ms) {
  return CompleteOn(nullptr, t, result, is_error, retention_ms);
}

Status SqlStore::CompleteOn(Connection* in_tx, const ClaimToken& t, std::string_view result, bool is_error,
                            int64_t retention_ms) {
  if (dialect_.claims == nullptr) return Status::Internal("this store has no claims");
  Rows rows;
  {
    std::vector<Value> p = CompleteParams(t, result, is_error, retention_ms, ClaimNow());
    if (in_tx != nullptr) {
      IDEM_ASSIGN_OR_RETURN(rows, in_tx->Query(dialect_.claims->complete, p));
    } else {
      IDEM_ASSIGN_OR_RETURN(rows, QueryAlone(dialect_.claims->complete, std::move(p)));
    }
  }
  if (rows.rows.empty()) return LeaseLost(t, /*completed_ok=*/true);
  if (in_tx == nullptr) IDEM_RETURN_IF_ERROR(Durable("completed"));
  NotifyChanged(t.scope, t.key);
  return Status::OK();
}

Status SqlStore::Release(const ClaimToken& t) {
  if (dialect_.claims == nullptr) return Status::Internal("this store has no claims");
  Rows rows;
  {
    IDEM_ASSIGN_OR_RETURN(Lease c, Take());
    Value p[] = {t.scope, IdBlob(t.key), t.fence};
    IDEM_ASSIGN_OR_RETURN(rows, c->Query(dialect_.claims->release, p));
  }
  if (rows.rows.empty()) return LeaseLost(t, /*completed_ok=*/false);
  NotifyChanged(t.scope, t.key);
  return Status::OK();
}

Result<int64_t> SqlStore::Extend(const ClaimToken& t, int64_t lease_ms) {
  if (dialect_.claims == nullptr) return Status::Internal("this store has no claims");
  Rows rows;
  {
    IDEM_ASSIGN_OR_RETURN(Lease c, Take());
    Value p[] = {t.scope, IdBlob(t.key), t.fence, lease_ms, ClaimNow()};
    IDEM_ASSIGN_OR_RETURN(rows, c->Query(dialect_.claims->extend, p));
  }
  if (rows.rows.empty()) {
    Status s = LeaseLost(t, /*completed_ok=*/false);
    return s.ok() ? Status::Internal("extend changed nothing") : s;
  }
  return rows.rows[0][0].AsInt();
}

Result<std::optional<ClaimRecord>> SqlStore::FindClaim(std::string_view scope, std::string_view key) {
  if (dialect_.claims == nullptr) return Status::Internal("this store has no claims");
  IDEM_ASSIGN_OR_RETURN(Lease c, Take());
  Value p[] = {std::string(scope), IdBlob(key)};
  IDEM_ASSIGN_OR_RETURN(Rows rows, c->Query(dialect_.claims->find, p));
  if (rows.rows.empty()) return std::optional<ClaimRecord>();
  return std::optional<ClaimRecord>(ToRecord(rows.rows[0]));
}

Result<std::vector<ClaimRecord>> SqlStore::ListClaims(std::string_view scope, int limit) {
  if (dialect_.claims == nullptr) return Status::Internal("this store has no claims");
  IDEM_RETURN_IF_ERROR(CheckListLimit(limit));
  IDEM_ASSIGN_OR_RETURN(Lease c, Take());
  Value p[] = {std::string(scope), int64_t{limit}};
  IDEM_ASSIGN_OR_RETURN(Rows rows, c->Query(dialect_.claims->list, p));
  std::vector<ClaimRecord> out;
  for (const auto& r : rows.rows) out.push_back(ToRecord(r));
  return out;
}

Result<int64_t> SqlStore::PurgeClaims(std::string_view scope, int64_t abandoned_after_ms, int batch_size) {
  if (dialect_.claims == nullptr) return Status::Internal("this store has no claims");
  if (batch_size < 1) return Status::InvalidArgument("purge batch size must be at least 1");
  int64_t total = 0;
  for (;;) {
    IDEM_ASSIGN_OR_RETURN(Lease c, Take());
    Value p[] = {std::string(scope), abandoned_after_ms, int64_t{batch_size}, ClaimNow()};
    IDEM_ASSIGN_OR_RETURN(int64_t n, c->Exec(dialect_.claims->purge, p));
    total += n;
    if (n < batch_size) return total;
  }
}

Result<int64_t> SqlStore::CountClaims(std::string_view scope) {
  if (dialect_.claims == nullptr) return Status::Internal("this store has no claims");
  IDEM_ASSIGN_OR_RETURN(Lease c, Take());
  Value p[] = {std::string(scope)};
  IDEM_ASSIGN_OR_RETURN(Rows rows, c->Query(kCountClaims, p));
  return rows.rows[0][0].AsInt();
}

Result<int64_t> SqlStore::NowMs() {
  if (dialect_.claims == nullptr) return Status::Internal("this store has no claims");
  IDEM_ASSIGN_OR_RETURN(Lease c, Take());
  Value p[] = {ClaimNow()};
  IDEM_ASSIGN_OR_RETURN(Rows rows, c->Query(dialect_.claims->now, p));
  return rows.rows[0][0].AsInt();
}

}  // namespace idem::sql_internal
