// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The contract a store implements (an adapter writer's header): the records
// it keeps (Marker, DeadLetter, failure counts), StoreTransaction (a
// Transaction plus the marker operations, and idem/transactional_claims.h),
// and StoreHooks, the calls on a Store that only the library makes (the
// Inbox, the Consumer, the HTTP middleware, the CLI). The user's calls on a
// Store are in idem/store.h; every store implements both.
//
// Thread safety: a Store is safe to use from many threads (each Begin() gets
// its own connection). A StoreTransaction belongs to one thread at a time.
#ifndef IDEM_STORE_BACKEND_H_
#define IDEM_STORE_BACKEND_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/message.h"
#include "idem/outbox_store.h"
#include "idem/result.h"
#include "idem/status.h"
#include "idem/transaction.h"
#include "idem/transactional_claims.h"

namespace idem {

// A marker as stored: one per (consumer, message id) that has been handled.
struct Marker {
  std::string consumer{};
  std::string id{};
  Fingerprint fingerprint{};
  int64_t processed_at_ms = 0;
  // Set when the consumer keys markers by producer time
  // (Inbox::Options::key_by_producer_time) and the message carries one: the
  // store may then place the marker by this time. A store that has no such
  // layout ignores it.
  std::optional<int64_t> produced_at_ms{};
};

// A message that will not be retried: it failed max_attempts times, or its id
// was reused for a different payload (reason "conflict").
struct DeadLetter {
  std::string consumer{};
  std::string id{};
  std::string reason{};  // "failed" or "conflict"
  std::string error{};   // the last error, or both fingerprints for a conflict
  int attempts = 0;
  std::string payload{};
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
  std::string consumer{};
  const Message* message = nullptr;  // must outlive the RecordFailure call
  std::string error{};
  int max_attempts = 0;  // dead-letter once attempts reach this (0: never)
  int64_t now_ms = 0;
  Kind kind = Kind::kFailed;
  int64_t park_after_ms = 0;  // 0: never park
};

struct FailureCount {
  int attempts = 0;  // failures recorded so far, including this one
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
// operations, and claims inside it (idem/transactional_claims.h). The
// destructor rolls back unless Commit() succeeded.
class StoreTransaction : public Transaction, public TransactionalClaims {
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

  // The outbox of the store this transaction belongs to (null: none), and
  // rows to write into it with this transaction (idem/outbox.h): written
  // at COMMIT (all in one go), or before a SAVEPOINT, a ROLLBACK TO or a
  // statement naming idem_outbox if one comes first, so they commit with the
  // transaction and a savepoint rolled back takes the ones added after it.
  virtual OutboxStore* outbox() { return nullptr; }
  virtual Status AddToOutbox(std::vector<OutboxRow> rows) {
    (void)rows;
    return Status::InvalidArgument("this store has no outbox");
  }

  // Sends the rows Transaction::InsertLater queued, now: the Inbox does
  // after each handler of a batch, so that an insert's error is its own
  // message's. OK when nothing is queued (and by default).
  virtual Status FlushLater() { return Status::OK(); }

  // Bounds, for the rest of this transaction, how long a statement waits
  // for a lock another transaction holds (a row a paused or late process
  // still has locked): past `ms` (> 0) the statement fails with Code::kBusy
  // and the transaction can only roll back. Default: OK, nothing to do (a
  // store whose waits are bounded otherwise: SQLite takes its write lock at
  // Begin, within its busy timeout). PostgreSQL: lock_timeout, local to the
  // transaction, sent with its next statement.
  virtual Status BoundLockWaits(int64_t ms) {
    (void)ms;
    return Status::OK();
  }

  // False once the connection under the transaction is known to be broken:
  // a handler error then is the store's failure, not the handler's.
  virtual bool Healthy() const { return true; }
  // Commits. Code::kInDoubt when the outcome is unknown (the connection died
  // during COMMIT): read the marker with Store::FindMarker to learn it.
  virtual Status Commit() = 0;
  virtual void Rollback() noexcept = 0;

 private:
  StoreTransaction* store_transaction() final { return this; }
};

// The calls on a Store that only the library makes (idem::Store derives
// from this; a store implements them with the user's calls of idem/store.h).
// Users do not call them.
class StoreHooks {
 public:
  virtual ~StoreHooks() = default;

  // Store::Begin (idem/store.h), also here so BeginDeferred can default to it.
  virtual Result<std::unique_ptr<StoreTransaction>> Begin() = 0;
  // The same, except that the store may hold BEGIN back and send it with
  // the transaction's first statement, in one round trip (PostgreSQL, by
  // libpq's pipeline mode). The Inbox begins this way: its first statement
  // is always the marker, so a guarded transaction makes no more round
  // trips than the work alone in a transaction begun by Begin().
  virtual Result<std::unique_ptr<StoreTransaction>> BeginDeferred() { return Begin(); }

  // Outside the business transaction: counts one more failure of `message`;
  // once the count reaches max_attempts, writes its dead letter too. If the
  // message's marker exists (applied by another delivery meanwhile), counts
  // nothing and says so.
  virtual Result<FailureCount> RecordFailure(const FailureRecord& failure) = 0;
  // Forgets the failure count of a message that has now been handled, and
  // its "parked" entry if it had one.
  virtual Status ClearFailures(std::string_view consumer, std::string_view id) = 0;

  // Names the write lock this store's transactions hold, when another store
  // object can share it: on SQLite, "sqlite:<the file's absolute path>" (one
  // writer per file). Empty where writers of different stores never wait
  // for one another (PostgreSQL). Set-ups that would wait on themselves
  // (claims committed in the file whose write lock the inbox holds) are
  // refused by it. Default: empty.
  virtual std::string WriteLockId() const { return {}; }

 protected:
  StoreHooks() = default;
};

}  // namespace idem

#endif  // IDEM_STORE_BACKEND_H_
