// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/kafka/offset_inbox.h"

#include <exception>

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
constexpr char kUpsert[] =
    "INSERT INTO idem_kafka_offsets(consumer, topic, topic_partition, last_offset) VALUES ($1, $2, $3, $4) "
    "ON CONFLICT (consumer, topic, topic_partition) DO UPDATE SET last_offset = excluded.last_offset";

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
  IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
  IDEM_RETURN_IF_ERROR(tx->Exec(kCreate).status());
  IDEM_RETURN_IF_ERROR(tx->Commit());
  return std::unique_ptr<OffsetInbox>(new OffsetInbox(store, options));
}

Outcome OffsetInbox::Handle(const Delivery& delivery, const Handler& handler) {
  auto r = DecodeReceipt(delivery.receipt);
  if (!r.ok()) return Failed(r.status());
  auto tx = store_.Begin();
  if (!tx.ok()) return Failed(tx.status());
  auto rows = (*tx)->Query(kSelect, {options_.consumer, r->topic, r->partition});
  if (!rows.ok()) return Failed(rows.status());
  if (!rows->rows.empty() && r->offset <= rows->rows[0][0].AsInt()) {
    (*tx)->Rollback();
    Outcome o;
    o.kind = Outcome::Kind::kDuplicate;
    return o;
  }
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
  auto up = (*tx)->Exec(kUpsert, {options_.consumer, r->topic, r->partition, r->offset});
  if (!up.ok()) return Failed(up.status());
  // kInDoubt included: the redelivery reads the stored offset and knows.
  if (Status c = (*tx)->Commit(); !c.ok()) return Failed(c);
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
