// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Inbox: the idempotent consumer in transactional mode. For each message it
// opens a transaction, inserts the marker (consumer, message id, payload
// fingerprint) unless it exists, runs the handler on the same transaction
// only when the marker is new, and commits. The marker and the handler's
// writes commit together or not at all; the unique key on (consumer, id)
// settles races between consumers.
//
//   auto store = idem::sqlite::Store::Open({.path = "payments.db"});
//   auto inbox = idem::Inbox::Open(**store, {.consumer = "payments"});
//   idem::Outcome out = (*inbox)->Handle(msg, [](idem::Transaction& tx, const idem::Message& m) {
//     return tx.Exec("INSERT INTO payments(order_id, cents) VALUES($1, $2)", {...}).status();
//   });
//   if (out.ShouldAck()) source.Ack(delivery);   // only after the commit
//
// Thread safety: Handle and HandleBatch may be called from many threads at
// once; the Store gives each call its own connection.
#ifndef IDEM_INBOX_H_
#define IDEM_INBOX_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "idem/message.h"
#include "idem/observer.h"
#include "idem/result.h"
#include "idem/status.h"
#include "idem/store.h"

namespace idem {

class CallFirst;
class DuplicateFilter;
class Env;
namespace internal {
struct InboxGate;
}  // namespace internal

// The handler: the business work for one message, written against the
// transaction that also holds the marker. Return OK to commit; return an error
// or throw to roll back everything, marker included (the message is then not
// acknowledged, and its redelivery runs the handler again).
using Handler = std::function<Status(Transaction& tx, const Message& message)>;

struct Outcome {
  enum class Kind {
    kApplied,    // marker new, handler ran, committed
    kDuplicate,  // marker existed with the same fingerprint: work skipped
    kConflict,   // marker existed with another fingerprint: work skipped,
                 // reported (dead letter "conflict") and counted
    kFailed,     // nothing committed: handler error, or store error
  };
  Kind kind = Kind::kFailed;
  // kFailed: why. Code::kHandlerFailed for the handler's own error or
  // exception; Code::kInProgress when a CallOnce step of the handler is held
  // by another delivery (the Consumer redelivers it later without counting a
  // failure); a store code (kBusy, kIoError, kUnavailable, ...) otherwise.
  // Code::kRejected when the handler said the message can never be handled
  // (the Consumer dead-letters it at once); Code::kAborted when it gave up
  // because its Consumer is stopping.
  Status status{};
  // kConflict: the fingerprint stored with the marker, and this message's.
  Fingerprint stored_fingerprint{};
  Fingerprint incoming_fingerprint{};
  // With an observer (Options::observer): how long the handler ran and the
  // transaction's commit took, in µs (a batch shares its commit). -1: not
  // measured.
  int64_t handler_us = -1;
  int64_t commit_us = -1;

  // Acknowledge the delivery only when this is true: the effect is committed
  // (now or earlier), or the message can never be applied (conflict).
  bool ShouldAck() const { return kind != Kind::kFailed; }
  bool applied() const { return kind == Kind::kApplied; }
  // "applied", "duplicate", "conflict (stored fingerprint ..., incoming ...)"
  // or "failed (<status>)", for logs.
  std::string ToString() const;
};
// "applied", "duplicate", "conflict" or "failed".
std::string_view KindName(Outcome::Kind kind);

// A point-in-time copy of an Inbox's counters.
struct InboxCounters {
  uint64_t applied = 0;
  uint64_t duplicates = 0;
  uint64_t conflicts = 0;
  uint64_t failures = 0;       // handler failures and store errors (not kAborted: a stopping consumer's)
  uint64_t dead_lettered = 0;  // dead-lettered by a Consumer running this Inbox
  uint64_t in_progress = 0;    // not applied because a step is in progress (not failures)
  uint64_t rejected = 0;       // the handler said Status::Rejected (not in failures)
};

class Inbox {
 public:
  struct Options {
    // The consumer's name: part of the marker key, so several consumers can
    // share one database and each handle every message once. 1..255 bytes
    // (checked at Open). Default: "default".
    std::string consumer = "default";
    // Key each marker by the message's producer time (when it carries one)
    // before its id, so that the markers of a producer whose clock moves
    // forward append at the end of the index instead of landing on random
    // pages: random ids then cost about what time-ordered ids cost (SQLite;
    // measured in doc/performance.md; other stores ignore it).
    // Correct ONLY if every delivery of a message carries the same producer
    // time: broker redeliveries and outbox relays do, but a producer that
    // stamps a retry anew creates a new key, and that retry is applied again.
    // Switching it on is safe (old markers are still checked); switching it
    // off forgets the markers written with it until they expire.
    // Purge judges these markers by producer time. Default: false.
    bool key_by_producer_time = false;
    // Clock for processed_at. Default (nullptr): Env::Default().
    Env* env = nullptr;
    // Optional: sheds duplicates it knows of before the store is touched
    // (idem::redis::Prefilter). Never the only guard: see idem/prefilter.h.
    // Must outlive the Inbox. Default: none.
    DuplicateFilter* prefilter = nullptr;
    // Optional: told every outcome (idem/observer.h, idem/metrics.h), and
    // every delivery event of a Consumer that runs this Inbox. Must outlive
    // the Inbox. Default: none (nothing is timed).
    Observer* observer = nullptr;
  };

  // Checks the options (kInvalidArgument naming the field), then makes the
  // Inbox. `store` must outlive it.
  static Result<std::unique_ptr<Inbox>> Open(Store& store, const Options& options);
  static Result<std::unique_ptr<Inbox>> Open(Store& store);
  // With the default options (valid by construction). `store` must outlive
  // the Inbox.
  explicit Inbox(Store& store);
  ~Inbox();
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;

  // Handles one message in its own transaction. An invalid id gives kFailed
  // with Code::kInvalidArgument and touches nothing.
  Outcome Handle(const Message& message, const Handler& handler);

  // Handles many messages in one transaction (one commit, so far fewer disk
  // syncs). One outcome per message, in order. A duplicate inside the batch
  // is detected like one against the table. A failing handler does not cost
  // the others their effects: the transaction is rolled back and the batch
  // runs again without the failed message (and its copies), so the other
  // handlers may run more than once (their transactional writes commit once;
  // calls outside the transaction must carry DownstreamKey anyway). If the
  // commit itself fails, every message is kFailed.
  std::vector<Outcome> HandleBatch(std::span<const Message> messages, const Handler& handler);

  // The call-first form (idem/call_first.h): for each message whose marker
  // does not exist yet, its calls run first with no transaction open, then
  // its effect is applied in the transaction that inserts the marker. A
  // message whose calls fail gets kFailed with their error (kInProgress
  // stays itself) and opens no transaction. The batch form runs every
  // message's calls, then one transaction for those that succeeded.
  Outcome Handle(const Message& message, const CallFirst& handler);
  std::vector<Outcome> HandleBatch(std::span<const Message> messages, const CallFirst& handler);

  InboxCounters counters() const;
  // Options::observer (null: none).
  Observer* observer() const;

  const std::string& consumer() const;
  Store& store();
  Env* env() const;

 private:
  friend struct internal::InboxGate;
  struct Impl;  // the options, the store, the counters and the steps (inbox.cc)

  Inbox(Store& store, const Options& options);

  std::unique_ptr<Impl> impl_;
};

}  // namespace idem

#endif  // IDEM_INBOX_H_
