// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/outbox.h"

#include "core/gate.h"
#include "core/kill_point.h"
#include "idem/trace.h"

namespace idem {

namespace {

constexpr size_t kMaxFieldBytes = 255;

// A UUIDv7 (RFC 9562): 48 bits of ms time, version 7, 74 random bits.
std::string NewId(Env& env) {
  const uint64_t ms = static_cast<uint64_t>(env.NowMs());
  const uint64_t r1 = env.Random(), r2 = env.Random();
  unsigned char b[16];
  for (int i = 0; i < 6; ++i) b[i] = static_cast<unsigned char>(ms >> (8 * (5 - i)));
  b[6] = static_cast<unsigned char>(0x70 | ((r1 >> 8) & 0x0f));
  b[7] = static_cast<unsigned char>(r1);
  b[8] = static_cast<unsigned char>(0x80 | ((r1 >> 16) & 0x3f));
  for (int i = 9; i < 16; ++i) b[i] = static_cast<unsigned char>(r2 >> (8 * (i - 9)));
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(36);
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[b[i] >> 4];
    out += kHex[b[i] & 15];
  }
  return out;
}

bool HasHeader(const std::vector<std::pair<std::string, std::string>>& headers, std::string_view name) {
  for (const auto& h : headers)
    if (h.first == name) return true;
  return false;
}

}  // namespace

OutgoingMessage& OutgoingMessage::CausedBy(const Message& incoming) {
  for (std::string_view name : {std::string_view("traceparent"), std::string_view("tracestate")}) {
    if (auto v = incoming.Header(name)) headers.emplace_back(std::string(name), std::string(*v));
  }
  headers.emplace_back(std::string(kCausationIdHeader), incoming.id);
  return *this;
}

Result<std::unique_ptr<Outbox>> Outbox::Open(Store& store, const Options& options) {
  OutboxStore* os = store.outbox_store();
  if (os == nullptr) return Status::InvalidArgument("the " + std::string(store.Kind()) + " store has no outbox");
  if (options.max_payload_bytes < 0) return Status::InvalidArgument("Outbox::Options::max_payload_bytes is negative");
  Options o = options;
  if (o.env == nullptr) o.env = Env::Default();
  return std::unique_ptr<Outbox>(new Outbox(*os, o));
}

Result<OutboxRow> Outbox::ToRow(const OutgoingMessage& m, int64_t now) const {
  OutboxRow row;
  if (m.id.empty()) {
    row.id = NewId(*options_.env);
  } else {
    IDEM_RETURN_IF_ERROR(ValidateId(m.id));
    row.id = m.id;
  }
  auto bad = [&](std::string what) {
    return Status::InvalidArgument("outbox message " + Printable(row.id) + ": " + what);
  };
  if (m.destination.size() > kMaxFieldBytes)
    return bad("destination is " + std::to_string(m.destination.size()) + " bytes, more than 255");
  if (m.key.size() > kMaxFieldBytes) return bad("key is " + std::to_string(m.key.size()) + " bytes, more than 255");
  if (static_cast<int64_t>(m.payload.size()) > options_.max_payload_bytes)
    return bad("payload is " + std::to_string(m.payload.size()) + " bytes, more than max_payload_bytes (" +
               std::to_string(options_.max_payload_bytes) + ")");
  for (const auto& [name, value] : m.headers) {
    if (name.empty() || name.size() > kMaxFieldBytes)
      return bad("a header name must be 1..255 bytes, not " + std::to_string(name.size()));
    if (name.rfind("idem-", 0) == 0 && name != kCausationIdHeader)
      return bad("header '" + Printable(name) + "': names starting with idem- are idem's own");
  }
  row.destination = m.destination;
  row.key = m.key;
  row.payload = m.payload;
  row.headers = m.headers;
  // Added where a trace runs (a handler's message carried one, or a
  // TraceScope of the caller's): the message continues it, unless it
  // names a trace of its own.
  if (const TraceContext* trace = CurrentTrace(); trace != nullptr && !HasHeader(m.headers, "traceparent")) {
    row.headers.emplace_back("traceparent", trace->traceparent);
    if (!trace->tracestate.empty() && !HasHeader(m.headers, "tracestate"))
      row.headers.emplace_back("tracestate", trace->tracestate);
  }
  row.producer_time_ms = m.producer_time_ms.value_or(now);
  row.added_at_ms = now;
  return row;
}

Result<StoreTransaction*> Outbox::TransactionOf(Transaction& tx) const {
  StoreTransaction* st = internal::TransactionGate::StoreTransactionOf(tx);
  if (st == nullptr || st->outbox() != &store_)
    return Status::InvalidArgument("Outbox::Add: the transaction is not one of this outbox's store");
  return st;
}

void Outbox::NoteAdded(const OutboxRow& row) const {
  if (options_.observer == nullptr) return;
  Event e;
  e.kind = EventKind::kOutboxAdded;
  e.message_id = row.id;
  e.detail = row.destination;
  for (const auto& [name, value] : row.headers)
    if (name == "traceparent") e.traceparent = value;
  e.at_ms = row.added_at_ms;
  options_.observer->OnEvent(e);
}

Result<std::string> Outbox::Add(Transaction& tx, const OutgoingMessage& message) {
  IDEM_ASSIGN_OR_RETURN(StoreTransaction * st, TransactionOf(tx));
  std::vector<OutboxRow> rows(1);
  IDEM_ASSIGN_OR_RETURN(rows[0], ToRow(message, options_.env->NowMs()));
  std::string id = rows[0].id;
  NoteAdded(rows[0]);
  IDEM_RETURN_IF_ERROR(st->AddToOutbox(std::move(rows)));
  IDEM_KILL_POINT("outbox.after_add");
  return id;
}

Result<std::vector<std::string>> Outbox::AddMany(Transaction& tx, std::span<const OutgoingMessage> messages) {
  IDEM_ASSIGN_OR_RETURN(StoreTransaction * st, TransactionOf(tx));
  const int64_t now = options_.env->NowMs();
  std::vector<OutboxRow> rows;
  std::vector<std::string> ids;
  rows.reserve(messages.size());
  ids.reserve(messages.size());
  for (const OutgoingMessage& m : messages) {
    IDEM_ASSIGN_OR_RETURN(OutboxRow row, ToRow(m, now));
    ids.push_back(row.id);
    NoteAdded(row);
    rows.push_back(std::move(row));
  }
  IDEM_RETURN_IF_ERROR(st->AddToOutbox(std::move(rows)));
  IDEM_KILL_POINT("outbox.after_add");
  return ids;
}

Result<OutboxStats> Outbox::Stats() { return store_.Stats(); }
Result<std::vector<OutboxDeadLetter>> Outbox::ListDeadLetters(int limit) { return store_.ListDeadLetters(limit); }
Result<int64_t> Outbox::Purge(int64_t sent_before_ms, int64_t dead_before_ms, int batch_size) {
  return store_.PurgeOutbox(sent_before_ms, dead_before_ms, batch_size);
}

}  // namespace idem
