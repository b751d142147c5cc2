// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal (idem_sqlite_driver): RAII wrappers over the SQLite C API, the one
// driver under the SQLite store, the embedded queue and the test kit's
// FakeDownstream. Never included from a public header, never installed.
#ifndef IDEM_SRC_SQLITE_DRIVER_DB_H_
#define IDEM_SRC_SQLITE_DRIVER_DB_H_

#include <sqlite3.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include "idem/result.h"
#include "idem/status.h"
#include "idem/store.h"

namespace idem::sqlite_driver {

// The one place where SQLite result codes become idem codes. `what` says what
// was being done ("open /x/y.db", "COMMIT"); `db` (may be null) supplies
// SQLite's own message.
Status Translate(int rc, sqlite3* db, std::string_view what);
// The code alone, for table-driven tests.
Code CodeFor(int rc);

// Tells SQLite, once per process and before it initialises, what idem wants
// of it (no allocation statistics). Harmless when it is too late.
void ConfigureSqliteOnce();

// Rewrites $1, $2, ... (PostgreSQL style) into ?1, ?2, ... outside quoted
// strings and identifiers, so that the same SQL runs on both stores.
std::string RewriteParams(std::string_view sql);

struct StmtDeleter {
  void operator()(sqlite3_stmt* s) const noexcept { sqlite3_finalize(s); }
};
using StmtPtr = std::unique_ptr<sqlite3_stmt, StmtDeleter>;

// Resets a statement when it goes out of scope, so a cached statement never
// holds a read lock or stale bindings.
class StmtUse {
 public:
  explicit StmtUse(sqlite3_stmt* s) : s_(s) {}
  ~StmtUse() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
  StmtUse(const StmtUse&) = delete;
  StmtUse& operator=(const StmtUse&) = delete;
  sqlite3_stmt* get() const { return s_; }

 private:
  sqlite3_stmt* s_;
};

struct OpenOptions {
  std::string path;
  bool create = true;
  int busy_timeout_ms = 10'000;
  // PRAGMA synchronous value: "OFF", "NORMAL", "FULL".
  std::string synchronous = "FULL";
  int cache_kib = 16 * 1024;
  int wal_autocheckpoint_pages = 10'000;
  // When set, SQLite's autocheckpoint is off and this is called in the
  // committing thread after each commit with the WAL's size in pages; when
  // it answers true, that thread runs a (passive) checkpoint there and then.
  std::function<bool(int pages)> after_commit;
  int page_size = 4096;  // new files only
  // A SQLite VFS to open the file through, registered by whoever provides it
  // (sqlite3_vfs_register); empty: the default.
  std::string vfs;
  // With synchronous FULL or EXTRA: open through the batched-WAL shim over
  // `vfs` (batched_wal.h); commits in a BatchedWalWrites scope write their
  // frames in one write.
  bool batch_wal_writes = false;
};

// The writers of one file in this process, served in the order they came:
// every connection opened by Db::Open on a path takes its gate before
// BEGIN IMMEDIATE (or EXCLUSIVE) and leaves it when the transaction ends.
// SQLite's own lock, which other processes still meet, hands itself to
// whoever polls first, so a writer that commits back to back (a consumer
// acking one by one, a producer behind its rate) kept one that had gone to
// sleep waiting for hundreds of milliseconds.
class WriteGate {
 public:
  // The gate of `file` (a canonical path) in this process.
  static std::shared_ptr<WriteGate> For(const std::string& file);
  // Waits up to timeout_ms for this caller's turn; false when it did not come.
  bool Acquire(int timeout_ms);
  void Release();
  // How many callers wait in Acquire now (tests).
  size_t Waiting();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_ = 0;             // the next ticket
  uint64_t serving_ = 0;          // the ticket that holds the gate (or comes next)
  std::set<uint64_t> abandoned_;  // tickets whose waiters timed out
};

// One connection with a cache of prepared statements. Used by one thread at
// a time.
class Db {
 public:
  // Checks that the directory exists, opens, sets WAL and the pragmas, and
  // reads the file's header so a non-database file fails here, clearly.
  static Result<std::unique_ptr<Db>> Open(const OpenOptions& options);
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  sqlite3* raw() const { return db_; }
  // Opened through the batched-WAL shim: wrap commits in BatchedWalWrites.
  bool batched_wal() const { return batched_wal_; }
  const std::string& path() const { return path_; }

  // Runs one or more statements without parameters or results.
  Status Script(std::string_view sql);
  // A cached prepared statement for `sql` ($N or ?N parameters).
  Result<sqlite3_stmt*> Prepare(std::string_view sql);
  // Binds params to ?1..?N.
  Status Bind(sqlite3_stmt* stmt, std::span<const Value> params);
  // Runs to completion; returns sqlite3_changes().
  Result<int64_t> Exec(std::string_view sql, std::span<const Value> params);
  Result<Rows> Query(std::string_view sql, std::span<const Value> params);
  // Steps once; returns true when a row is ready, false when done.
  Result<bool> Step(sqlite3_stmt* stmt, std::string_view what);

  bool in_transaction() const { return sqlite3_get_autocommit(db_) == 0; }

 private:
  Db(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  // Before `sql`: this process's turn to write, when `sql` begins a write
  // transaction. After any statement: the gate left once no transaction is
  // open (COMMIT, ROLLBACK, or one SQLite ended by itself).
  Status EnterGate(std::string_view sql);
  Result<Rows> QueryIn(std::string_view sql, std::span<const Value> params);
  void LeaveGateIfDone() {
    if (gate_held_ && sqlite3_get_autocommit(db_) != 0) {
      gate_held_ = false;
      gate_->Release();
    }
  }
  std::shared_ptr<WriteGate> gate_;
  bool gate_held_ = false;
  sqlite3* db_;
  std::string path_;
  int busy_timeout_ms_ = 0;
  bool batched_wal_ = false;
  std::function<bool(int)> after_commit_;
  // Looked up by the caller's text as it is (no copy per statement).
  struct TextHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, StmtPtr, TextHash, std::equal_to<>> cache_;
};

// Reads column i of the current row as a Value.
Value ColumnValue(sqlite3_stmt* stmt, int i);

}  // namespace idem::sqlite_driver

#endif  // IDEM_SRC_SQLITE_DRIVER_DB_H_
