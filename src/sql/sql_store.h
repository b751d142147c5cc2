// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: the part of a store that is the same on every SQL database: the
// connection pool, transactions, marker statements, failure
// counts, dead letters, purge, inspection, migrations. A backend supplies a
// Connection, a Dialect (its SQL text and migrations) and, where it can do
// better than one statement per marker, InsertMarkers.
#ifndef IDEM_SRC_CORE_SQL_STORE_H_
#define IDEM_SRC_CORE_SQL_STORE_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "idem/claims.h"
#include "idem/env.h"
#include "idem/store.h"
#include "idem/store_backend.h"

namespace idem::sql_internal {

// One database connection, used by one thread at a time.
class Connection {
 public:
  virtual ~Connection() = default;
  virtual Result<int64_t> Exec(std::string_view sql, std::span<const Value> params) = 0;
  virtual Result<Rows> Query(std::string_view sql, std::span<const Value> params) = 0;
  // One statement once per parameter list, the results in order; a backend
  // with round trips sends them all in one. Default: Query in turn.
  virtual Result<std::vector<Rows>> QueryMany(std::string_view sql, std::span<const std::vector<Value>> each);
  // SQL without parameters (BEGIN, DDL).
  virtual Status Script(std::string_view sql) = 0;
  // COMMIT. Code::kInDoubt when the outcome is unknown (connection lost
  // while committing).
  virtual Status Commit() = 0;
  virtual bool InTransaction() const = 0;
  // Holds back `begin` and sends it with the next statement, in one round
  // trip, if the connection can (true); otherwise does nothing (false).
  virtual bool DeferBegin(std::string_view begin) {
    (void)begin;
    return false;
  }
  // Inside a transaction: holds the statement back and sends it in front of
  // the next one (or of COMMIT), in one round trip, if the connection can
  // (true: its failure is that next call's answer); otherwise does nothing
  // (false).
  virtual bool Defer(std::string_view sql, std::span<const Value> params) {
    (void)sql;
    (void)params;
    return false;
  }
  // Sends the statements Defer held back, now.
  virtual Status SendDeferred() { return Status::OK(); }
  // False once the connection is known to be broken (never reuse it).
  virtual bool Healthy() const = 0;
  virtual void* Native() = 0;
};

struct Migration {
  int version;
  const char* description;
  const char* sql;  // statements separated by ';'
};

// Failure counts and dead letters: the same SQL on every backend (they are
// not on the hot path and have no layout to tune).
inline constexpr const char* kBumpFailure =
    "INSERT INTO idem_failures(consumer, id, attempts, last_error, updated_at_ms) VALUES ($1, $2, 1, $3, $4) "
    "ON CONFLICT (consumer, id) DO UPDATE SET attempts = idem_failures.attempts + 1,"
    " last_error = excluded.last_error, updated_at_ms = excluded.updated_at_ms"
    " RETURNING attempts, in_progress_since_ms, parked_at_ms";
// In progress: no failure counted; the first time is kept.
inline constexpr const char* kNoteInProgress =
    "INSERT INTO idem_failures(consumer, id, attempts, last_error, updated_at_ms, in_progress_since_ms)"
    " VALUES ($1, $2, 0, $3, $4, $4) ON CONFLICT (consumer, id) DO UPDATE SET last_error = excluded.last_error,"
    " updated_at_ms = excluded.updated_at_ms,"
    " in_progress_since_ms = COALESCE(idem_failures.in_progress_since_ms, excluded.in_progress_since_ms)"
    " RETURNING attempts, in_progress_since_ms, parked_at_ms";
inline constexpr const char* kFindFailure =
    "SELECT attempts, in_progress_since_ms, parked_at_ms FROM idem_failures WHERE consumer = $1 AND id = $2";
inline constexpr const char* kMarkParked = "UPDATE idem_failures SET parked_at_ms = $3 WHERE consumer = $1 AND id = $2";
inline constexpr const char* kClearFailure = "DELETE FROM idem_failures WHERE consumer = $1 AND id = $2";
// A parked message that applied is no longer parked.
inline constexpr const char* kClearParked =
    "DELETE FROM idem_dead_letters WHERE consumer = $1 AND id = $2 AND reason = 'parked'";
inline constexpr const char* kPutDeadLetter =
    "INSERT INTO idem_dead_letters(consumer, id, reason, error, attempts, payload, at_ms)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (consumer, id) DO UPDATE SET reason = excluded.reason,"
    " error = excluded.error, attempts = excluded.attempts, payload = excluded.payload, at_ms = excluded.at_ms";
inline constexpr const char* kListDeadLetters =
    "SELECT consumer, id, reason, error, attempts, payload, at_ms FROM idem_dead_letters"
    " WHERE ($1 = '' OR consumer = $1) ORDER BY at_ms DESC LIMIT $2";

// Reading claim records: the same SQL on every backend.
inline constexpr const char* kFindClaim =
    "SELECT scope, key, state, fingerprint, fence, lease_until_ms, expires_at_ms, result, result_is_error,"
    " updated_at_ms FROM idem_claims WHERE scope = $1 AND key = $2";
inline constexpr const char* kListClaims =
    "SELECT scope, key, state, fingerprint, fence, lease_until_ms, expires_at_ms, result, result_is_error,"
    " updated_at_ms FROM idem_claims WHERE ($1 = '' OR scope = $1) ORDER BY updated_at_ms DESC LIMIT $2";

inline constexpr const char* kCountClaims = "SELECT count(*) FROM idem_claims WHERE scope = $1";

// A backend's SQL for claims (two-phase mode). `now` parameters are the
// store's clock, or NULL where the SQL reads the server's clock itself.
struct ClaimsSql {
  const char* select;      // ($1 scope, $2 key, $3 now) -> state, fingerprint, fence, lease_until_ms,
                           //   expires_at_ms, result, result_is_error, updated_at_ms, now
  const char* insert;      // ($1 scope, $2 key, $3 fp, $4 lease_ms, $5 now) -> fence, lease_until_ms
  const char* take_over;   // (.., $6 seen fence, $7 seen state) -> fence, lease_until_ms
  const char* bump_fence;  // when set: run in the same transaction before insert/take_over
  const char* complete;    // ($1, $2, $3 fence, $4 result, $5 is_error, $6 retention_ms, $7 now) -> a row if done
  const char* release;     // ($1, $2, $3 fence) -> a row if done
  const char* extend;      // ($1, $2, $3 fence, $4 lease_ms, $5 now) -> lease_until_ms
  const char* find;        // ($1, $2) -> scope, key, state, fingerprint, fence, lease_until_ms, expires_at_ms,
                           //   result, result_is_error, updated_at_ms
  const char* list;        // ($1 scope or '', $2 limit) -> as find
  const char* purge;       // ($1 scope or '', $2 abandoned_after_ms, $3 limit, $4 now)
  const char* now;         // ($1 now) -> now
  // With bump_fence, for ClaimMany: take $1 fences at once (-> the counter
  // after), then insert with a given one (insert's parameters, $6 fence).
  const char* reserve_fences = nullptr;
  const char* insert_fenced = nullptr;
  // When set, a claim outside a transaction may try this first (while most
  // keys claimed are new): insert's parameters -> one row, select's columns
  // and then whether it inserted (the new fence and lease in columns 2 and
  // 3), or the existing row (not inserted), or none (look again).
  const char* insert_or_read = nullptr;
};

// A backend's SQL for its markers (the layout it tunes). Parameters are $1..$n.
struct Dialect {
  std::string_view kind;       // "sqlite", "postgres"
  const char* begin;           // starts a write transaction
  const char* migration_lock;  // first statement of the migration transaction ("" for none)
  const char* create_migrations;
  std::span<const Migration> migrations;
  const char* insert_marker;  // ($1 consumer, $2 id, $3 fingerprint, $4 at) ON CONFLICT DO NOTHING
  // Batches, when set: head + "($1,$2,$3,$4),($5,...)" + tail (RETURNING id)
  // inserts many markers in one statement; find head + "$2,$3,...)" reads
  // the ones that existed ($1 the consumer).
  const char* insert_markers_head = nullptr;
  const char* insert_markers_tail = nullptr;
  const char* find_markers_head = nullptr;
  const char* find_marker;    // ($1 consumer, $2 id) -> fingerprint, processed_at_ms
  const char* purge_markers;  // ($1 before, $2 consumer or '', $3 limit)
  const char* count_markers;  // ($1 consumer or '')
  const char* list_markers;   // ($1 consumer or '', $2 limit)
  const ClaimsSql* claims = nullptr;
  const struct OutboxSql* outbox = nullptr;
  // ($1 the bound as text, "250ms") bounds the transaction's lock waits;
  // nullptr: the backend's waits are bounded otherwise.
  const char* bound_lock_waits = nullptr;
};

// A backend's SQL for the outbox (sql_outbox.cc). Lists of seqs and lanes
// are passed as one text parameter: "{1,2}" with list_open '{' (PostgreSQL
// arrays) or "[1,2]" with '[' (SQLite's json_each).
struct OutboxSql {
  int lanes;              // lanes the rows are split into (one relay holds each)
  char list_open;         // '{' or '['
  const char* lock_keys;  // ($1 list of 32-bit key hashes) locks them until commit; nullptr: one writer anyway
  // The multi-row insert: head + "($1,...,$8),($9,...)" + tail, columns
  // (lane, id, destination, ordering_key, payload, headers, producer_time_ms, added_at_ms).
  const char* insert_head;
  const char* insert_tail;
  // When set, one row per execution of this instead ($1..$8, the columns
  // above, $9 the seq): where a statement costs no round trip, a prepared
  // one-row insert is cheaper than binding a long multi-row one (SQLite).
  // The seqs follow read_seq (-> the counter), which advance_seq then moves
  // on ($1 how many).
  const char* insert_one = nullptr;
  const char* read_seq = nullptr;
  const char* advance_seq = nullptr;
  const char* fetch;        // ($1 lanes, $2 limit) -> seq, id, destination, ordering_key, payload, headers,
                            //   producer_time_ms, added_at_ms, attempts, lane
  const char* any_pending;  // ($1 lanes) -> a row if there is one
  const char* move_sent;    // ($1 seqs, $2 now) copies to idem_outbox_sent
  const char* delete_rows;  // ($1 seqs)
  // When set, ($1 seqs, $2 now) moves the rows to idem_outbox_sent in one
  // statement (one round trip, no explicit transaction): a round that only
  // sent settles with it (PostgreSQL).
  const char* move_sent_one = nullptr;
  // With move_sent_one: ($1 seqs) deletes the rows in one statement (sent,
  // not kept). nullptr: delete_rows.
  const char* delete_sent_one = nullptr;
  const char* put_dead;       // ($1 seq, $2 reason, $3 error, $4 at) copies to idem_outbox_dead
  const char* heartbeat;      // ($1 name, $2 lanes held, $3 now)
  const char* live_relays;    // ($1 now, $2 live_ms) -> count
  const char* handed_read;    // ($1 lanes) -> lane, upto
  const char* handed_write;   // ($1 lanes, $2 their uptos: lists of one length)
  const char* stats;          // ($1 now, $2 live_ms) -> backlog, oldest added_at_ms, dead, sent, relays
  const char* session_setup;  // run once on a relay's connection
  // Sent first in each settle's transaction (settings for that transaction
  // only); nullptr: none, and a round that only sent settles in one
  // statement.
  const char* settle_prologue = nullptr;
};

Blob IdBlob(std::string_view id);
Blob FingerprintBlob(const Fingerprint& fp);
Fingerprint ToFingerprint(const Value& v);

class SqlStore;
class SqlOutbox;

// A pooled connection; goes back to the pool when destroyed (unless broken
// or left inside a transaction).
class Lease {
 public:
  Lease(SqlStore* store, std::unique_ptr<Connection> conn) : store_(store), conn_(std::move(conn)) {}
  Lease(Lease&&) = default;
  Lease& operator=(Lease&&) = default;
  ~Lease();
  Connection* operator->() const { return conn_.get(); }
  const Connection* get() const { return conn_.get(); }
  Connection& operator*() const { return *conn_; }

 private:
  SqlStore* store_;
  std::unique_ptr<Connection> conn_;
};

// kInvalidArgument for a negative list limit (SQL would take it as "all").
Status CheckListLimit(int limit);

// Whether `sql` begins, commits or rolls back a transaction (not a
// savepoint): refused inside the transaction idem runs a handler's work in.
bool EndsOrStartsATransaction(std::string_view sql);

// `insert` (an INSERT whose VALUES has one tuple of `width` parameters) with
// `rows` tuples, each numbered on: "... VALUES ($1, $2), ($3, $4) ON ...".
// kInvalidArgument for an insert without a VALUES tuple, with RETURNING, or
// whose tuple's parameters are not $1..$width.
Result<std::string> MultiRowInsert(std::string_view insert, size_t width, size_t rows);

class SqlTransaction : public StoreTransaction {
 public:
  SqlTransaction(SqlStore& store, Lease conn) : store_(store), conn_(std::move(conn)) {}
  ~SqlTransaction() override { Rollback(); }

  Result<int64_t> Exec(std::string_view sql, std::span<const Value> params) override;
  Result<Rows> Query(std::string_view sql, std::span<const Value> params) override;
  void* NativeHandle() override { return conn_->Native(); }
  Status InsertLater(std::string_view insert, std::span<const Value> row) override;
  Status FlushLater() override { return Ready(/*now=*/true); }
  Status BoundLockWaits(int64_t ms) override;
  Result<std::optional<Fingerprint>> InsertMarker(const Marker& m) override;
  Result<std::vector<std::optional<Fingerprint>>> InsertMarkers(std::span<const Marker> markers) override;
  Status PutDeadLetter(const DeadLetter& d) override;
  Result<ClaimOutcome> ClaimInTransaction(const ClaimRequest& request) override;
  Status CompleteInTransaction(const ClaimToken& token, std::string_view result, bool is_error,
                               int64_t retention_ms) override;
  std::vector<Result<ClaimOutcome>> ClaimManyInTransaction(std::span<const ClaimRequest> requests) override;
  std::vector<Status> CompleteManyInTransaction(std::span<const Completion> completions, int64_t retention_ms) override;
  Status Commit() override;
  void Rollback() noexcept override;
  bool Healthy() const override { return conn_->Healthy(); }
  OutboxStore* outbox() override;
  Status AddToOutbox(std::vector<OutboxRow> rows) override;

  Connection& conn() { return *conn_; }

 private:
  Status Usable() const;
  // Usable, and the rows InsertLater queued written (before any statement).
  Status Ready(bool now = false);
  // Writes the rows AddToOutbox queued (at COMMIT, or before a savepoint).
  Status FlushOutbox();
  // The rows InsertLater queued, per statement text.
  struct Later {
    std::string insert;
    size_t width = 0;  // values per row
    std::vector<Value> values;
  };
  std::vector<Later> later_;

  SqlStore& store_;
  Lease conn_;
  bool done_ = false;
  std::vector<OutboxRow> outbox_rows_;
  bool outbox_written_ = false;
};

class SqlStore : public Store, public ClaimStore {
 public:
  SqlStore(const Dialect& dialect, Env* env, int pool_size);
  ~SqlStore() override;

  // Runs the migrations on a first connection (kept in the pool).
  Status Init(bool create_if_missing, const std::string& name);

  Result<std::unique_ptr<StoreTransaction>> Begin() override;
  Result<std::unique_ptr<StoreTransaction>> BeginDeferred() override;
  Result<std::optional<Marker>> FindMarker(std::string_view consumer, std::string_view id,
                                           std::optional<int64_t> produced_at_ms = std::nullopt) override;
  Result<FailureCount> RecordFailure(const FailureRecord& failure) override;
  Status ClearFailures(std::string_view consumer, std::string_view id) override;
  Result<int64_t> Purge(std::string_view consumer, int64_t before_ms, int batch_size) override;
  Result<int64_t> CountMarkers(std::string_view consumer) override;
  Result<std::vector<Marker>> ListMarkers(std::string_view consumer, int limit) override;
  Result<std::vector<DeadLetter>> ListDeadLetters(std::string_view consumer, int limit) override;
  Result<SchemaInfo> Schema() override;
  std::string_view Kind() const override { return dialect_.kind; }
  ClaimStore* claim_store() override { return dialect_.claims != nullptr ? this : nullptr; }
  OutboxStore* outbox_store() override;

  // ClaimStore (sql_claims.cc).
  Result<ClaimOutcome> TryClaim(const ClaimRequest& request) override;
  Status Complete(const ClaimToken& token, std::string_view result, bool is_error, int64_t retention_ms) override;
  Status Release(const ClaimToken& token) override;
  Result<int64_t> Extend(const ClaimToken& token, int64_t lease_ms) override;
  Result<std::optional<ClaimRecord>> FindClaim(std::string_view scope, std::string_view key) override;
  Result<std::vector<ClaimRecord>> ListClaims(std::string_view scope, int limit) override;
  Result<int64_t> PurgeClaims(std::string_view scope, int64_t abandoned_after_ms, int batch_size) override;
  Result<int64_t> CountClaims(std::string_view scope) override;
  Result<std::optional<ClaimOutcome>> Peek(const ClaimRequest& request) override;
  Result<int64_t> NowMs() override;
  // Claim and complete on `in_tx` (inside the caller's transaction, which
  // commits them with its own writes), or on their own when null.
  // `inserted`: the caller already tried the insert in this transaction
  // (it answered no row), so the first round only reads.
  Result<ClaimOutcome> ClaimOn(Connection* in_tx, const ClaimRequest& request, bool inserted = false);
  void NoteClaimFound(bool found);  // see claims_found_
  // Many claims and completions inside `tx`, each answered as ClaimOn and
  // CompleteOn would; the inserts (and the completions) go in one QueryMany
  // where the dialect needs no fence bump before them.
  std::vector<Result<ClaimOutcome>> ClaimManyOn(Connection& tx, std::span<const ClaimRequest> requests);
  std::vector<Status> CompleteManyOn(Connection& tx, std::span<const Completion> completions, int64_t retention_ms);
  Status CompleteOn(Connection* in_tx, const ClaimToken& token, std::string_view result, bool is_error,
                    int64_t retention_ms);
  // The `now` parameter of claim statements: the store's clock, or NULL
  // when the SQL reads the server's own. Default: the Env's.
  virtual Value ClaimNow() { return env_->NowMs(); }

  // Backend hooks.
  virtual Result<std::unique_ptr<Connection>> Connect() = 0;
  // A relay session's connection (its records need no sync). Default: Connect.
  virtual Result<std::unique_ptr<Connection>> ConnectRelay() { return Connect(); }
  // The outbox: a lane's lock, held by one relay session at a time and
  // freed when its process ends (nullptr: another session holds it); a
  // relay's wait for new rows; the wake-up after a commit that added some.
  class LaneLock {
   public:
    virtual ~LaneLock() = default;
    virtual bool Held() { return true; }
    // Where a lock can keep the lane's "handed over up to" hint itself (a
    // write without a transaction), it does: true. Otherwise the table does.
    virtual bool WriteHint(int64_t upto) {
      (void)upto;
      return false;
    }
    virtual std::optional<int64_t> ReadHint() { return std::nullopt; }
  };
  // `holder`: the relay session's name (unique to it).
  virtual Result<std::unique_ptr<LaneLock>> LockLane(Connection& c, int lane, std::string_view holder);
  // Lanes that last only as long as their leases: renewed here (those lost
  // are erased from `locks`). Default: locks that need no renewal.
  virtual Status RenewLanes(Connection& c, std::string_view holder, std::map<int, std::unique_ptr<LaneLock>>& locks) {
    (void)c, (void)holder, (void)locks;
    return Status::OK();
  }
  // After a claim write committed on its own (`what`: "claimed",
  // "completed"): whether the store counts it durable yet (PostgreSQL with
  // ack_after = standby_flush waits for a standby; kInDoubt if none has it).
  virtual Status Durable(std::string_view what) {
    (void)what;
    return Status::OK();
  }
  // One claim statement outside any transaction (a new key's insert or
  // read, a completion), committed on its own: its rows. Default: on a
  // pooled connection. PostgreSQL sends concurrent callers' together, in
  // one commit.
  virtual Result<Rows> QueryAlone(std::string_view sql, std::vector<Value> params);
  // A claim write that draws a fence (insert, take-over) outside any
  // transaction where the dialect bumps a counter for it first
  // (ClaimsSql::bump_fence): the bump and `sql` in one transaction of its
  // own, rolled back when `sql` answers no row; its rows. Default: on a
  // pooled connection. SQLite sends concurrent callers' together, as it does
  // their QueryAlone statements.
  virtual Result<Rows> FencedAlone(std::string_view sql, std::vector<Value> params);
  // The bump (where the dialect has one) and `sql`, on `c` inside its
  // transaction.
  Result<Rows> FencedQuery(Connection& c, std::string_view sql, std::span<const Value> params);
  // The outbox SQL for relay sessions opened now. Default: the dialect's.
  virtual const OutboxSql& outbox_sql() { return *dialect_.outbox; }
  virtual Status WaitForOutbox(Connection& c, std::string_view name, int64_t timeout_ms,
                               const std::function<Result<bool>()>& pending);
  virtual void OutboxCommitted() {}
  // Writes `rows` (seq drawn by the database) in `tx`'s transaction.
  Status WriteOutbox(Connection& tx, std::vector<OutboxRow>& rows);  // moves the rows' fields out
  // Default: with the dialect's multi-row statements, a batch's markers in
  // two statements (insert the new, read the existing); otherwise one
  // insert_marker (and, for a duplicate, one find_marker) per marker. Later
  // markers see earlier ones.
  virtual Result<std::vector<std::optional<Fingerprint>>> InsertMarkers(Connection& c, std::span<const Marker> markers);

  // Whether the message's marker exists, on `c` (inside its transaction).
  // A layout that also keys by producer time checks there too.
  virtual Result<bool> HasMarker(Connection& c, const std::string& consumer, std::string_view id,
                                 std::optional<int64_t> produced_at_ms);

  Result<std::vector<std::optional<Fingerprint>>> InsertMarkersMultiRow(Connection& c, std::span<const Marker> markers);

  const Dialect& dialect() const { return dialect_; }
  Env* env() const { return env_; }
  void Return(std::unique_ptr<Connection> conn);
  // `conn`'s transaction committed (Take(/*for_write=*/true) prefers it).
  void Committed(const Connection* conn);

 protected:
  friend class SqlOutbox;
  // A pooled connection (or a new one). `for_write`: the one that committed
  // last first, whose page cache is still current on SQLite (any other
  // connection's cache is dropped at its next transaction once another
  // one wrote); otherwise any other (or a new one): that one is left to
  // writers.
  Result<Lease> Take(bool for_write = false);
  // Closes the pooled connections (a backend whose connections point into
  // its own members calls it from its destructor).
  void ClosePool();
  // One query outside any transaction, on a pooled connection; run again on
  // a new connection if the pooled one turns out to be dead.
  Result<Rows> Read(std::string_view sql, std::span<const Value> params);

 private:
  // Begin(), or with BEGIN held back for the first statement.
  Result<std::unique_ptr<StoreTransaction>> Start(bool defer);
  // Runs `op` on a pooled connection, and once more on a new one if it
  // failed because that connection was dead.
  Status OnPooled(const std::function<Status(Lease&)>& op, bool for_write = false);
  // A claim write (insert or take-over) that draws a fence, in the
  // transaction the dialect needs; answers the RETURNING row if it changed.
  Result<std::optional<std::pair<int64_t, int64_t>>> FencedWrite(Connection* in_tx, const char* sql,
                                                                 std::span<const Value> params);
  // After a fenced write changed nothing: why the token is no longer good.
  Status LeaseLost(const ClaimToken& token, bool completed_ok);

  Dialect dialect_;
  Env* env_;
  std::unique_ptr<SqlOutbox> outbox_;
  size_t pool_size_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Connection>> pool_;
  // The connection whose transaction committed last, once it is back
  // (kept out of pool_ for the next writer), and which one that was.
  std::unique_ptr<Connection> warm_;
  const Connection* last_committed_ = nullptr;
  // Whether this store's recent claims outside a transaction found their
  // key there (up) or new (down), -16..16: at or below 0 a claim inserts
  // first (ClaimsSql::insert_or_read: one round trip for a new key), above
  // it reads first (a plain read, cheaper for the server, answers a run of
  // replays).
  std::atomic<int> claims_found_{0};
};

}  // namespace idem::sql_internal

#endif  // IDEM_SRC_CORE_SQL_STORE_H_
