// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Store: the database that holds both the markers and the business data, so
// that one local transaction can commit them together. Transaction: one open
// transaction on it, handed to the user's handler.
//
// Users open a concrete store (idem::sqlite::Open) and pass it to an Inbox;
// they call only Transaction::Exec/Query/NativeHandle from their handlers.
// The rest of this header is the contract a store implements.
//
// Thread safety: a Store is safe to use from many threads (each Begin() gets
// its own connection). A Transaction belongs to one thread at a time.
#ifndef IDEM_STORE_H_
#define IDEM_STORE_H_

#include <cstdint>
#include <concepts>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "idem/message.h"
#include "idem/result.h"
#include "idem/status.h"

namespace idem {

class ClaimStore;
struct ClaimOutcome;
struct ClaimRequest;
struct ClaimToken;
struct Completion;

// A SQL parameter or column value.
struct Blob {
  std::string bytes;
};
class Value {
 public:
  Value() = default;  // SQL NULL
  Value(std::nullptr_t) {}  // NOLINT
  template <std::integral T>
  Value(T v) : v_(static_cast<int64_t>(v)) {}  // NOLINT: any integer, bool as 0/1
  Value(double v) : v_(v) {}  // NOLINT
  Value(std::string v) : v_(std::move(v)) {}  // NOLINT
  Value(std::string_view v) : v_(std::string(v)) {}  // NOLINT
  Value(const char* v) : v_(std::string(v)) {}  // NOLINT
  Value(Blob v) : v_(std::move(v)) {}  // NOLINT

  bool is_null() const { return std::holds_alternative<std::monostate>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }
  bool is_double() const { return std::holds_alternative<double>(v_); }
  bool is_text() const { return std::holds_alternative<std::string>(v_); }
  bool is_blob() const { return std::holds_alternative<Blob>(v_); }
  // Conversions: an integer as a double, a number's text, a blob's bytes as
  // text; 0 for NULL and non-numeric text.
  int64_t AsInt() const;
  double AsDouble() const;
  std::string AsText() const;

  const std::variant<std::monostate, int64_t, double, std::string, Blob>& raw() const { return v_; }

 private:
  std::variant<std::monostate, int64_t, double, std::string, Blob> v_;
};

struct Rows {
  std::vector<std::string> columns;
  std::vector<std::vector<Value>> rows;
};

// An open transaction. Parameters are written $1, $2, ... in the SQL text on
// every store, so a handler's SQL runs unchanged on SQLite and PostgreSQL.
class Transaction {
 public:
  virtual ~Transaction() = default;
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

  // Runs a statement; returns the number of rows it changed.
  virtual Result<int64_t> Exec(std::string_view sql, std::span<const Value> params) = 0;
  // Runs a query; returns all of its rows.
  virtual Result<Rows> Query(std::string_view sql, std::span<const Value> params) = 0;
  // The store's own handle (sqlite3* on SQLite), for what Exec/Query cannot
  // do. Do not commit, roll back or close through it.
  virtual void* NativeHandle() = 0;

  Result<int64_t> Exec(std::string_view sql, std::initializer_list<Value> params = {}) {
    return Exec(sql, std::span<const Value>(params.begin(), params.size()));
  }
  Result<Rows> Query(std::string_view sql, std::initializer_list<Value> params = {}) {
    return Query(sql, std::span<const Value>(params.begin(), params.size()));
  }

 protected:
  Transaction() = default;
};

// ---------------------------------------------------------------------------
// The contract a store implements (used by Inbox, Consumer and the CLI).
// ---------------------------------------------------------------------------

// A marker as stored: one per (consumer, message id) that has been handled.
struct Marker {
  std::string consumer;
  std::string id;
  Fingerprint fingerprint{};
  int64_t processed_at_ms = 0;
  // Set when the consumer keys markers by producer time
  // (InboxOptions::key_by_producer_time) and the message carries one: the
  // store may then place the marker by this time. A store that has no such
  // layout ignores it.
  std::optional<int64_t> produced_at_ms;
};

// A message that will not be retried: it failed max_attempts times, or its id
// was reused for a different payload (reason "conflict").
struct DeadLetter {
  std::string consumer;
  std::string id;
  std::string reason;  // "failed" or "conflict"
  std::string error;   // the last error, or both fingerprints for a conflict
  int attempts = 0;
  std::string payload;
  int64_t at_ms = 0;
};

// What to record for a message whose handling did not reach an outcome.
struct FailureRecord {
  enum class Kind {
    // The handler failed: counted; dead-lettered (reason "failed") once the
    // count reaches max_attempts, unless the message is in progress.
    kFailed,
    // A step may have taken effect and is not finished: not counted; the
    // message is "in progress" from now on (never dead-lettered as a
    // failure) and parked once it has been for park_after_ms.
    kInProgress,
    // The handler said the message can never be handled: dead-lettered now
    // (reason "rejected").
    kRejected,
    // Delivered past the consumer's max_deliveries with no outcome:
    // dead-lettered now, unless the message is in progress.
    kCrashLoop,
  };
  std::string consumer;
  const Message* message = nullptr;  // must outlive the RecordFailure call
  std::string error;
  int max_attempts = 0;   // dead-letter once attempts reach this (0: never)
  int64_t now_ms = 0;
  Kind kind = Kind::kFailed;
  int64_t park_after_ms = 0;  // 0: never park
};

struct FailureCount {
  int attempts = 0;        // failures recorded so far, including this one
  bool dead_lettered = false;
  // The marker exists: another delivery has applied the message since. No
  // failure was counted (and an old count was cleared); the delivery can be
  // acknowledged.
  bool already_applied = false;
  // The message is in progress (a step may have taken effect): it was not
  // dead-lettered, whatever the count.
  bool in_progress = false;
  // This call parked the message (listed with the dead letters, reason
  // "parked"; it stays in the source). Once per message.
  bool parked = false;
};

// A transaction as the Inbox drives it: the user's view plus the marker
// operations. The destructor rolls back unless Commit() succeeded.
class StoreTransaction : public Transaction {
 public:
  // Inserts the marker unless (consumer, id) exists. Returns std::nullopt
  // when this call inserted it, or the stored fingerprint when it already
  // existed (a duplicate if equal to `marker.fingerprint`, else a conflict).
  virtual Result<std::optional<Fingerprint>> InsertMarker(const Marker& marker) = 0;
  // The same for many markers in one go; element i answers markers[i].
  // Markers later in the span see those earlier in it.
  virtual Result<std::vector<std::optional<Fingerprint>>> InsertMarkers(std::span<const Marker> markers);
  // Records a dead letter (upsert on (consumer, id)).
  virtual Status PutDeadLetter(const DeadLetter& letter) = 0;

  // Claims (idem/claims.h) inside this transaction: the record's change
  // commits, or rolls back, with the transaction's other writes (used by
  // idem::http's transactional routes). A concurrent claim of the same key
  // waits for this transaction. Default: Code::kInternal (not supported).
  virtual Result<ClaimOutcome> ClaimInTransaction(const ClaimRequest& request);
  virtual Status CompleteInTransaction(const ClaimToken& token, std::string_view result, bool is_error,
                                       int64_t retention_ms);
  // Many at once, each answered as the one-key call would; later requests
  // see earlier ones (the same key twice: the second finds the first in
  // progress). PostgreSQL sends the inserts, and the completions, in one
  // round trip each. Default: the one-key calls in turn.
  virtual std::vector<Result<ClaimOutcome>> ClaimManyInTransaction(std::span<const ClaimRequest> requests);
  virtual std::vector<Status> CompleteManyInTransaction(std::span<const Completion> completions, int64_t retention_ms);

  // False once the connection under the transaction is known to be broken:
  // a handler error then is the store's failure, not the handler's.
  virtual bool Healthy() const { return true; }
  // Commits. Code::kInDoubt when the outcome is unknown (the connection died
  // during COMMIT): read the marker with Store::FindMarker to learn it.
  virtual Status Commit() = 0;
  virtual void Rollback() noexcept = 0;
};

class Store {
 public:
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Begins a write transaction (on SQLite: BEGIN IMMEDIATE, so two processes
  // on one file are serialised rather than failing at commit). The
  // transaction holds one of the store's connections: end it (or destroy
  // it) before the Store is destroyed. Inside it, BEGIN, COMMIT and ROLLBACK
  // through Exec/Query are refused (use Commit/Rollback; savepoints are fine).
  virtual Result<std::unique_ptr<StoreTransaction>> Begin() = 0;
  // The same, except that the store may hold BEGIN back and send it with
  // the transaction's first statement, in one round trip (PostgreSQL, by
  // libpq's pipeline mode). The Inbox begins this way: its first statement
  // is always the marker, so a guarded transaction makes no more round
  // trips than the work alone in a transaction begun by Begin().
  virtual Result<std::unique_ptr<StoreTransaction>> BeginDeferred() { return Begin(); }

  // Reads a marker outside any transaction (on a fresh connection). Give the
  // producer time when the marker may have been keyed by it.
  virtual Result<std::optional<Marker>> FindMarker(std::string_view consumer, std::string_view id,
                                                   std::optional<int64_t> produced_at_ms = std::nullopt) = 0;

  // Outside the business transaction: counts one more failure of `message`;
  // once the count reaches max_attempts, writes its dead letter too. If the
  // message's marker exists (applied by another delivery meanwhile), counts
  // nothing and says so.
  virtual Result<FailureCount> RecordFailure(const FailureRecord& failure) = 0;
  // Forgets the failure count of a message that has now been handled, and
  // its "parked" entry if it had one.
  virtual Status ClearFailures(std::string_view consumer, std::string_view id) = 0;

  // Deletes markers processed before `before_ms`, at most `batch_size` per
  // transaction, until none is left. Returns how many were deleted. An empty
  // consumer means all consumers.
  virtual Result<int64_t> Purge(std::string_view consumer, int64_t before_ms, int batch_size) = 0;

  // Inspection. An empty consumer means every consumer; lists hold at most
  // `limit` (>= 0; negative is kInvalidArgument), newest first.
  virtual Result<int64_t> CountMarkers(std::string_view consumer) = 0;
  virtual Result<std::vector<Marker>> ListMarkers(std::string_view consumer, int limit) = 0;
  virtual Result<std::vector<DeadLetter>> ListDeadLetters(std::string_view consumer, int limit) = 0;
  // The schema version and the DDL of idem's own tables, for `idem schema`.
  struct SchemaInfo {
    int version = 0;
    std::vector<std::string> statements;
  };
  virtual Result<SchemaInfo> Schema() = 0;

  // "sqlite", "postgres".
  virtual std::string_view Kind() const = 0;

  // The same database as a ClaimStore (two-phase mode, idem/claims.h), or
  // nullptr where the store has none. The SQLite and PostgreSQL stores have
  // one; it lives as long as the Store.
  virtual ClaimStore* claim_store() { return nullptr; }

  // Names the write lock this store's transactions hold, when another store
  // object can share it: on SQLite, "sqlite:<the file's absolute path>" (one
  // writer per file). Empty where writers of different stores never wait
  // for one another (PostgreSQL). Set-ups that would wait on themselves
  // (claims committed in the file whose write lock the inbox holds) are
  // refused by it. Default: empty.
  virtual std::string WriteLockId() const { return {}; }

 protected:
  Store() = default;
};

}  // namespace idem

#endif  // IDEM_STORE_H_
