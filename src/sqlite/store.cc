// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/sqlite/store.h"
#include "idem/store_backend.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "core/kill_point.h"
#include "idem/env.h"
#include "idem/url.h"

#include "sql/flights.h"
#include "sql/sql_store.h"
#include "sqlite/schema.h"
#include "sqlite_driver/batched_wal.h"
#include "sqlite_driver/db.h"

namespace idem::sqlite {
namespace {

using Options = Store::Options;
using sqlite_driver::Db;

class SqliteConnection final : public sql_internal::Connection {
 public:
  explicit SqliteConnection(std::unique_ptr<Db> db) : db_(std::move(db)) {}
  Result<int64_t> Exec(std::string_view sql, std::span<const Value> params) override { return db_->Exec(sql, params); }
  Result<Rows> Query(std::string_view sql, std::span<const Value> params) override { return db_->Query(sql, params); }
  // One statement goes through the statement cache (BEGIN, SAVEPOINT run per
  // message); several (migrations) through sqlite3_exec.
  Status Script(std::string_view sql) override {
    if (sql.find(';') != std::string_view::npos) return db_->Script(sql);
    return db_->Exec(sql, {}).status();
  }
  Status Commit() override {
    // With FULL, the commit's WAL frames go out in one write (batched_wal.h).
    sqlite_driver::BatchedWalWrites batched(db_->batched_wal());
    auto r = db_->Exec("COMMIT", {});
    // A crash here leaves the caller without the outcome: committed or not,
    // only the database knows (the Inbox's marker says which).
    IDEM_KILL_POINT("sqlite.commit_done");
    if (r.ok()) return Status::OK();
    // SQLite rolled back by itself. After an I/O error during COMMIT the WAL
    // may or may not hold the commit record: in doubt.
    if (!db_->in_transaction() && r.status().code() == Code::kIoError) return Status::InDoubt(r.status().message());
    return r.status();
  }
  bool InTransaction() const override { return db_->in_transaction(); }
  bool Healthy() const override { return true; }
  void* Native() override { return db_->raw(); }

 private:
  std::unique_ptr<Db> db_;
};

constexpr sql_internal::Dialect kDialect{
    .kind = "sqlite",
    // IMMEDIATE takes the write lock now, so two processes on one file are
    // serialised here (waiting up to the busy timeout) instead of failing
    // at COMMIT with a lock upgrade error.
    .begin = "BEGIN IMMEDIATE",
    .migration_lock = "",
    .create_migrations = sqlite_internal::kCreateMigrations,
    .migrations = sqlite_internal::kMigrations,
    .insert_marker = sqlite_internal::kInsertMarker,
    // No multi-row insert: SQLite has no round trips to save, and measured
    // per-row statements faster (doc/performance.md).
    .find_marker = sqlite_internal::kFindMarker,
    .purge_markers = "",  // SqliteStore::Purge walks the key instead
    .count_markers = sqlite_internal::kCountMarkers,
    .list_markers = sqlite_internal::kListMarkers,
    .claims = &sqlite_internal::kClaims,
    .outbox = &sqlite_internal::kOutbox,
};

// Wakes relays in this process after a commit that added outbox rows: one
// board per file (by its write lock id), shared by every store object on it.
struct OutboxBoard {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t rings = 0;

  static std::shared_ptr<OutboxBoard> For(const std::string& id) {
    static std::mutex boards_mu;
    static std::map<std::string, std::weak_ptr<OutboxBoard>> boards;
    std::lock_guard lock(boards_mu);
    auto& weak = boards[id];
    auto board = weak.lock();
    if (!board) {
      board = std::make_shared<OutboxBoard>();
      weak = board;
    }
    return board;
  }
  void Ring() {
    {
      std::lock_guard lock(mu);
      ++rings;
    }
    cv.notify_all();
  }
  uint64_t Seen() {
    std::lock_guard lock(mu);
    return rings;
  }
  // Until a ring after `seen`, or `ms` passed.
  void WaitPast(uint64_t seen, int64_t ms) {
    std::unique_lock lock(mu);
    cv.wait_for(lock, std::chrono::milliseconds(ms), [&] { return rings != seen; });
  }
};

// The file's one outbox lane: an exclusive flock on "<db>-idem-relay.lock",
// released by the kernel when the holder's process ends however it ends.
// flock belongs to the open file description, so two relays of one process
// exclude each other too.
class FlockLane final : public sql_internal::SqlStore::LaneLock {
 public:
  explicit FlockLane(int fd) : fd_(fd) {}
  ~FlockLane() override { ::close(fd_); }
  // The hint lives in the lock file's first 8 bytes (no sync: it survives
  // a process kill, and is only a hint), so a relay round makes one write
  // transaction on the store, not two.
  bool WriteHint(int64_t upto) override {
    return ::pwrite(fd_, &upto, sizeof upto, 0) == static_cast<ssize_t>(sizeof upto);
  }
  std::optional<int64_t> ReadHint() override {
    int64_t v = 0;
    if (::pread(fd_, &v, sizeof v, 0) != static_cast<ssize_t>(sizeof v)) return int64_t{0};
    return v;
  }

 private:
  int fd_;
};

// Copies the WAL back into the database file on a thread of its own
// (Options::checkpoint), so that commits do not wait for the scattered page
// writes and the database file's sync (with random ids a checkpoint writes
// back about one page per marker). Every commit that finds the WAL past the
// threshold wakes it; it runs passive checkpoints back to back while woken.
// A WAL starts over from its beginning only when a writer begins while every
// frame is copied back, which rarely happens under a steady stream of
// commits: at 8x the threshold the committing thread checkpoints itself (a
// short one: most frames are copied by then), so the WAL stays bounded
// whatever happens here. Measured in doc/performance.md: 1.8x the guarded
// rate in batches with synchronous=NORMAL, but half the rate with FULL,
// whose commits then wait behind the checkpoints' syncs (hence kAuto).
// Its connection is opened on first use; a checkpoint that fails (busy, an
// I/O error) is left to the next wake-up.
class Checkpointer {
 public:
  Checkpointer(sqlite_driver::OpenOptions o, int threshold_pages)
      : options_(std::move(o)), threshold_(threshold_pages) {}
  ~Checkpointer() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // In the committing thread, after each commit: true when that thread
  // should checkpoint now (only when this one has fallen far behind).
  bool AfterCommit(int pages) {
    if (pages < threshold_) return false;
    if (pages >= 8 * threshold_) return true;
    Wake();
    return false;
  }

 private:
  void Wake() {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (woken_ || stop_) return;
      woken_ = true;
      // Called from SQLite's WAL hook: no exception may leave. Without the
      // thread the commits checkpoint themselves at 8x the threshold.
      if (!thread_.joinable()) {
        try {
          thread_ = std::thread([this] {
            ::pthread_setname_np(::pthread_self(), "idem-checkpoint");  // in ps -L, top -H, gdb
            Run();
          });
        } catch (const std::system_error&) {
          woken_ = false;
          return;
        }
      }
    }
    cv_.notify_one();
  }

  void Run() {
    std::unique_ptr<Db> db;
    for (;;) {
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return woken_ || stop_; });
        if (stop_) return;
        woken_ = false;
      }
      if (db == nullptr) {
        auto opened = Db::Open(options_);
        if (!opened.ok()) continue;
        db = std::move(*opened);
      }
      IDEM_KILL_POINT("sqlite.checkpoint");
      sqlite3_wal_checkpoint_v2(db->raw(), "main", SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
    }
  }

  const sqlite_driver::OpenOptions options_;  // without after_commit: this connection never commits
  const int threshold_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool woken_ = false, stop_ = false;
  std::thread thread_;
};

sqlite_driver::OpenOptions OpenOptionsFor(const Options& o, bool create) {
  sqlite_driver::OpenOptions oo;
  oo.path = o.path;
  oo.create = create;
  oo.busy_timeout_ms = o.busy_timeout_ms;
  oo.cache_kib = o.cache_kib;
  oo.wal_autocheckpoint_pages = o.wal_autocheckpoint_pages;
  oo.page_size = o.page_size;
  oo.vfs = o.vfs;
  oo.batch_wal_writes = o.batch_wal_writes;
  oo.synchronous = o.synchronous == Synchronous::kFull     ? "FULL"
                   : o.synchronous == Synchronous::kNormal ? "NORMAL"
                                                           : "OFF";
  return oo;
}

// One writer per file: two store objects on one path share its write lock.
std::string WriteLockIdOf(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(path, ec);
  if (ec) p = std::filesystem::absolute(path, ec);
  return "sqlite:" + (ec ? path : p.string());
}

class SqliteStore final : public sql_internal::SqlStore {
 public:
  explicit SqliteStore(const Options& o)
      : SqlStore(kDialect, o.env, 16),
        options_(o),
        write_lock_id_(WriteLockIdOf(o.path)),
        board_(OutboxBoard::For(write_lock_id_)) {
    if (sqlite::Store::CheckpointsInBackground(o))
      checkpointer_ = std::make_unique<Checkpointer>(OpenOptionsFor(o, /*create=*/false), o.wal_autocheckpoint_pages);
  }
  // The pooled connections hold hooks into the checkpointer: close them first.
  ~SqliteStore() override { ClosePool(); }

  Result<std::unique_ptr<sql_internal::Connection>> Connect() override { return ConnectAs(nullptr); }
  // A relay records what it published without a sync (a lost record only
  // publishes again). Opened so (not switched by PRAGMA), so that the
  // batched-WAL shim, which needs each commit's sync, is left out.
  Result<std::unique_ptr<sql_internal::Connection>> ConnectRelay() override { return ConnectAs("NORMAL"); }
  Result<std::unique_ptr<sql_internal::Connection>> ConnectAs(const char* synchronous) {
    sqlite_driver::OpenOptions oo = OpenOptionsFor(options_, create_file_.load(std::memory_order_acquire));
    if (synchronous != nullptr) oo.synchronous = synchronous;
    if (checkpointer_ != nullptr)
      oo.after_commit = [c = checkpointer_.get()](int pages) { return c->AfterCommit(pages); };
    IDEM_ASSIGN_OR_RETURN(auto db, Db::Open(oo));
    create_file_.store(true, std::memory_order_release);  // once it exists
    return std::unique_ptr<sql_internal::Connection>(new SqliteConnection(std::move(db)));
  }
  void set_create_file(bool v) { create_file_.store(v, std::memory_order_release); }

  Result<std::unique_ptr<LaneLock>> LockLane(sql_internal::Connection&, int, std::string_view) override {
    const std::string path = options_.path + "-idem-relay.lock";
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return Status::IoError("cannot open the relay lock file " + path + ": " + std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      ::close(fd);
      if (e == EWOULDBLOCK) return std::unique_ptr<LaneLock>();
      return Status::IoError("cannot lock " + path + ": " + std::strerror(e));
    }
    return std::unique_ptr<LaneLock>(new FlockLane(fd));
  }
  // In this process: the board; other processes' commits: the file's
  // data_version, looked at every 20 ms.
  Status WaitForOutbox(sql_internal::Connection& c, std::string_view, int64_t timeout_ms,
                       const std::function<Result<bool>()>& pending) override {
    const uint64_t seen = board_->Seen();
    IDEM_ASSIGN_OR_RETURN(Rows v0, c.Query("PRAGMA data_version", {}));
    IDEM_ASSIGN_OR_RETURN(bool any, pending());
    if (any) return Status::OK();
    const int64_t version = v0.rows.empty() ? 0 : v0.rows[0][0].AsInt();
    for (int64_t waited = 0; waited < timeout_ms; waited += 20) {
      board_->WaitPast(seen, std::min<int64_t>(20, timeout_ms - waited));
      if (board_->Seen() != seen) return Status::OK();
      IDEM_ASSIGN_OR_RETURN(Rows v, c.Query("PRAGMA data_version", {}));
      if (!v.rows.empty() && v.rows[0][0].AsInt() != version) return Status::OK();
    }
    return Status::OK();
  }
  void OutboxCommitted() override { board_->Ring(); }
  std::string WriteLockId() const override { return write_lock_id_; }

  // Claim writes outside a transaction (a new key's insert, a take-over, a
  // completion), each committed on its own otherwise: see Fly.
  Result<Rows> QueryAlone(std::string_view sql, std::vector<Value> params) override {
    return Fly(sql, params, /*fenced=*/false);
  }
  Result<Rows> FencedAlone(std::string_view sql, std::vector<Value> params) override {
    return Fly(sql, params, /*fenced=*/true);
  }

  // Markers with a producer time go to idem_markers_by_producer_time (keyed by that
  // time first); the others to idem_markers. A new by-time marker is also
  // checked against idem_markers, where the message's marker lives if it was
  // handled before key_by_producer_time was switched on.
  Result<std::vector<std::optional<Fingerprint>>> InsertMarkers(sql_internal::Connection& c,
                                                                std::span<const Marker> markers) override {
    std::vector<std::optional<Fingerprint>> out;
    out.reserve(markers.size());
    for (const Marker& m : markers) {
      if (!m.produced_at_ms.has_value()) {
        IDEM_ASSIGN_OR_RETURN(auto one, SqlStore::InsertMarkers(c, std::span<const Marker>(&m, 1)));
        out.push_back(one.front());
        continue;
      }
      Value key[] = {*m.produced_at_ms, m.consumer, sql_internal::IdBlob(m.id)};
      Value ins[] = {*m.produced_at_ms, m.consumer, sql_internal::IdBlob(m.id),
                     sql_internal::FingerprintBlob(m.fingerprint), m.processed_at_ms};
      IDEM_ASSIGN_OR_RETURN(int64_t changed, c.Exec(sqlite_internal::kInsertByTime, ins));
      if (changed == 0) {
        IDEM_ASSIGN_OR_RETURN(Rows rows, c.Query(sqlite_internal::kFindByTime, key));
        if (rows.rows.empty()) return Status::Internal("marker insert was ignored but no marker exists");
        out.emplace_back(sql_internal::ToFingerprint(rows.rows[0][0]));
        continue;
      }
      Value plain[] = {m.consumer, sql_internal::IdBlob(m.id)};
      IDEM_ASSIGN_OR_RETURN(Rows old, c.Query(sqlite_internal::kFindMarker, plain));
      if (!old.rows.empty()) {
        IDEM_RETURN_IF_ERROR(c.Exec(sqlite_internal::kDeleteByTime, key).status());
        out.emplace_back(sql_internal::ToFingerprint(old.rows[0][0]));
        continue;
      }
      out.emplace_back();
    }
    return out;
  }

  Result<bool> HasMarker(sql_internal::Connection& c, const std::string& consumer, std::string_view id,
                         std::optional<int64_t> produced_at_ms) override {
    if (produced_at_ms.has_value()) {
      Value key[] = {*produced_at_ms, consumer, sql_internal::IdBlob(id)};
      IDEM_ASSIGN_OR_RETURN(Rows rows, c.Query(sqlite_internal::kFindByTime, key));
      if (!rows.rows.empty()) return true;
    }
    return SqlStore::HasMarker(c, consumer, id, std::nullopt);
  }

  Result<std::optional<Marker>> FindMarker(std::string_view consumer, std::string_view id,
                                           std::optional<int64_t> produced_at_ms) override {
    if (produced_at_ms.has_value()) {
      IDEM_ASSIGN_OR_RETURN(sql_internal::Lease conn, Take());
      Value key[] = {*produced_at_ms, std::string(consumer), sql_internal::IdBlob(id)};
      IDEM_ASSIGN_OR_RETURN(Rows rows, conn->Query(sqlite_internal::kFindByTime, key));
      if (!rows.rows.empty())
        return std::optional<Marker>(Marker{std::string(consumer), std::string(id),
                                            sql_internal::ToFingerprint(rows.rows[0][0]), rows.rows[0][1].AsInt(),
                                            produced_at_ms});
    }
    return SqlStore::FindMarker(consumer, id);
  }

  Result<int64_t> Purge(std::string_view consumer, int64_t before_ms, int batch_size) override {
    if (batch_size < 1) return Status::InvalidArgument("purge batch size must be at least 1");
    int64_t total = 0;
    std::string at_consumer(consumer);
    std::string at_id;  // the window starts after (at_consumer, at_id)
    for (;;) {
      IDEM_ASSIGN_OR_RETURN(auto tx, Begin());
      Value w[] = {at_consumer, Blob{at_id}, int64_t{batch_size}};
      IDEM_ASSIGN_OR_RETURN(
          Rows rows,
          tx->Query(consumer.empty() ? sqlite_internal::kPurgeWindowAll : sqlite_internal::kPurgeWindowOne, w));
      for (auto& r : rows.rows) {
        if (r[2].AsInt() >= before_ms) continue;
        Value key[] = {r[0].AsText(), Blob{r[1].AsText()}};
        IDEM_RETURN_IF_ERROR(tx->Exec(sqlite_internal::kDeleteMarker, key).status());
        ++total;
      }
      IDEM_RETURN_IF_ERROR(tx->Commit());
      if (rows.rows.size() < static_cast<size_t>(batch_size)) break;
      IDEM_KILL_POINT("store.purge_batch");
      // Let waiting writers (consumers) in between two windows.
      env()->SleepMs(2);
      at_consumer = rows.rows.back()[0].AsText();
      at_id = rows.rows.back()[1].AsText();
    }
    // Markers keyed by producer time: oldest first, by that time.
    for (;;) {
      IDEM_ASSIGN_OR_RETURN(auto tx, Begin());
      Value p[] = {before_ms, std::string(consumer), int64_t{batch_size}};
      IDEM_ASSIGN_OR_RETURN(int64_t n, tx->Exec(sqlite_internal::kPurgeByTime, p));
      IDEM_RETURN_IF_ERROR(tx->Commit());
      total += n;
      if (n < batch_size) return total;
      IDEM_KILL_POINT("store.purge_batch");
      env()->SleepMs(2);
    }
  }

 private:
  static constexpr size_t kMaxFlight = 64;

  // Claim writes of concurrent callers in one write transaction: the file
  // has one writer, so they would otherwise commit (and fsync) one after
  // the other. A caller that finds no flight out leads one at once, with
  // whatever is queued; the callers arriving meanwhile queue, and the first
  // of them leads the next flight with all of them (up to kMaxFlight).
  // A flight of one runs as before, on its own. A flight of more: BEGIN
  // IMMEDIATE, each statement in its own savepoint (its failure rolls back
  // only itself and is its own caller's answer; each decides alone, so
  // answers, fences and leases are as each alone would get), one COMMIT.
  // Callers learn their answers after the COMMIT; if it failed, every
  // statement that had succeeded is answered with an error (kUnavailable,
  // or kInDoubt when the commit's outcome is unknown), never success.
  Result<Rows> Fly(std::string_view sql, std::span<const Value> params, bool fenced) {
    sql_internal::FlightJob job{sql, params, fenced};
    flights_.Join(job, /*max_out=*/1, [this](std::span<sql_internal::FlightJob* const> flight) {
      std::vector<Result<Rows>> answers = RunFlight(flight);
      return std::vector<std::optional<Result<Rows>>>(std::make_move_iterator(answers.begin()),
                                                      std::make_move_iterator(answers.end()));
    });
    return std::move(*job.out);
  }

  std::vector<Result<Rows>> RunFlight(std::span<sql_internal::FlightJob* const> flight) {
    if (flight.size() == 1) {
      sql_internal::FlightJob& j = *flight[0];
      std::vector<Value> p(j.params.begin(), j.params.end());
      return {j.fenced ? SqlStore::FencedAlone(j.sql, std::move(p)) : SqlStore::QueryAlone(j.sql, std::move(p))};
    }
    auto lease = Take(/*for_write=*/true);
    if (!lease.ok()) return std::vector<Result<Rows>>(flight.size(), lease.status());
    sql_internal::Connection& c = **lease;
    if (Status begun = c.Script(kDialect.begin); !begun.ok()) return std::vector<Result<Rows>>(flight.size(), begun);
    std::vector<Result<Rows>> out;
    out.reserve(flight.size());
    Status broken;  // the transaction is gone or a savepoint failed: nothing of the flight commits
    for (sql_internal::FlightJob* j : flight) {
      if (!broken.ok()) {
        out.emplace_back(broken);
        continue;
      }
      if (Status s = c.Script("SAVEPOINT idem_claim"); !s.ok()) {
        broken = s;
        out.emplace_back(s);
        continue;
      }
      Result<Rows> rows = j->fenced ? FencedQuery(c, j->sql, j->params) : c.Query(j->sql, j->params);
      const bool keep = rows.ok() && !(j->fenced && rows->rows.empty());
      Status ended = !c.InTransaction() ? Status::Unavailable("SQLite rolled the transaction back")
                     : keep             ? c.Script("RELEASE idem_claim")
                                        : c.Script("ROLLBACK TO idem_claim");
      if (ended.ok() && !keep) ended = c.Script("RELEASE idem_claim");
      if (!ended.ok()) broken = ended;
      out.push_back(std::move(rows));
    }
    Status committed = broken.ok() ? c.Commit() : broken;
    if (committed.ok()) {
      Committed(&c);
      return out;
    }
    if (c.InTransaction()) (void)c.Script("ROLLBACK");
    const Status failed =
        !broken.ok() ? Status::Unavailable("the claims' shared transaction was rolled back (" + broken.message() +
                                           "): not done; retry")
        : committed.code() == Code::kInDoubt
            ? Status::InDoubt("the claims' shared COMMIT failed; it may or may not have happened: " +
                              committed.message())
            : Status::Unavailable("the claims' shared COMMIT failed; it may not have happened: " + committed.message());
    for (Result<Rows>& r : out)
      if (r.ok()) r = failed;
    return out;
  }

  Options options_;
  const std::string write_lock_id_;
  std::shared_ptr<OutboxBoard> board_;
  // Read and written by concurrent Connect calls of the pool: atomic.
  std::atomic<bool> create_file_{true};
  std::unique_ptr<Checkpointer> checkpointer_;
  sql_internal::FlightQueue flights_{kMaxFlight, "sqlite.claim_queued"};  // one out at a time: one writer
};

}  // namespace

bool Store::CheckpointsInBackground(const Options& o) {
  return o.wal_autocheckpoint_pages > 0 && (o.checkpoint == Checkpoint::kBackground ||
                                            (o.checkpoint == Checkpoint::kAuto && o.synchronous != Synchronous::kFull));
}

Result<std::unique_ptr<idem::Store>> Store::Open(const Options& options) {
  if (options.path.empty()) return Status::InvalidArgument("SQLite store: path is empty");
  // Each pooled connection would open a database of its own.
  if (options.path == ":memory:" || options.path.rfind("file::memory:", 0) == 0)
    return Status::InvalidArgument("SQLite store: '" + options.path +
                                   "' is not a file path (an in-memory database is one per connection; use a file, "
                                   "in a temporary directory for tests)");
  if (options.page_size < 512 || options.page_size > 65536 || (options.page_size & (options.page_size - 1)) != 0)
    return Status::InvalidArgument("SQLite store: page_size must be a power of two from 512 to 65536, not " +
                                   std::to_string(options.page_size));
  auto in_range = [](std::string_view name, int64_t v, int64_t max) -> Status {
    if (v >= 0 && v <= max) return Status::OK();
    return Status::InvalidArgument("SQLite store: " + std::string(name) + " must be from 0 to " + std::to_string(max) +
                                   ", not " + std::to_string(v));
  };
  IDEM_RETURN_IF_ERROR(in_range("busy_timeout_ms", options.busy_timeout_ms, 3'600'000));
  IDEM_RETURN_IF_ERROR(in_range("cache_kib", options.cache_kib, 64LL << 20));
  IDEM_RETURN_IF_ERROR(in_range("wal_autocheckpoint_pages", options.wal_autocheckpoint_pages, 1LL << 30));
  auto store = std::make_unique<SqliteStore>(options);
  store->set_create_file(options.create_if_missing);
  IDEM_RETURN_IF_ERROR(store->Init(options.create_if_missing, options.path));
  return std::unique_ptr<idem::Store>(std::move(store));
}

namespace {
// The value of an enumerated key, or kInvalidArgument listing the choices.
template <typename E>
Status Choose(const ParsedUrl& u, std::string_view key, std::initializer_list<std::pair<std::string_view, E>> choices,
              E& out) {
  if (!u.Has(key)) return Status::OK();
  std::string v = u.Get(key);
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string names;
  size_t i = 0;
  for (const auto& [name, e] : choices) {
    if (v == name) {
      out = e;
      return Status::OK();
    }
    names += i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ";
    names += name;
    ++i;
  }
  return Status::InvalidArgument("SQLite URL option " + std::string(key) + " must be " + names + ", not '" +
                                 u.Get(key) + "'");
}
}  // namespace

Result<Options> Store::ParseUrl(std::string_view url) {
  // A bare path is a file, unless it starts like another URL ("scheme:"):
  // a mistyped URL would otherwise become a file of that name.
  const std::string scheme = UrlScheme(url);
  if (!scheme.empty() && scheme != "sqlite")
    return Status::InvalidArgument("not a SQLite URL: '" + RedactUrl(url) + "' (expected sqlite:PATH)");
  const std::string full = scheme.empty() ? "sqlite:" + std::string(url) : std::string(url);
  IDEM_ASSIGN_OR_RETURN(ParsedUrl u, idem::ParseUrl(full, "SQLite URL", UrlForm::kFile));
  if (u.path.empty()) return Status::InvalidArgument("SQLite URL has no path: '" + std::string(url) + "'");
  IDEM_RETURN_IF_ERROR(
      u.CheckKeys({"synchronous", "busy_timeout_ms", "cache_kib", "wal_autocheckpoint_pages", "wal_autocheckpoint",
                   "checkpoint", "page_size", "create_if_missing", "vfs", "batch_wal_writes", "batch_wal"}));
  if (u.Has("wal_autocheckpoint_pages") && u.Has("wal_autocheckpoint"))
    return Status::InvalidArgument("wal_autocheckpoint_pages is given twice (also as wal_autocheckpoint) in '" +
                                   RedactUrl(url) + "'");
  if (u.Has("batch_wal_writes") && u.Has("batch_wal"))
    return Status::InvalidArgument("batch_wal_writes is given twice (also as batch_wal) in '" + RedactUrl(url) + "'");
  Options o;
  o.path = u.path;
  IDEM_RETURN_IF_ERROR(Choose<Synchronous>(
      u, "synchronous", {{"full", Synchronous::kFull}, {"normal", Synchronous::kNormal}, {"off", Synchronous::kOff}},
      o.synchronous));
  IDEM_RETURN_IF_ERROR(Choose<Checkpoint>(
      u, "checkpoint",
      {{"auto", Checkpoint::kAuto}, {"background", Checkpoint::kBackground}, {"inline", Checkpoint::kInline}},
      o.checkpoint));
  // Whole numbers in a range SQLite takes (page_size is checked by Open).
  IDEM_ASSIGN_OR_RETURN(int64_t busy, u.GetInt("busy_timeout_ms", o.busy_timeout_ms, 0, 3'600'000));
  IDEM_ASSIGN_OR_RETURN(int64_t cache, u.GetInt("cache_kib", o.cache_kib, 0, 64LL << 20));
  IDEM_ASSIGN_OR_RETURN(int64_t page, u.GetInt("page_size", o.page_size, 0, 65536));
  const char* wal_key = u.Has("wal_autocheckpoint") ? "wal_autocheckpoint" : "wal_autocheckpoint_pages";
  IDEM_ASSIGN_OR_RETURN(int64_t wal, u.GetInt(wal_key, o.wal_autocheckpoint_pages, 0, 1LL << 30));
  o.busy_timeout_ms = static_cast<int>(busy);
  o.cache_kib = static_cast<int>(cache);
  o.page_size = static_cast<int>(page);
  o.wal_autocheckpoint_pages = static_cast<int>(wal);
  IDEM_ASSIGN_OR_RETURN(o.create_if_missing, u.GetBool("create_if_missing", o.create_if_missing));
  if (u.Has("batch_wal")) {
    IDEM_RETURN_IF_ERROR(Choose<bool>(u, "batch_wal", {{"on", true}, {"off", false}}, o.batch_wal_writes));
  } else {
    IDEM_ASSIGN_OR_RETURN(o.batch_wal_writes, u.GetBool("batch_wal_writes", o.batch_wal_writes));
  }
  if (u.Has("vfs")) {
    // Whether it exists is known only once it may have been registered:
    // Open says.
    if (u.Get("vfs").empty()) return Status::InvalidArgument("SQLite URL option vfs is empty in " + RedactUrl(url));
    o.vfs = u.Get("vfs");
  }
  return o;
}

}  // namespace idem::sqlite
