// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/kafka/offset_inbox.h"

#include <exception>

#include "core/kill_point.h"
#include "idem/kafka/source.h"
#include "idem/trace.h"

namespace idem::kafka {

namespace {
// Column names avoid "partition" and "offset", keywords in some SQL dialects.
constexpr char kCreate[] =
    "CREATE TABLE IF NOT EXISTS idem_kafka_offsets("
    "consumer TEXT NOT NULL, topic TEXT NOT NULL, topic_partition INTEGER NOT NULL, "
    "last_offset BIGINT NOT NULL, PRIMARY KEY (consumer, topic, topic_partition))";
constexpr char kSelect[] =
    "SELECT last_offset FROM idem_kafka_offsets WHERE consumer = $1 AND topic = $2 AND topic_partition = $3";
// The claim: moves last_offset up to this record's offset, never down. It
// runs first, before the handler, so that exactly one transaction per
// (consumer, topic, partition, offset) can commit an effect: another one
// waits on the row and then finds it at the offset (0 rows: a duplicate); a
// late member that lost the partition and comes back with an older offset
// finds it above (0 rows) and can no longer move it back.
constexpr char kClaim[] =
    "INSERT INTO idem_kafka_offsets(consumer, topic, topic_partition, last_offset) VALUES ($1, $2, $3, $4) "
    "ON CONFLICT (consumer, topic, topic_partition) DO UPDATE SET last_offset = excluded.last_offset "
    "WHERE idem_kafka_offsets.last_offset < excluded.last_offset";

Outcome Failed(Status s) {
  Outcome o;
  o.kind = Outcome::Kind::kFailed;
  o.status = std::move(s);
  return o;
}
}  // namespace

Result<std::unique_ptr<OffsetInbox>> OffsetInbox::Open(Store& store) { return Open(store, Options{}); }

Result<std::unique_ptr<OffsetInbox>> OffsetInbox::Open(Store& store, const Options& options) {
  if (options.consumer.empty() || options.consumer.size() > 255)
    return Status::InvalidArgument("kafka: OffsetInbox::Options::consumer must be 1..255 bytes, got " +
                                   std::to_string(options.consumer.size()));
  if (options.lock_wait_ms < 1)
    return Status::InvalidArgument("kafka: OffsetInbox::Options::lock_wait_ms must be > 0, got " +
                                   std::to_string(options.lock_wait_ms));
  IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
  IDEM_RETURN_IF_ERROR(tx->Exec(kCreate).status());
  IDEM_RETURN_IF_ERROR(tx->Commit());
  return std::unique_ptr<OffsetInbox>(new OffsetInbox(store, options));
}

Outcome OffsetInbox::Handle(const Delivery& delivery, const Handler& handler) {
  auto r = DecodeReceipt(delivery.receipt);
  if (!r.ok()) return Failed(r.status());
  // BEGIN, the bound and the claim go in one round trip where the store can.
  auto tx = store_.BeginDeferred();
  if (!tx.ok()) return Failed(tx.status());
  if (Status b = (*tx)->BoundLockWaits(options_.lock_wait_ms); !b.ok()) return Failed(b);
  auto claimed = (*tx)->Exec(kClaim, {options_.consumer, r->topic, r->partition, r->offset});
  if (!claimed.ok()) {
    (*tx)->Rollback();
    if (claimed.status().code() != Code::kBusy) return Failed(claimed.status());
    // Another transaction holds the partition's row past the bound: most
    // likely a member that lost the partition and is still in its handler.
    // Give the record back (nack it) rather than wait past
    // max.poll.interval.ms; when it comes again that transaction has ended.
    return Failed(Status::Busy(
        "kafka: offset " + std::to_string(r->offset) + " of " + r->topic + "/" + std::to_string(r->partition) +
        ": the partition's offset row stayed locked by another " + "transaction for " +
        std::to_string(options_.lock_wait_ms) +
        " ms (a member still handling a record of it?); nack the record and retry: " + claimed.status().message()));
  }
  if (*claimed == 0) {
    (*tx)->Rollback();
    Outcome o;
    o.kind = Outcome::Kind::kDuplicate;
    return o;
  }
  IDEM_KILL_POINT("offset_inbox.after_claim");
  // As in the Inbox: an exception is the handler's failure, after a rollback.
  Status hs;
  const TraceScope trace(TraceContext::Of(delivery.message));  // as in the Inbox
  try {
    hs = handler(**tx, delivery.message);
  } catch (const std::exception& e) {
    hs = Status::HandlerFailed(std::string("handler threw: ") + e.what());
  } catch (...) {
    hs = Status::HandlerFailed("handler threw an exception that is not a std::exception");
  }
  if (!hs.ok()) {
    // A broken connection is the store's failure, not the handler's.
    Status why = !(*tx)->Healthy() || hs.code() == Code::kHandlerFailed ? hs : Status::HandlerFailed(hs.ToString());
    (*tx)->Rollback();
    return Failed(std::move(why));
  }
  IDEM_KILL_POINT("offset_inbox.after_work");
  // kInDoubt included: the redelivery reads the stored offset and knows.
  if (Status c = (*tx)->Commit(); !c.ok()) return Failed(c);
  IDEM_KILL_POINT("offset_inbox.after_commit");
  Outcome o;
  o.kind = Outcome::Kind::kApplied;
  return o;
}

Result<std::optional<int64_t>> OffsetInbox::LastApplied(std::string_view topic, int32_t partition) {
  IDEM_ASSIGN_OR_RETURN(auto tx, store_.Begin());
  IDEM_ASSIGN_OR_RETURN(Rows rows, tx->Query(kSelect, {options_.consumer, topic, partition}));
  tx->Rollback();
  if (rows.rows.empty()) return std::optional<int64_t>();
  return std::optional<int64_t>(rows.rows[0][0].AsInt());
}

std::function<std::optional<int64_t>(std::string_view, int32_t)> OffsetInbox::StartOffsets() {
  return [this](std::string_view topic, int32_t partition) -> std::optional<int64_t> {
    auto last = LastApplied(topic, partition);
    if (!last.ok() || !last->has_value()) return std::nullopt;
    return **last + 1;
  };
}

}  // namespace idem::kafka
