// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/postgres/store.h"

#include "idem/env.h"

#include <map>
#include <string>

#include "core/sql_store.h"
#include "postgres/pg.h"
#include "postgres/schema.h"

namespace idem::postgres {
namespace {

using pg_internal::Conn;
using sql_internal::FingerprintBlob;
using sql_internal::IdBlob;
using sql_internal::ToFingerprint;

class PgConnection final : public sql_internal::Connection {
 public:
  explicit PgConnection(std::unique_ptr<Conn> c) : c_(std::move(c)) {}
  Result<int64_t> Exec(std::string_view sql, std::span<const Value> params) override {
    return c_->Affected(sql, params);
  }
  Result<Rows> Query(std::string_view sql, std::span<const Value> params) override { return c_->Query(sql, params); }
  Status Script(std::string_view sql) override { return c_->Script(sql); }
  Status Commit() override {
    PGconn* c = c_->raw();
    if (PQsendQuery(c, "COMMIT") != 1)
      return Status::Unavailable("cannot send COMMIT: " + std::string(PQerrorMessage(c)));
    // The window where the server may commit while the client never learns
    // of it (crash tests cut the connection here).
    IDEM_KILL_POINT("postgres.commit_sent");
    pg_internal::ResultPtr last;
    while (PGresult* r = PQgetResult(c)) last.reset(r);
    if (!c_->healthy() || last == nullptr) {
      // The connection died while committing: the server may or may not
      // have committed. Only reading the marker can tell.
      return Status::InDoubt("connection lost during COMMIT: " + std::string(PQerrorMessage(c)));
    }
    IDEM_RETURN_IF_ERROR(pg_internal::Translate(last.get(), c, "COMMIT"));
    // COMMIT of a transaction that an earlier error aborted answers ROLLBACK.
    if (std::string_view(PQcmdStatus(last.get())) != "COMMIT")
      return Status(Code::kAborted, "COMMIT rolled back: an earlier statement in the transaction failed");
    return Status::OK();
  }
  bool InTransaction() const override { return c_->in_transaction(); }
  bool Healthy() const override { return c_->healthy(); }
  void* Native() override { return c_->raw(); }

 private:
  std::unique_ptr<Conn> c_;
};

constexpr sql_internal::Dialect kDialect{
    .kind = "postgres",
    .begin = "BEGIN",
    .migration_lock = pg_internal::kMigrationLock,
    .create_migrations = pg_internal::kCreateMigrations,
    .migrations = pg_internal::kMigrations,
    .insert_marker = pg_internal::kInsertMarker,
    .find_marker = pg_internal::kFindMarker,
    .delete_marker = pg_internal::kDeleteMarker,
    .purge_markers = pg_internal::kPurgeMarkers,
    .count_markers = pg_internal::kCountMarkers,
    .list_markers = pg_internal::kListMarkers,
};

class PgStore final : public sql_internal::SqlStore {
 public:
  explicit PgStore(const Options& o) : SqlStore(kDialect, o.env, o.pool_size), options_(o) {}

  Result<std::unique_ptr<sql_internal::Connection>> Connect() override {
    IDEM_ASSIGN_OR_RETURN(auto c, Conn::Connect(options_.url, options_.connect_timeout_s));
    return std::unique_ptr<sql_internal::Connection>(new PgConnection(std::move(c)));
  }

  // A batch's markers in two round trips at most: one multi-row INSERT ...
  // ON CONFLICT DO NOTHING RETURNING id, then one SELECT for the ids that
  // already existed. Within the batch, only the first copy of an id is
  // inserted; later copies answer with its fingerprint.
  Result<std::vector<std::optional<Fingerprint>>> InsertMarkers(sql_internal::Connection& c,
                                                                std::span<const Marker> markers) override {
    if (markers.size() == 1) return SqlStore::InsertMarkers(c, markers);
    std::map<std::string_view, size_t> first;  // id -> index of its first copy
    std::vector<size_t> unique;
    for (size_t i = 0; i < markers.size(); ++i)
      if (first.emplace(markers[i].id, i).second) unique.push_back(i);
    std::string sql = pg_internal::kInsertMarkersHead;
    std::vector<Value> params;
    params.reserve(unique.size() * 4);
    for (size_t k = 0; k < unique.size(); ++k) {
      const Marker& m = markers[unique[k]];
      int b = static_cast<int>(k) * 4;
      sql += (k ? ",($" : "($") + std::to_string(b + 1) + ",$" + std::to_string(b + 2) + ",$" +
             std::to_string(b + 3) + ",$" + std::to_string(b + 4) + ")";
      params.emplace_back(m.consumer);
      params.emplace_back(IdBlob(m.id));
      params.emplace_back(FingerprintBlob(m.fingerprint));
      params.emplace_back(m.processed_at_ms);
    }
    sql += pg_internal::kInsertMarkersTail;
    IDEM_ASSIGN_OR_RETURN(Rows inserted, c.Query(sql, params));
    std::map<std::string, bool> was_inserted;
    for (auto& r : inserted.rows) was_inserted[r[0].AsText()] = true;

    std::map<std::string, Fingerprint> stored;  // ids that existed before this batch
    std::string find = pg_internal::kFindMarkersHead;
    std::vector<Value> fparams{markers.front().consumer};
    for (size_t i : unique) {
      if (was_inserted.count(markers[i].id)) continue;
      find += (fparams.size() > 1 ? ",$" : "$") + std::to_string(fparams.size() + 1);
      fparams.emplace_back(IdBlob(markers[i].id));
    }
    if (fparams.size() > 1) {
      find += ")";
      IDEM_ASSIGN_OR_RETURN(Rows found, c.Query(find, fparams));
      for (auto& r : found.rows) stored[r[0].AsText()] = ToFingerprint(r[1]);
    }
    std::vector<std::optional<Fingerprint>> out(markers.size());
    for (size_t i = 0; i < markers.size(); ++i) {
      const std::string& id = markers[i].id;
      if (was_inserted.count(id)) {
        size_t f = first[id];
        if (f != i) out[i] = markers[f].fingerprint;  // a later copy within the batch
        continue;
      }
      auto it = stored.find(id);
      if (it == stored.end()) {
        // Not inserted, yet not visible: a concurrent transaction committed
        // it after this statement's snapshot. A new statement sees it.
        Value key[] = {markers[i].consumer, IdBlob(id)};
        IDEM_ASSIGN_OR_RETURN(Rows one, c.Query(pg_internal::kFindMarker, key));
        if (one.rows.empty()) return Status::Internal("marker insert was ignored but no marker exists");
        it = stored.emplace(id, ToFingerprint(one.rows[0][0])).first;
      }
      out[i] = it->second;
    }
    return out;
  }

 private:
  Options options_;
};

}  // namespace

bool IsUrl(std::string_view url) { return url.starts_with("postgres://") || url.starts_with("postgresql://"); }

Result<std::unique_ptr<Store>> Open(const Options& options) {
  auto store = std::make_unique<PgStore>(options);
  std::string name = options.url.empty() ? "PostgreSQL (PG* environment)" : "PostgreSQL";
  IDEM_RETURN_IF_ERROR(store->Init(options.create_if_missing, name));
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace idem::postgres
