// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Outbox: messages a service produces, committed with its work. Inside any
// transaction of an idem store (a handler's, or one from Store::Begin),
// Add records an outgoing message; it commits with the work or not at all,
// and an OutboxRelay (idem/outbox_relay.h) publishes it after the commit.
// Publishing from inside the transaction instead is the dual write the
// outbox exists to prevent: the broker gets the event of a transaction that
// rolled back, or the commit succeeds and the publish is lost.
//
//   auto outbox = idem::Outbox::Open(*store).value();
//   inbox->Handle(msg, [&](idem::Transaction& tx, const idem::Message& m) -> idem::Status {
//     IDEM_RETURN_IF_ERROR(tx.Exec("INSERT INTO payments(order_id) VALUES ($1)", {m.id}).status());
//     return outbox->Add(tx, {.destination = "shipping", .key = order_id, .payload = "paid"})
//         .status();
//   });
//
// The relay publishes at least once: a crash after the broker confirmed a
// message and before the relay recorded it publishes it again, with the same
// id, so the next consumer's Inbox drops the copy. Messages with one ordering
// key are published in the order their transactions committed.
//
// Thread safety: an Outbox may be used from many threads; each call's
// transaction belongs to its thread.
#ifndef IDEM_OUTBOX_H_
#define IDEM_OUTBOX_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/env.h"
#include "idem/message.h"
#include "idem/observer.h"
#include "idem/outbox_store.h"
#include "idem/result.h"
#include "idem/store.h"
#include "idem/transaction.h"

namespace idem {

struct OutgoingMessage {
  // The queue, stream or topic. Empty: the relay's publisher's own channel
  // (the queue, stream or topic of its URL). At most 255 bytes.
  std::string destination{};
  // The message id, 1..kMaxIdBytes bytes. Empty: a new time-ordered id
  // (a UUIDv7, 36 characters), drawn by Add. Give your own when the fact
  // has one (an event id): the consumer's Inbox deduplicates on it.
  std::string id{};
  // The ordering key (the aggregate id: an order, an account), 0..255
  // bytes. Messages with one key are published in commit order; empty:
  // no order with respect to any other message.
  std::string key{};
  std::string payload{};
  // Passed through to the broker as they are (traceparent, content-type...).
  // Names: 1..255 bytes, not starting with "idem-" (idem's own headers).
  std::vector<std::pair<std::string, std::string>> headers{};
  // When the fact was produced, in ms since the epoch. Empty: now, at Add.
  std::optional<int64_t> producer_time_ms{};

  // Continues the trace of `incoming`: copies its traceparent and
  // tracestate headers, and records incoming.id as idem-causation-id.
  OutgoingMessage& CausedBy(const Message& incoming);
};

class Outbox {
 public:
  struct Options {
    // Payloads above this size are refused by Add (kInvalidArgument).
    int64_t max_payload_bytes = int64_t{1} << 20;
    // Clock and randomness for ids and producer times; null: Env::Default().
    Env* env = nullptr;
    // Optional: told each message added (idem/observer.h). Must outlive the
    // Outbox.
    Observer* observer = nullptr;
  };

  // kInvalidArgument when the store has no outbox (Store::outbox_store()).
  static Result<std::unique_ptr<Outbox>> Open(Store& store, const Options& options);
  static Result<std::unique_ptr<Outbox>> Open(Store& store) { return Open(store, Options{}); }

  // Records `message` in `tx`, a transaction of this Outbox's store. The
  // row is written when the transaction commits, with it (all the rows of a
  // transaction in one statement); rolled back, it was never added. A
  // savepoint rolled back takes the Adds made after it. Returns the message's id (drawn when empty).
  // kInvalidArgument, nothing recorded, for a field out of bounds or a
  // transaction that is not an idem store's.
  Result<std::string> Add(Transaction& tx, const OutgoingMessage& message);
  // Several at once; ids in order.
  Result<std::vector<std::string>> AddMany(Transaction& tx, std::span<const OutgoingMessage> messages);

  // What is waiting, sent and dead (idem inspect).
  Result<OutboxStats> Stats();
  // Messages the broker refused for good, newest first (at most `limit`).
  Result<std::vector<OutboxDeadLetter>> ListDeadLetters(int limit);
  // Deletes sent messages kept since before `sent_before_ms`, and dead
  // letters from before `dead_before_ms` (0: none), at most `batch_size`
  // rows per transaction. Returns how many rows were deleted.
  Result<int64_t> Purge(int64_t sent_before_ms, int64_t dead_before_ms, int batch_size);

 private:
  Outbox(OutboxStore& store, const Options& options) : store_(store), options_(options) {}
  Result<OutboxRow> ToRow(const OutgoingMessage& message, int64_t now) const;
  Result<StoreTransaction*> TransactionOf(Transaction& tx) const;
  void NoteAdded(const OutboxRow& row) const;

  OutboxStore& store_;
  Options options_;
};

}  // namespace idem

#endif  // IDEM_OUTBOX_H_
