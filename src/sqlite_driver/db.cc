// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "sqlite_driver/db.h"

#include <sys/stat.h>
#include <unistd.h>
#include <cstdlib>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>

#include "sqlite_driver/batched_wal.h"

namespace idem::sqlite_driver {

Code CodeFor(int rc) {
  switch (rc & 0xff) {
    case SQLITE_OK:
    case SQLITE_ROW:
    case SQLITE_DONE: return Code::kOk;
    case SQLITE_BUSY:
    case SQLITE_LOCKED: return Code::kBusy;
    case SQLITE_CONSTRAINT:
      return (rc == SQLITE_CONSTRAINT_PRIMARYKEY || rc == SQLITE_CONSTRAINT_UNIQUE) ? Code::kDuplicate
                                                                                    : Code::kInvalidArgument;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB: return Code::kCorruption;
    case SQLITE_CANTOPEN:
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_AUTH: return Code::kUnavailable;
    case SQLITE_IOERR:
    case SQLITE_FULL:
    case SQLITE_PROTOCOL: return Code::kIoError;
    case SQLITE_INTERRUPT:
    case SQLITE_ABORT: return Code::kAborted;
    case SQLITE_ERROR:
    case SQLITE_MISMATCH:
    case SQLITE_TOOBIG:
    case SQLITE_RANGE: return Code::kInvalidArgument;
    case SQLITE_NOMEM: return Code::kRetryable;
    default: return Code::kInternal;
  }
}

Status Translate(int rc, sqlite3* db, std::string_view what) {
  Code code = CodeFor(rc);
  if (code == Code::kOk) return Status::OK();
  std::string m(what);
  m += ": ";
  // The connection's message is only about this rc when it is the last one.
  if (db != nullptr && sqlite3_extended_errcode(db) == rc) {
    m += sqlite3_errmsg(db);
  } else {
    m += sqlite3_errstr(rc);
  }
  m += " (sqlite code " + std::to_string(rc) + ")";
  return Status(code, std::move(m));
}

std::string RewriteParams(std::string_view sql) {
  std::string out;
  out.reserve(sql.size());
  char quote = 0;
  for (size_t i = 0; i < sql.size(); ++i) {
    char c = sql[i];
    if (quote) {
      out += c;
      if (c == quote) quote = 0;
      continue;
    }
    if (c == '\'' || c == '"' || c == '`') {
      quote = c;
      out += c;
      continue;
    }
    if (c == '$' && i + 1 < sql.size() && std::isdigit(static_cast<unsigned char>(sql[i + 1]))) {
      out += '?';
      continue;
    }
    out += c;
  }
  return out;
}

// SQLite counts every allocation under a global mutex unless told not to;
// idem never reads those counts. Must run before SQLite initialises; if the
// application initialised it already, the call is refused and harmless.
void ConfigureSqliteOnce() {
  static std::once_flag once;
  std::call_once(once, [] { (void)sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0); });
}

namespace {
// Resolves OpenOptions::vfs: nullptr for the default, else a registered name.
Result<const char*> FindVfs(const std::string& name) {
  if (name.empty()) return static_cast<const char*>(nullptr);
  if (sqlite3_vfs_find(name.c_str()) != nullptr) return name.c_str();
  std::string known;
  for (sqlite3_vfs* v = sqlite3_vfs_find(nullptr); v != nullptr; v = v->pNext)
    known += (known.empty() ? "" : ", ") + std::string(v->zName);
  return Status::InvalidArgument("no SQLite VFS named '" + name + "' is registered (registered: " + known + ")");
}
}  // namespace

Result<std::unique_ptr<Db>> Db::Open(const OpenOptions& o) {
  ConfigureSqliteOnce();
  if (o.path.empty()) return Status::InvalidArgument("SQLite path is empty");
  if (o.path != ":memory:") {
    std::string dir = ".";
    if (auto slash = o.path.rfind('/'); slash != std::string::npos) dir = slash == 0 ? "/" : o.path.substr(0, slash);
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return Status::Unavailable("cannot open " + o.path + ": directory " + dir + " does not exist");
    if (::stat(o.path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      return Status::Unavailable("cannot open " + o.path + ": it is a directory, not a database file");
    if (!o.create && ::stat(o.path.c_str(), &st) != 0)
      return Status::NotFound("database file " + o.path + " does not exist");
  }
  auto vfs = FindVfs(o.vfs);
  if (!vfs.ok()) return vfs.status().WithContext("open " + o.path);
  // The batched-WAL shim, over the chosen VFS, only where every commit
  // syncs its WAL before it becomes visible (batched_wal.h).
  const bool batched = o.batch_wal_writes && (o.synchronous == "FULL" || o.synchronous == "EXTRA");
  std::string shim;
  if (batched) {
    auto name = BatchedWalVfs(o.vfs);
    if (!name.ok()) return name.status().WithContext("open " + o.path);
    shim = *name;
    vfs = shim.c_str();
  }
  sqlite3* raw = nullptr;
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | (o.create ? SQLITE_OPEN_CREATE : 0);
  int rc = sqlite3_open_v2(o.path.c_str(), &raw, flags, *vfs);
  std::unique_ptr<Db> db(new Db(raw, o.path));  // closes even when open failed
  db->batched_wal_ = batched;
  if (rc != SQLITE_OK) return Translate(rc, raw, "open " + o.path);
  sqlite3_extended_result_codes(raw, 1);
  // Waiting for another writer's lock: retry every 100 us up to the
  // timeout. SQLite's own busy timeout sleeps in growing steps of up to
  // 100 ms, so a waiter can miss many short transactions of another writer
  // (a purge, a competing consumer, a relay's acks) and stall far longer
  // than it must; a waiter that slept whole milliseconds lost the lock to
  // a writer committing thousands of times a second (an outbox relay behind
  // a consumer acking one by one waited hundreds of ms).
  db->busy_timeout_ms_ = o.busy_timeout_ms;
  if (o.path != ":memory:" && !o.path.empty()) {
    std::error_code ec;
    std::filesystem::path canonical = std::filesystem::weakly_canonical(o.path, ec);
    db->gate_ = WriteGate::For(ec ? o.path : canonical.string());
  }
  sqlite3_busy_handler(
      raw,
      [](void* arg, int tries) -> int {
        const int64_t timeout_us = int64_t{*static_cast<int*>(arg)} * 1000;
        if (int64_t{tries} * 100 >= timeout_us) return 0;  // about 100 us per try
        ::usleep(100);
        return 1;
      },
      &db->busy_timeout_ms_);
  // Reading the schema makes SQLite read the header: a file that is not a
  // database fails here rather than at the first message.
  int64_t tables = 0;
  rc = sqlite3_exec(
      raw, "SELECT count(*) FROM sqlite_schema",
      [](void* out, int, char** values, char**) {
        *static_cast<int64_t*>(out) = values[0] != nullptr ? std::atoll(values[0]) : 0;
        return 0;
      },
      &tables, nullptr);
  if (rc != SQLITE_OK) {
    Status s = Translate(rc, raw, "open " + o.path);
    if (s.code() == Code::kCorruption)
      return Status::Corruption(o.path + " is not a SQLite database, or it is corrupt (" + s.message() + ")");
    return s;
  }
  // An existing file that holds nothing (an empty file, say) is left as it
  // is when we may not create: configuring it below would write to it.
  if (!o.create && tables == 0)
    return Status::SchemaMismatch(o.path + " is an empty database: it holds no tables (not idem's)");
  // page_size only takes effect before the file's first table exists.
  const bool hook = static_cast<bool>(o.after_commit);
  std::string pragmas =
      "PRAGMA page_size=" + std::to_string(o.page_size) +
      "; PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=" + std::to_string(hook ? 0 : o.wal_autocheckpoint_pages) +
      "; PRAGMA synchronous=" + o.synchronous + "; PRAGMA cache_size=-" + std::to_string(o.cache_kib) +
      "; PRAGMA foreign_keys=ON;";
  IDEM_RETURN_IF_ERROR(db->Script(pragmas).WithContext("configure " + o.path));
  if (hook) {
    // Replaces SQLite's autocheckpoint (itself a WAL hook).
    db->after_commit_ = o.after_commit;
    sqlite3_wal_hook(
        raw,
        [](void* arg, sqlite3* conn, const char* name, int pages) -> int {
          if (static_cast<const Db*>(arg)->after_commit_(pages))
            sqlite3_wal_checkpoint_v2(conn, name, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
          return SQLITE_OK;
        },
        db.get());
  }
  return db;
}

std::shared_ptr<WriteGate> WriteGate::For(const std::string& file) {
  static std::mutex registry_mu;
  static std::map<std::string, std::weak_ptr<WriteGate>> registry;
  // Per process: a child forked while a parent's thread held a gate gets
  // its own.
  const std::string key = std::to_string(::getpid()) + ":" + file;
  std::lock_guard<std::mutex> l(registry_mu);
  std::shared_ptr<WriteGate> gate = registry[key].lock();
  if (!gate) {
    gate = std::make_shared<WriteGate>();
    registry[key] = gate;
  }
  return gate;
}

bool WriteGate::Acquire(int timeout_ms) {
  std::unique_lock<std::mutex> l(mu_);
  const uint64_t ticket = next_++;
  if (cv_.wait_for(l, std::chrono::milliseconds(timeout_ms), [&] { return serving_ == ticket; })) return true;
  abandoned_.insert(ticket);  // its turn is skipped when it comes
  return false;
}

size_t WriteGate::Waiting() {
  std::lock_guard<std::mutex> l(mu_);
  // Tickets handed out, minus the holder (or the next to be served) and the
  // waiters that gave up.
  const uint64_t out = next_ - serving_;
  return out == 0 ? 0 : static_cast<size_t>(out - 1 - abandoned_.size());
}

void WriteGate::Release() {
  {
    std::lock_guard<std::mutex> l(mu_);
    ++serving_;
    while (abandoned_.erase(serving_) > 0) ++serving_;
  }
  cv_.notify_all();
}

namespace {
// BEGIN IMMEDIATE or BEGIN EXCLUSIVE, in any case and spacing.
bool BeginsWriteTransaction(std::string_view sql) {
  auto word = [&](std::string_view upper) {
    while (!sql.empty() && std::isspace(static_cast<unsigned char>(sql.front()))) sql.remove_prefix(1);
    if (sql.size() < upper.size()) return false;
    for (size_t i = 0; i < upper.size(); ++i)
      if (std::toupper(static_cast<unsigned char>(sql[i])) != upper[i]) return false;
    sql.remove_prefix(upper.size());
    return true;
  };
  if (sql.empty() ||
      (sql.front() != 'B' && sql.front() != 'b' && !std::isspace(static_cast<unsigned char>(sql.front()))))
    return false;
  if (!word("BEGIN")) return false;
  std::string_view rest = sql;
  if (word("IMMEDIATE")) return true;
  sql = rest;
  return word("EXCLUSIVE");
}
}  // namespace

Status Db::EnterGate(std::string_view sql) {
  if (gate_ == nullptr || gate_held_ || !BeginsWriteTransaction(sql)) return Status::OK();
  if (!gate_->Acquire(busy_timeout_ms_))
    return Status::Busy("database is locked: another writer of " + path_ + " in this process held it for " +
                        std::to_string(busy_timeout_ms_) + " ms (" + std::string(sql.substr(0, 40)) + ")");
  gate_held_ = true;
  return Status::OK();
}

Db::~Db() {
  cache_.clear();  // finalize statements before closing
  if (db_ != nullptr) sqlite3_close_v2(db_);
  if (gate_held_) gate_->Release();
}

Status Db::Script(std::string_view sql) {
  IDEM_RETURN_IF_ERROR(EnterGate(sql));
  std::string s(sql);
  char* err = nullptr;
  int rc = sqlite3_exec(db_, s.c_str(), nullptr, nullptr, &err);
  if (err != nullptr) sqlite3_free(err);
  LeaveGateIfDone();
  return Translate(rc, db_, s.size() > 80 ? s.substr(0, 80) + "..." : s);
}

Result<sqlite3_stmt*> Db::Prepare(std::string_view sql) {
  auto it = cache_.find(sql);
  if (it != cache_.end()) return it->second.get();
  // Cached under the caller's text; $N is rewritten once, on the miss.
  std::string text = RewriteParams(sql);
  sqlite3_stmt* stmt = nullptr;
  const char* tail = nullptr;
  int rc = sqlite3_prepare_v3(db_, text.data(), static_cast<int>(text.size()), SQLITE_PREPARE_PERSISTENT, &stmt, &tail);
  if (rc != SQLITE_OK) return Translate(rc, db_, "prepare: " + std::string(sql.substr(0, 120)));
  if (stmt == nullptr) return Status::InvalidArgument("prepare: the SQL is empty");
  // One statement per call: SQLite would run the first and drop the rest.
  std::string_view rest(tail, static_cast<size_t>(text.data() + text.size() - tail));
  while (!rest.empty() && (std::isspace(static_cast<unsigned char>(rest.front())) || rest.front() == ';'))
    rest.remove_prefix(1);
  if (!rest.empty()) {
    sqlite3_finalize(stmt);
    return Status::InvalidArgument("one statement per call: after '" + std::string(sql.substr(0, 60)) + "' comes '" +
                                   std::string(rest.substr(0, 40)) + "'");
  }
  auto* raw = stmt;
  cache_.emplace(std::string(sql), StmtPtr(stmt));
  return raw;
}

Status Db::Bind(sqlite3_stmt* stmt, std::span<const Value> params) {
  int expected = sqlite3_bind_parameter_count(stmt);
  if (expected != static_cast<int>(params.size()))
    return Status::InvalidArgument("statement takes " + std::to_string(expected) + " parameters, " +
                                   std::to_string(params.size()) + " given");
  for (int i = 0; i < static_cast<int>(params.size()); ++i) {
    const auto& v = params[i].raw();
    int rc = SQLITE_OK;
    if (std::holds_alternative<std::monostate>(v)) {
      rc = sqlite3_bind_null(stmt, i + 1);
    } else if (auto* n = std::get_if<int64_t>(&v)) {
      rc = sqlite3_bind_int64(stmt, i + 1, *n);
    } else if (auto* d = std::get_if<double>(&v)) {
      rc = sqlite3_bind_double(stmt, i + 1, *d);
    } else if (auto* s = std::get_if<std::string>(&v)) {
      rc = sqlite3_bind_text(stmt, i + 1, s->data(), static_cast<int>(s->size()), SQLITE_STATIC);
    } else if (auto* b = std::get_if<Blob>(&v)) {
      rc = sqlite3_bind_blob(stmt, i + 1, b->bytes.data(), static_cast<int>(b->bytes.size()), SQLITE_STATIC);
    }
    if (rc != SQLITE_OK) return Translate(rc, db_, "bind parameter $" + std::to_string(i + 1));
  }
  return Status::OK();
}

Result<bool> Db::Step(sqlite3_stmt* stmt, std::string_view what) {
  int rc = sqlite3_step(stmt);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return Translate(sqlite3_extended_errcode(db_), db_, what);
}

Result<int64_t> Db::Exec(std::string_view sql, std::span<const Value> params) {
  IDEM_RETURN_IF_ERROR(EnterGate(sql));
  Result<int64_t> r = [&]() -> Result<int64_t> {
    IDEM_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, Prepare(sql));
    StmtUse use(stmt);
    IDEM_RETURN_IF_ERROR(Bind(stmt, params));
    for (;;) {
      IDEM_ASSIGN_OR_RETURN(bool row, Step(stmt, sql.substr(0, 120)));
      if (!row) break;
    }
    return static_cast<int64_t>(sqlite3_changes64(db_));
  }();
  LeaveGateIfDone();
  return r;
}

Value ColumnValue(sqlite3_stmt* stmt, int i) {
  switch (sqlite3_column_type(stmt, i)) {
    case SQLITE_INTEGER: return Value(static_cast<int64_t>(sqlite3_column_int64(stmt, i)));
    case SQLITE_FLOAT: return Value(sqlite3_column_double(stmt, i));
    case SQLITE_TEXT: {
      auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt, i));
      return Value(std::string(p, sqlite3_column_bytes(stmt, i)));
    }
    case SQLITE_BLOB: {
      auto* p = static_cast<const char*>(sqlite3_column_blob(stmt, i));
      int n = sqlite3_column_bytes(stmt, i);
      return Value(Blob{std::string(p ? p : "", n)});
    }
    default: return Value();
  }
}

Result<Rows> Db::Query(std::string_view sql, std::span<const Value> params) {
  IDEM_RETURN_IF_ERROR(EnterGate(sql));
  Result<Rows> r = QueryIn(sql, params);
  LeaveGateIfDone();
  return r;
}

Result<Rows> Db::QueryIn(std::string_view sql, std::span<const Value> params) {
  IDEM_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, Prepare(sql));
  StmtUse use(stmt);
  IDEM_RETURN_IF_ERROR(Bind(stmt, params));
  Rows rows;
  int n = sqlite3_column_count(stmt);
  for (int i = 0; i < n; ++i) rows.columns.emplace_back(sqlite3_column_name(stmt, i));
  for (;;) {
    IDEM_ASSIGN_OR_RETURN(bool row, Step(stmt, sql.substr(0, 120)));
    if (!row) break;
    std::vector<Value> r;
    r.reserve(n);
    for (int i = 0; i < n; ++i) r.push_back(ColumnValue(stmt, i));
    rows.rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace idem::sqlite_driver
