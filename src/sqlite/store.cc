// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/sqlite/store.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "sqlite/db.h"
#include "sqlite/schema.h"

namespace idem::sqlite {
namespace {

using sqlite_internal::Db;
using sqlite_internal::StmtUse;

Fingerprint ToFingerprint(const Value& v) {
  Fingerprint fp{};
  std::string bytes = v.AsText();
  std::memcpy(fp.data(), bytes.data(), std::min(bytes.size(), fp.size()));
  return fp;
}
Blob FpBlob(const Fingerprint& fp) { return Blob{std::string(reinterpret_cast<const char*>(fp.data()), fp.size())}; }
Blob IdBlob(std::string_view id) { return Blob{std::string(id)}; }

class SqliteStore;

// Hands a pooled connection back when destroyed.
class Lease {
 public:
  Lease(SqliteStore* store, std::unique_ptr<Db> db) : store_(store), db_(std::move(db)) {}
  Lease(Lease&&) = default;
  ~Lease();
  Db& operator*() { return *db_; }
  Db* operator->() { return db_.get(); }

 private:
  SqliteStore* store_;
  std::unique_ptr<Db> db_;
};

class SqliteTransaction final : public StoreTransaction {
 public:
  explicit SqliteTransaction(Lease conn) : conn_(std::move(conn)) {}
  ~SqliteTransaction() override { Rollback(); }

  Result<int64_t> Exec(std::string_view sql, std::span<const Value> params) override {
    if (Status s = Usable(); !s.ok()) return s;
    return conn_->Exec(sql, params);
  }
  Result<Rows> Query(std::string_view sql, std::span<const Value> params) override {
    if (Status s = Usable(); !s.ok()) return s;
    return conn_->Query(sql, params);
  }
  void* NativeHandle() override { return conn_->raw(); }

  Result<std::optional<Fingerprint>> InsertMarker(const Marker& m) override {
    IDEM_RETURN_IF_ERROR(Usable());
    Value ins[] = {m.consumer, IdBlob(m.id), FpBlob(m.fingerprint), m.processed_at_ms};
    IDEM_ASSIGN_OR_RETURN(int64_t changed, conn_->Exec(sqlite_internal::kInsertMarker, ins));
    if (changed == 1) return std::optional<Fingerprint>();
    Value key[] = {m.consumer, IdBlob(m.id)};
    IDEM_ASSIGN_OR_RETURN(Rows rows, conn_->Query(sqlite_internal::kFindMarker, key));
    if (rows.rows.empty()) return Status::Internal("marker insert was ignored but no marker exists");
    return std::optional<Fingerprint>(ToFingerprint(rows.rows[0][0]));
  }

  Status DeleteMarker(std::string_view consumer, std::string_view id) override {
    IDEM_RETURN_IF_ERROR(Usable());
    Value p[] = {std::string(consumer), IdBlob(id)};
    return conn_->Exec(sqlite_internal::kDeleteMarker, p).status();
  }

  Status PutDeadLetter(const DeadLetter& d) override {
    IDEM_RETURN_IF_ERROR(Usable());
    Value p[] = {d.consumer, IdBlob(d.id), d.reason, d.error, d.attempts, Blob{d.payload}, d.at_ms};
    return conn_->Exec(sqlite_internal::kPutDeadLetter, p).status();
  }

  Status Savepoint() override { return Script("SAVEPOINT idem_sp"); }
  Status ReleaseSavepoint() override { return Script("RELEASE idem_sp"); }
  Status RollbackToSavepoint() override {
    IDEM_RETURN_IF_ERROR(Script("ROLLBACK TO idem_sp"));
    return Script("RELEASE idem_sp");
  }

  Status Commit() override {
    IDEM_RETURN_IF_ERROR(Usable());
    auto r = conn_->Exec("COMMIT", {});
    if (r.ok()) {
      done_ = true;
      return Status::OK();
    }
    if (!conn_->in_transaction()) {
      // SQLite rolled the transaction back itself. After an I/O error during
      // COMMIT the WAL may or may not hold the commit record: in doubt.
      done_ = true;
      if (r.status().code() == Code::kIoError) return Status::InDoubt(r.status().message());
      return r.status();
    }
    Rollback();
    return r.status();
  }

  void Rollback() noexcept override {
    if (done_) return;
    done_ = true;
    if (conn_->in_transaction()) (void)conn_->Script("ROLLBACK");
  }

 private:
  Status Usable() const {
    return done_ ? Status::Internal("transaction already committed or rolled back") : Status::OK();
  }
  Status Script(const char* sql) {
    IDEM_RETURN_IF_ERROR(Usable());
    return conn_->Exec(sql, {}).status();
  }

  Lease conn_;
  bool done_ = false;
};

class SqliteStore final : public Store {
 public:
  explicit SqliteStore(Options o) : options_(std::move(o)) {
    if (options_.env == nullptr) options_.env = Env::Default();
  }

  Status Init(std::unique_ptr<Db> first) {
    IDEM_RETURN_IF_ERROR(Migrate(*first));
    Return(std::move(first));
    return Status::OK();
  }

  Result<std::unique_ptr<StoreTransaction>> Begin() override {
    IDEM_ASSIGN_OR_RETURN(Lease conn, Take());
    IDEM_RETURN_IF_ERROR(conn->Script("BEGIN IMMEDIATE").WithContext(options_.path));
    return std::unique_ptr<StoreTransaction>(new SqliteTransaction(std::move(conn)));
  }

  Result<std::optional<Marker>> FindMarker(std::string_view consumer, std::string_view id) override {
    IDEM_ASSIGN_OR_RETURN(Lease conn, Take());
    Value key[] = {std::string(consumer), IdBlob(id)};
    IDEM_ASSIGN_OR_RETURN(Rows rows, conn->Query(sqlite_internal::kFindMarker, key));
    if (rows.rows.empty()) return std::optional<Marker>();
    return std::optional<Marker>(
        Marker{std::string(consumer), std::string(id), ToFingerprint(rows.rows[0][0]), rows.rows[0][1].AsInt()});
  }

  Result<FailureCount> RecordFailure(const FailureRecord& f) override {
    IDEM_ASSIGN_OR_RETURN(auto tx, Begin());
    auto& stx = static_cast<SqliteTransaction&>(*tx);
    Value p[] = {std::string(f.consumer), IdBlob(f.message->id), std::string(f.error), f.now_ms};
    IDEM_ASSIGN_OR_RETURN(Rows rows, stx.Query(sqlite_internal::kBumpFailure, p));
    FailureCount count;
    count.attempts = rows.rows.empty() ? 1 : static_cast<int>(rows.rows[0][0].AsInt());
    if (f.max_attempts > 0 && count.attempts >= f.max_attempts) {
      IDEM_RETURN_IF_ERROR(stx.PutDeadLetter(DeadLetter{std::string(f.consumer), f.message->id, "failed",
                                                        std::string(f.error), count.attempts, f.message->payload,
                                                        f.now_ms}));
      count.dead_lettered = true;
    }
    IDEM_RETURN_IF_ERROR(tx->Commit());
    return count;
  }

  Status ClearFailures(std::string_view consumer, std::string_view id) override {
    IDEM_ASSIGN_OR_RETURN(Lease conn, Take());
    Value p[] = {std::string(consumer), IdBlob(id)};
    return conn->Exec(sqlite_internal::kClearFailure, p).status();
  }

  Result<int64_t> Purge(std::string_view consumer, int64_t before_ms, int batch_size) override {
    if (batch_size < 1) return Status::InvalidArgument("purge batch size must be at least 1");
    int64_t total = 0;
    for (;;) {
      IDEM_ASSIGN_OR_RETURN(auto tx, Begin());
      Value p[] = {before_ms, std::string(consumer), int64_t{batch_size}};
      IDEM_ASSIGN_OR_RETURN(int64_t n, tx->Exec(sqlite_internal::kPurgeMarkers, p));
      IDEM_RETURN_IF_ERROR(tx->Commit());
      total += n;
      if (n < batch_size) return total;
    }
  }

  Result<int64_t> CountMarkers(std::string_view consumer) override {
    IDEM_ASSIGN_OR_RETURN(Lease conn, Take());
    Value p[] = {std::string(consumer)};
    IDEM_ASSIGN_OR_RETURN(Rows rows, conn->Query(sqlite_internal::kCountMarkers, p));
    return rows.rows[0][0].AsInt();
  }

  Result<std::vector<Marker>> ListMarkers(std::string_view consumer, int limit) override {
    IDEM_ASSIGN_OR_RETURN(Lease conn, Take());
    Value p[] = {std::string(consumer), int64_t{limit}};
    IDEM_ASSIGN_OR_RETURN(Rows rows, conn->Query(sqlite_internal::kListMarkers, p));
    std::vector<Marker> out;
    for (auto& r : rows.rows) out.push_back(Marker{r[0].AsText(), r[1].AsText(), ToFingerprint(r[2]), r[3].AsInt()});
    return out;
  }

  Result<std::vector<DeadLetter>> ListDeadLetters(std::string_view consumer, int limit) override {
    IDEM_ASSIGN_OR_RETURN(Lease conn, Take());
    Value p[] = {std::string(consumer), int64_t{limit}};
    IDEM_ASSIGN_OR_RETURN(Rows rows, conn->Query(sqlite_internal::kListDeadLetters, p));
    std::vector<DeadLetter> out;
    for (auto& r : rows.rows)
      out.push_back(DeadLetter{r[0].AsText(), r[1].AsText(), r[2].AsText(), r[3].AsText(),
                               static_cast<int>(r[4].AsInt()), r[5].AsText(), r[6].AsInt()});
    return out;
  }

  Result<SchemaInfo> Schema() override {
    IDEM_ASSIGN_OR_RETURN(Lease conn, Take());
    IDEM_ASSIGN_OR_RETURN(Rows v, conn->Query("SELECT coalesce(max(version), 0) FROM idem_migrations", {}));
    IDEM_ASSIGN_OR_RETURN(Rows ddl, conn->Query("SELECT sql FROM sqlite_schema WHERE name LIKE 'idem\\_%' ESCAPE '\\'"
                                                " AND sql IS NOT NULL ORDER BY type DESC, name",
                                                {}));
    SchemaInfo info;
    info.version = static_cast<int>(v.rows[0][0].AsInt());
    for (auto& r : ddl.rows) info.statements.push_back(r[0].AsText());
    return info;
  }

  std::string_view Kind() const override { return "sqlite"; }

  void Return(std::unique_ptr<Db> db) {
    if (db->in_transaction()) return;  // never reuse a connection in an unknown state
    std::lock_guard<std::mutex> l(mu_);
    if (pool_.size() < 16) pool_.push_back(std::move(db));
  }

 private:
  Result<Lease> Take() {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!pool_.empty()) {
        auto db = std::move(pool_.back());
        pool_.pop_back();
        return Lease(this, std::move(db));
      }
    }
    IDEM_ASSIGN_OR_RETURN(auto db, Db::Open(OpenOptionsFor(options_, true)));
    return Lease(this, std::move(db));
  }

  Status Migrate(Db& db) {
    IDEM_RETURN_IF_ERROR(db.Script("BEGIN IMMEDIATE").WithContext("migrate " + options_.path));
    auto fail = [&](Status s) {
      (void)db.Script("ROLLBACK");
      return s;
    };
    IDEM_ASSIGN_OR_RETURN(
        Rows has, db.Query("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'idem_migrations'", {}));
    if (has.rows[0][0].AsInt() == 0 && !options_.create_if_missing)
      return fail(Status(Code::kSchemaMismatch, options_.path + " has no idem schema (create_if_missing is off)"));
    if (Status s = db.Script(sqlite_internal::kCreateMigrations); !s.ok()) return fail(s);
    auto v = db.Query("SELECT coalesce(max(version), 0) FROM idem_migrations", {});
    if (!v.ok()) return fail(v.status());
    int version = static_cast<int>(v->rows[0][0].AsInt());
    if (version > sqlite_internal::kSchemaVersion)
      return fail(Status(Code::kSchemaMismatch,
                         options_.path + " has idem schema version " + std::to_string(version) +
                             ", newer than this build understands (" +
                             std::to_string(sqlite_internal::kSchemaVersion) + "): upgrade idem"));
    for (const auto& m : sqlite_internal::kMigrations) {
      if (m.version <= version) continue;
      if (Status s = db.Script(m.sql); !s.ok())
        return fail(s.WithContext("migration " + std::to_string(m.version)));
      Value p[] = {m.version, m.description, options_.env->NowMs()};
      auto r = db.Exec("INSERT INTO idem_migrations(version, description, applied_at_ms) VALUES ($1, $2, $3)", p);
      if (!r.ok()) return fail(r.status());
    }
    return db.Script("COMMIT");
  }

 public:
  static sqlite_internal::OpenOptions OpenOptionsFor(const Options& o, bool create) {
    sqlite_internal::OpenOptions oo;
    oo.path = o.path;
    oo.create = create;
    oo.busy_timeout_ms = o.busy_timeout_ms;
    oo.cache_kib = o.cache_kib;
    oo.synchronous = o.synchronous == Synchronous::kFull ? "FULL" : o.synchronous == Synchronous::kNormal ? "NORMAL" : "OFF";
    return oo;
  }

 private:
  Options options_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Db>> pool_;
};

Lease::~Lease() {
  if (db_ && store_) store_->Return(std::move(db_));
}

}  // namespace

Result<std::unique_ptr<Store>> Open(const Options& options) {
  if (options.path.empty()) return Status::InvalidArgument("SQLite store: path is empty");
  IDEM_ASSIGN_OR_RETURN(auto db, Db::Open(SqliteStore::OpenOptionsFor(options, options.create_if_missing)));
  auto store = std::make_unique<SqliteStore>(options);
  IDEM_RETURN_IF_ERROR(store->Init(std::move(db)));
  return std::unique_ptr<Store>(std::move(store));
}

Result<Options> ParseUrl(std::string_view url) {
  Options o;
  std::string_view rest = url;
  if (rest.starts_with("sqlite://")) {
    rest.remove_prefix(9);
  } else if (rest.starts_with("sqlite:")) {
    rest.remove_prefix(7);
  } else if (rest.find("://") != std::string_view::npos) {
    return Status::InvalidArgument("not a SQLite URL: " + std::string(url) + " (expected sqlite:PATH)");
  }
  std::string_view query;
  if (auto q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  if (rest.empty()) return Status::InvalidArgument("SQLite URL has no path: " + std::string(url));
  o.path = std::string(rest);
  while (!query.empty()) {
    auto amp = query.find('&');
    std::string_view kv = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    auto eq = kv.find('=');
    std::string_view k = kv.substr(0, eq), v = eq == std::string_view::npos ? "" : kv.substr(eq + 1);
    if (k == "synchronous") {
      if (v == "full" || v == "FULL") o.synchronous = Synchronous::kFull;
      else if (v == "normal" || v == "NORMAL") o.synchronous = Synchronous::kNormal;
      else if (v == "off" || v == "OFF") o.synchronous = Synchronous::kOff;
      else return Status::InvalidArgument("synchronous must be full, normal or off, not '" + std::string(v) + "'");
    } else if (k == "busy_timeout_ms") {
      o.busy_timeout_ms = std::atoi(std::string(v).c_str());
    } else {
      return Status::InvalidArgument("unknown SQLite URL option '" + std::string(k) + "' in " + std::string(url));
    }
  }
  return o;
}

}  // namespace idem::sqlite
